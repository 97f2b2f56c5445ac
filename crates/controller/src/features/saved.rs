//! The features' saved form (docs/state-format.md, `features`): every
//! value Set Features leaves, the Streams directive's state and the Keep
//! Alive Timer's KATO. The timer itself restarts at the restore (a fresh
//! KATO from then, as a Keep Alive command would give).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};
use vnvme_spec::feature::HostBehaviorSupport;
use zerocopy::IntoBytes;

use super::{AdminState, Features};
use crate::config::ControllerConfig;
use crate::keep_alive::round_kato;
use crate::saved_check::{array, at_most, hex, inconsistent, record, InvalidState};
use crate::streams::saved::SavedStreams;
use crate::streams::Streams;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedFeatures {
    /// Number of Queues granted (0's based).
    pub nsqa_z: u16,
    pub ncqa_z: u16,
    /// An I/O queue was created since the last reset.
    pub io_queues_created: bool,
    /// Arbitration (01h).
    pub arbitration: u32,
    /// Asynchronous Event Configuration (0Bh).
    pub async_event_config: u32,
    /// Power Management (02h).
    pub power_state: u32,
    /// Temperature Threshold (04h).
    pub temperature_threshold: u32,
    /// Error Recovery (05h) by NSID.
    pub error_recovery: BTreeMap<u32, u32>,
    /// Write Atomicity Normal (0Ah).
    pub write_atomicity: u32,
    /// Host Behavior Support (16h), its 512 bytes.
    #[serde(with = "hex")]
    pub host_behavior: Vec<u8>,
    /// Host Identifier (81h), 16 bytes (the first 8 unless extended).
    #[serde(with = "hex")]
    pub host_id: Vec<u8>,
    pub host_id_extended: bool,
    /// Volatile Write Cache enabled (06h).
    pub wce: bool,
    /// Software Progress Marker (80h).
    pub software_progress: u8,
    /// Keep Alive Timer (0Fh), in milliseconds (0: disabled).
    pub kato_ms: u32,
    /// The Streams directive, by NSID.
    pub streams: BTreeMap<u32, SavedStreams>,
}

impl Features {
    pub fn save(&self) -> SavedFeatures {
        let a = self.admin.lock().clone();
        SavedFeatures {
            nsqa_z: a.nsqa_z,
            ncqa_z: a.ncqa_z,
            io_queues_created: a.io_queues_created,
            arbitration: a.arbitration,
            async_event_config: a.async_event_config,
            power_state: a.power_state,
            temperature_threshold: a.temperature_threshold,
            error_recovery: a.error_recovery,
            write_atomicity: a.write_atomicity,
            host_behavior: a.host_behavior.as_bytes().to_vec(),
            host_id: a.host_id.to_vec(),
            host_id_extended: a.host_id_extended,
            wce: self.wce.load(Ordering::Relaxed),
            software_progress: self.software_progress.load(Ordering::Relaxed),
            kato_ms: self.keep_alive.kato(),
            streams: self.streams.lock().save(),
        }
    }

    /// Applies `saved`: the granted queues within `config`'s, KATO on its
    /// granularity. The Keep Alive Timer stays inactive until the
    /// controller's restore says it runs.
    pub fn restore(
        &self,
        config: &ControllerConfig,
        saved: &SavedFeatures,
    ) -> Result<(), InvalidState> {
        let max = u64::from(config.max_io_queues.saturating_sub(1));
        at_most(
            "the I/O submission queues granted",
            u64::from(saved.nsqa_z),
            max,
        )?;
        at_most(
            "the I/O completion queues granted",
            u64::from(saved.ncqa_z),
            max,
        )?;
        if round_kato(saved.kato_ms) != Some(saved.kato_ms) {
            return Err(inconsistent(format!(
                "KATO {} ms is not a multiple of the Keep Alive granularity",
                saved.kato_ms
            )));
        }
        let host_behavior: HostBehaviorSupport =
            record("Host Behavior Support", &saved.host_behavior)?;
        let admin = AdminState {
            nsqa_z: saved.nsqa_z,
            ncqa_z: saved.ncqa_z,
            io_queues_created: saved.io_queues_created,
            arbitration: saved.arbitration,
            async_event_config: saved.async_event_config,
            power_state: saved.power_state,
            temperature_threshold: saved.temperature_threshold,
            error_recovery: saved.error_recovery.clone(),
            write_atomicity: saved.write_atomicity,
            host_behavior,
            host_id: array("the Host Identifier", &saved.host_id)?,
            host_id_extended: saved.host_id_extended,
        };
        let streams = Streams::restored(&saved.streams)?;
        *self.admin.lock() = admin;
        *self.streams.lock() = streams;
        self.wce.store(saved.wce, Ordering::Relaxed);
        self.software_progress
            .store(saved.software_progress, Ordering::Relaxed);
        self.keep_alive.set_kato(saved.kato_ms);
        Ok(())
    }
}
