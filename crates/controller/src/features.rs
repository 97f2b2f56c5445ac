//! The controller's features as Set Features leaves them (§5.27.1): the
//! admin-only values, Volatile Write Cache, the Software Progress Marker,
//! the Streams directive's state and the Keep Alive Timer.
//!
//! What is what, for a save and restore of the controller: every value
//! here is guest-visible state (back to defaults at a controller reset,
//! but for the Software Progress Marker, which persists); the Keep Alive
//! Timer's thread and its last kick are transient (a restore restarts it).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU8};
use std::sync::Arc;

use parking_lot::Mutex;
use vnvme_spec::feature::HostBehaviorSupport;

use crate::config::ControllerConfig;
use crate::keep_alive::KeepAlive;
use crate::streams::Streams;

mod saved;
pub(crate) use saved::SavedFeatures;

/// The features, each behind its own leaf lock or atomic.
#[derive(Debug)]
pub(crate) struct Features {
    pub admin: Mutex<AdminState>,
    /// Streams directive: enabled, allocated and open, per namespace.
    pub streams: Mutex<Streams>,
    /// Volatile Write Cache enabled (feature 06h).
    pub wce: AtomicBool,
    /// Software Progress Marker (80h): persists across resets (§5.27.1
    /// Figure 317), so it lives outside [`AdminState`].
    pub software_progress: AtomicU8,
    /// The Keep Alive Timer (feature 0Fh, Keep Alive command).
    pub keep_alive: Arc<KeepAlive>,
}

impl Features {
    pub fn new(config: &ControllerConfig) -> Self {
        Self {
            admin: Mutex::new(AdminState::new(config)),
            streams: Mutex::default(),
            wce: AtomicBool::new(true),
            software_progress: AtomicU8::new(0),
            keep_alive: Arc::default(),
        }
    }
}

/// Admin-only state, changed by admin commands (a leaf lock).
#[derive(Debug, Clone)]
pub(crate) struct AdminState {
    /// Granted I/O queues (Number of Queues), 0's based.
    pub nsqa_z: u16,
    pub ncqa_z: u16,
    /// An I/O queue was created since the last reset: Number of Queues can
    /// no longer change.
    pub io_queues_created: bool,
    pub arbitration: u32,
    pub async_event_config: u32,
    pub power_state: u32,
    pub temperature_threshold: u32,
    /// Error Recovery (05h) by NSID: a namespace scope feature.
    pub error_recovery: BTreeMap<u32, u32>,
    pub write_atomicity: u32,
    /// Host Behavior Support (16h), reserved bytes cleared.
    pub host_behavior: HostBehaviorSupport,
    /// Host Identifier (81h): 8 bytes, or 16 with EXHID; zeroes until set.
    pub host_id: [u8; 16],
    /// The Host Identifier was set as 128 bits (EXHID).
    pub host_id_extended: bool,
}

impl AdminState {
    pub fn new(config: &ControllerConfig) -> Self {
        let q = config.max_io_queues.saturating_sub(1);
        Self {
            nsqa_z: q,
            ncqa_z: q,
            io_queues_created: false,
            arbitration: 0,
            async_event_config: 0,
            power_state: 0,
            temperature_threshold: 0x0157,
            error_recovery: BTreeMap::new(),
            write_atomicity: 0,
            host_behavior: zerocopy::FromZeros::new_zeroed(),
            host_id: [0; 16],
            host_id_extended: false,
        }
    }
}
