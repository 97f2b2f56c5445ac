#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: vnvme_fuzz::saved_state::Input| {
    vnvme_fuzz::saved_state::run(input);
});
