//! The vnvme glue: the NVMe PCI device served over vfio-user, the `serve`
//! command, driver-side tools and the benchmarks.
#![forbid(unsafe_code)]

pub mod bench;
pub mod config;
pub mod device;
pub mod inproc;
pub mod interrupts;
pub mod memory;
pub mod namespace;
pub mod passthru;
pub mod serve;
pub mod size;
pub mod tools;
