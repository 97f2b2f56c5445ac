//! The vnvme binary's library: the command line and configuration file
//! (turned into `vnvme-device`'s plain configuration), the `serve` command,
//! driver-side tools and the benchmarks.
#![forbid(unsafe_code)]

pub mod bench;
pub mod config;
pub mod control;
pub mod device;
pub mod duration;
pub mod identity;
pub mod image_format;
pub mod inproc;
pub mod metrics;
pub mod namespace;
pub mod notify;
pub mod ns_syntax;
pub mod passthru;
pub mod qos;
pub mod serve;
pub mod size;
pub mod socket;
pub mod stopping;
pub mod tools;
pub mod upgrade;
pub mod zoned_options;
