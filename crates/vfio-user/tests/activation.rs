//! Socket activation's environment: whatever `take_listener` finds, the
//! LISTEN_* variables are gone afterwards, so a child the server starts
//! never takes them (and fd 3) for its own. One test in its own process:
//! it changes the environment.

use std::process::Command;

use vnvme_vfio_user::activation::take_listener;

#[test]
fn listen_variables_for_another_process_are_ignored_and_cleared() {
    std::env::set_var("LISTEN_PID", "1");
    std::env::set_var("LISTEN_FDS", "1");
    std::env::set_var("LISTEN_FDNAMES", "vnvme");
    assert!(take_listener().unwrap().is_none(), "pid 1's socket taken");
    for v in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        assert!(std::env::var_os(v).is_none(), "{v} left in the environment");
    }
    let child = Command::new("sh")
        .args([
            "-c",
            "echo ${LISTEN_PID-unset} ${LISTEN_FDS-unset} ${LISTEN_FDNAMES-unset}",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&child.stdout),
        "unset unset unset\n"
    );

    // Malformed: an error, and cleared as well.
    std::env::set_var("LISTEN_PID", std::process::id().to_string());
    std::env::set_var("LISTEN_FDS", "two");
    let e = take_listener().unwrap_err();
    assert_eq!(
        e.to_string(),
        "LISTEN_FDS=\"two\" is not a number of file descriptors"
    );
    assert!(std::env::var_os("LISTEN_FDS").is_none());
}
