#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: vnvme_fuzz::driver::Input| {
    vnvme_fuzz::driver::run(input);
});
