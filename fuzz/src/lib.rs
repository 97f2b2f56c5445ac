//! Harnesses behind the `cargo fuzz` targets in `fuzz_targets/`: each takes
//! structured input (`arbitrary`) and must neither panic nor hang.
//!
//! * [`controller`] — the NVMe controller over fake guest memory (with
//!   `vnvme_blockdev::held::HeldRam`, a backend whose requests are in flight);
//! * [`server`] — the vfio-user server with the NVMe device, over a socketpair;
//! * [`driver`] — the user-space driver against a hostile device;
//! * [`saved_state`] — the saved-state decoder and restore fed hostile states.

pub mod controller;
pub mod driver;
pub mod saved_state;
pub mod server;
