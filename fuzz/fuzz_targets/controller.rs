#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: vnvme_fuzz::controller::Input| {
    vnvme_fuzz::controller::run(input);
});
