//! The driver against the real controller: `vnvme_driver` brought up on the
//! controller served in-process over a vfio-user socketpair, the path
//! `vnvme bench` takes. Situations are produced by configuring the
//! controller (doorbell mode, queues, vectors, namespaces that are slow,
//! detached or in a format the driver does not take) or by commands the
//! test builds itself (passthrough, vendor commands). What only a broken
//! device can do is tested in the driver crate's `fake` and fuzzed in
//! `fuzz/fuzz_targets/driver.rs`.
//!
//! Counts are exact where the controller makes them deterministic: doorbell
//! writes the server counts equal the ones the driver made; in trap mode
//! each synchronous command costs one SQ and one CQ trap; in mmap-poll mode
//! none. In shadow mode the controller may pick up a shadow update before
//! the host's EventIdx check, so whether a given update traps is a race:
//! the need-event arithmetic itself is tested in `vnvme_driver::doorbell`.

#[path = "../common/crc32c.rs"]
mod crc32c;
mod doorbells;
mod init;
mod io;
mod namespaces;
mod passthru;
#[path = "../common/pattern.rs"]
mod pattern;
mod protection;
mod rig;
mod zones;
