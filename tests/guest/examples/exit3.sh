# shellcheck shell=sh
# exit3.sh - guest script: checks that the guest's exit status comes back (run-test.sh must exit 3)
echo "about to exit 3"
exit 3
