//! A namespace in the saved state (docs/state-format.md, `namespaces`):
//! its identity, format, attachment, what the host did to it
//! (reservations, uncorrectable blocks, a format in progress) and what
//! its backend must be to reattach it. The backend's data is not in the
//! state: the restore is given the backend (a `ram` backend's memory or a
//! file), checked against the saved size.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use vnvme_blockdev::BlockDevice;
use vnvme_spec::Status;

use super::reservation::saved::SavedReservations;
use super::Namespace;
use crate::config::NamespaceIds;
use crate::lifecycle::saved::ms;
use crate::protection::{PiType, Protection};
use crate::saved_check::{array, hex, inconsistent, same, InvalidState};
use crate::zoned::SavedZones;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedNamespace {
    pub nsid: u32,
    #[serde(with = "hex")]
    pub nguid: Vec<u8>,
    #[serde(with = "hex")]
    pub eui64: Vec<u8>,
    #[serde(with = "hex")]
    pub uuid: Vec<u8>,
    /// Index into the LBA formats (docs/namespaces.md).
    pub format_index: u8,
    /// Metadata transferred with the data (FLBAS bit 4).
    pub extended: bool,
    /// Protection information type (1 to 3), if formatted with it.
    pub pi_type: Option<u8>,
    /// PI in the first bytes of the metadata (PIL).
    pub pi_first: bool,
    /// NSZE in logical blocks (checked against the backend and format).
    pub nsze: u64,
    /// The backend's size in bytes.
    pub backend_size: u64,
    /// The backend keeps no data (`null`).
    pub backend_null: bool,
    /// Attached to this controller (active).
    pub attached: bool,
    /// Every controller of the subsystem it is attached to, by CNTLID
    /// (format 2; absent in format 1: this controller only, if
    /// `attached`).
    #[serde(default)]
    pub attached_to: Option<Vec<u16>>,
    /// A Format NVM completes this many milliseconds after the save.
    pub formatting_ms: Option<u64>,
    /// The status I/O gets while the subsystem is sanitized.
    pub sanitize: Option<u16>,
    pub reservations: SavedReservations,
    /// Blocks marked by Write Uncorrectable: `[start, end)` LBAs.
    pub uncorrectable: Vec<(u64, u64)>,
    /// A zoned namespace's zones.
    pub zones: Option<SavedZones>,
}

impl Namespace {
    /// As controller `cntlid` sees it (attached or not).
    pub fn save(&self, now: Instant, cntlid: u16) -> SavedNamespace {
        SavedNamespace {
            nsid: self.nsid,
            nguid: self.ids.nguid.to_vec(),
            eui64: self.ids.eui64.to_vec(),
            uuid: self.ids.uuid.to_vec(),
            format_index: self.format_index,
            extended: self.extended,
            pi_type: self.pi.map(|p| p.pi_type.pit()),
            pi_first: self.pi.is_some_and(|p| p.first),
            nsze: self.nsze,
            backend_size: self.backend.size(),
            backend_null: self.backend.moves_no_data(),
            attached: self.attached.contains(cntlid),
            attached_to: Some(self.attached.iter().collect()),
            formatting_ms: (self.formatting_until)
                .and_then(|t| t.checked_duration_since(now))
                .map(ms),
            sanitize: self.sanitize.map(Status::raw),
            reservations: self.reservations.save(),
            uncorrectable: self.uncorrectable.save(),
            zones: self.zones.as_ref().map(|z| z.save()),
        }
    }

    /// The saved namespace on `backend`, its configured parts (readiness,
    /// the reservations' sidecar file) taken from `configured` when the
    /// configuration has it.
    pub fn restored(
        saved: &SavedNamespace,
        cntlid: u16,
        backend: std::sync::Arc<dyn BlockDevice>,
        configured: Option<&Namespace>,
        now: Instant,
    ) -> Result<Self, InvalidState> {
        let nsid = saved.nsid;
        same(
            format!("namespace {nsid}'s backend size"),
            saved.backend_size,
            backend.size(),
        )?;
        let protection = match saved.pi_type {
            None => None,
            Some(pit) => Some(Protection {
                pi_type: PiType::from_pit(pit).ok_or_else(|| {
                    inconsistent(format!(
                        "namespace {nsid}'s protection type {pit} is not 1 to 3"
                    ))
                })?,
                first: saved.pi_first,
            }),
        };
        let ids = NamespaceIds {
            nguid: array("an NGUID", &saved.nguid)?,
            eui64: array("an EUI-64", &saved.eui64)?,
            uuid: array("a UUID", &saved.uuid)?,
        };
        let ns = Self::with_format(
            nsid,
            ids,
            backend,
            saved.format_index,
            saved.extended,
            protection,
        )
        .ok_or_else(|| {
            inconsistent(format!(
                "namespace {nsid}'s format {} (protection {:?}) does not fit its backend",
                saved.format_index, saved.pi_type
            ))
        })?;
        let mut ns = match &saved.zones {
            Some(z) => {
                let zones = crate::zoned::Zones::restored(z, ns.nsze, ns.lba_shift)?;
                Self {
                    nsze: zones.nsze(),
                    zones: Some(std::sync::Arc::new(zones)),
                    ..ns
                }
            }
            None => ns,
        };
        same(
            format!("namespace {nsid}'s size (NSZE)"),
            saved.nsze,
            ns.nsze,
        )?;
        if let Some(c) = configured {
            ns.readiness = c.readiness;
            ns.reservations = c.reservations.clone();
        }
        ns.reservations.restore(&saved.reservations)?;
        ns.uncorrectable.restore(&saved.uncorrectable, ns.nsze)?;
        ns.attached = match &saved.attached_to {
            None => super::attached::Attached::only_if(saved.attached, cntlid),
            Some(all) => {
                let attached = super::attached::Attached::of(all);
                same(
                    format!("namespace {nsid}'s attachment to the saved controller {cntlid}"),
                    saved.attached,
                    attached.contains(cntlid),
                )?;
                if let Some(bad) = all.iter().find(|&&c| c == 0 || c >= 0xFFF0) {
                    return Err(inconsistent(format!(
                        "namespace {nsid} is attached to controller {bad}, not a CNTLID"
                    )));
                }
                attached
            }
        };
        ns.formatting_until = saved
            .formatting_ms
            .and_then(|ms| now.checked_add(Duration::from_millis(ms)));
        ns.sanitize = saved.sanitize.map(Status::from_raw);
        Ok(ns)
    }
}
