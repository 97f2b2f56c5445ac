#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: vnvme_fuzz::server::Input| {
    vnvme_fuzz::server::run(input);
});
