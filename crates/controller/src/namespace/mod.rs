//! Namespaces: an NSID, an LBA format, a backend, and the state a host can
//! see change — attachment, readiness, a format in progress (NVM Command Set
//! §4.1.5, NVMe Base 2.0 §8.3 namespace management).
//!
//! A [`Namespace`] is immutable: attach, detach and Format NVM replace the
//! `Arc` in the controller's map, so a command that already holds one runs
//! to completion against a consistent view.
//!
//! Storage layout: logical block `i` occupies `stride` bytes at `i * stride`
//! of the backend, its data followed by its metadata (the extended-LBA
//! layout). Extended-LBA transfers copy that layout as is; separate
//! metadata (MPTR) is split from and merged into it.

pub(crate) mod attached;
pub(crate) mod reservation;
mod saved;
pub(crate) mod uncorrectable;

use std::sync::Arc;
use std::time::{Duration, Instant};

use vnvme_blockdev::BlockDevice;
use vnvme_spec::identify::nvm::{pif, ExtendedLbaFormat, IdentifyNamespaceNvm};
use vnvme_spec::identify::{csi, dpc, dps, IdentifyNamespace, LbaFormat};
use vnvme_spec::reservation::rescap;
use vnvme_spec::{NvmOpcode, Status};
use zerocopy::little_endian::{U16, U32, U64};

use crate::config::{
    ConfigError, LbaFormatSpec, NamespaceConfig, NamespaceIds, Readiness, LBA_FORMATS,
};
use crate::namespace::attached::Attached;
use crate::namespace::reservation::Reservations;
use crate::namespace::uncorrectable::Uncorrectable;
use crate::protection::{Guard, PiFormat, Protection};
use crate::stats::NamespaceCounters;
use crate::zoned::{ZonedConfig, ZonedError, Zones};
pub(crate) use saved::SavedNamespace;

/// NSIDs 1..=0xFFFF_FFFE are valid; 0xFFFF_FFFF is the broadcast value.
pub(crate) const NSID_ALL: u32 = 0xFFFF_FFFF;

/// The one endurance group (Identify Controller ENDGIDMAX): every
/// namespace belongs to it, so its usage is the controller's.
pub(crate) const ENDURANCE_GROUP_ID: u16 = 1;

/// MC (Metadata Capabilities): bit 0 extended LBAs, bit 1 separate buffer.
const MC_EXTENDED_AND_SEPARATE: u8 = 0x03;

/// Copy limits of every namespace (Identify Namespace MSSRL, MCL, MSRC):
/// a Copy reads all its sources before it writes, so MCL bounds its
/// buffer (about 4 MiB with 4 KiB + 64 byte blocks); 128 source range
/// entries of 32 bytes fill one 4 KiB page.
pub(crate) const MSSRL: u16 = 256;
pub(crate) const MCL: u32 = 1024;
pub(crate) const MSRC_Z: u8 = 127;

#[derive(Debug, Clone)]
pub(crate) struct Namespace {
    pub nsid: u32,
    /// NGUID, EUI-64 and UUID: kept through Format NVM, attach and detach.
    pub ids: NamespaceIds,
    /// Index into [`LBA_FORMATS`].
    pub format_index: u8,
    /// log2 of the data size (9 or 12).
    pub lba_shift: u8,
    /// Metadata bytes per block (0, 8 or 64).
    pub ms: u16,
    /// Metadata is transferred with the data (FLBAS bit 4).
    pub extended: bool,
    /// End-to-end protection (DPS), if the namespace is formatted with it.
    pub pi: Option<PiFormat>,
    /// Namespace size in logical blocks.
    pub nsze: u64,
    pub backend: Arc<dyn BlockDevice>,
    pub readiness: Readiness,
    /// The controllers it is attached to: for them it is active.
    pub attached: Attached,
    /// A Format NVM is in progress until then: I/O gets Format In Progress.
    pub formatting_until: Option<Instant>,
    /// What I/O gets while the NVM subsystem is being sanitized (Sanitize
    /// In Progress) or in sanitize failure mode (Sanitize Failed).
    pub sanitize: Option<Status>,
    /// Blocks marked by Write Uncorrectable: shared by the namespace's
    /// copies across attach and detach; a new format starts clean.
    pub uncorrectable: Arc<Uncorrectable>,
    /// A zoned namespace's zones (`None`: a conventional NVM namespace).
    pub zones: Option<Arc<Zones>>,
    /// Registrants and the reservation held: shared by the namespace's
    /// copies across attach, detach and Format NVM.
    pub reservations: Arc<Reservations>,
    /// Reads and writes completed, and their bytes: shared by the
    /// namespace's copies like `reservations`.
    pub counters: Arc<NamespaceCounters>,
}

/// Data and metadata byte sizes for a format; `None` for an unknown index.
fn format(index: u8) -> Option<LbaFormatSpec> {
    LBA_FORMATS.get(usize::from(index)).copied()
}

impl Namespace {
    /// Namespace `c`, with `ids` unless `c` sets its own, attached to
    /// controller `cntlid` if `c` says so.
    pub fn new(c: &NamespaceConfig, ids: NamespaceIds, cntlid: u16) -> Result<Self, ConfigError> {
        if c.nsid == 0 || c.nsid >= 0xFFFF_FFFE {
            return Err(ConfigError::Nsid(c.nsid));
        }
        if c.lba_size != 512 && c.lba_size != 4096 {
            return Err(ConfigError::LbaSize {
                nsid: c.nsid,
                lba_size: c.lba_size,
            });
        }
        let f = format(c.format_index).ok_or(ConfigError::FormatIndex {
            nsid: c.nsid,
            index: c.format_index,
        })?;
        if f.data_size != c.lba_size {
            return Err(ConfigError::FormatMismatch {
                nsid: c.nsid,
                lba_size: c.lba_size,
                index: c.format_index,
                data_size: f.data_size,
            });
        }
        if let Some(p) = c.protection {
            if PiFormat::new(p, f.guard, f.data_size, f.metadata_size).is_none() {
                return Err(ConfigError::ProtectionDoesNotFit {
                    nsid: c.nsid,
                    index: c.format_index,
                    ms: f.metadata_size,
                    pi_size: f.guard.pi_size(),
                });
            }
        }
        let ns = Self::with_format(
            c.nsid,
            c.ids.unwrap_or(ids),
            c.backend.clone(),
            c.format_index,
            c.extended_metadata,
            c.protection,
        )
        .ok_or(ConfigError::TooSmall(c.nsid))?;
        let ns = match c.zoned {
            Some(z) => {
                let zoned = |problem| ConfigError::Zoned {
                    nsid: c.nsid,
                    problem,
                };
                let ns = ns.zoned(z).map_err(zoned)?;
                // Every zone starts empty: nothing written may show
                // through (a file keeps what an earlier run wrote).
                ns.backend
                    .discard(0, ns.backend.size())
                    .map_err(|e| zoned(ZonedError::Discard(e.to_string())))?;
                ns
            }
            None => ns,
        };
        let reservations = Reservations::open(c.reservation_file.clone()).map_err(|message| {
            ConfigError::Reservations {
                nsid: c.nsid,
                path: c
                    .reservation_file
                    .as_deref()
                    .unwrap_or(std::path::Path::new(""))
                    .display()
                    .to_string(),
                message,
            }
        })?;
        Ok(Self {
            readiness: c.readiness,
            attached: Attached::only_if(c.attached, cntlid),
            reservations: Arc::new(reservations),
            ..ns
        })
    }

    /// This namespace cut into zones as `config` asks: only whole zones
    /// remain of it.
    pub fn zoned(self, config: ZonedConfig) -> Result<Self, ZonedError> {
        let zones = Zones::new(config, self.nsze, self.lba_shift)?;
        Ok(Self {
            nsze: zones.nsze(),
            zones: Some(Arc::new(zones)),
            ..self
        })
    }

    /// Its Command Set Identifier (Identify CNS 03h descriptor CSI).
    pub fn csi(&self) -> u8 {
        if self.zones.is_some() {
            csi::ZNS
        } else {
            csi::NVM
        }
    }

    /// A ready namespace, attached to no controller yet, over `backend` in format `index` with
    /// `protection`, or `None` if the index is unknown, the PI tuple does
    /// not fit its metadata or the backend holds no whole block.
    pub fn with_format(
        nsid: u32,
        ids: NamespaceIds,
        backend: Arc<dyn BlockDevice>,
        index: u8,
        extended: bool,
        protection: Option<Protection>,
    ) -> Option<Self> {
        let f = format(index)?;
        let pi = match protection {
            Some(p) => Some(PiFormat::new(p, f.guard, f.data_size, f.metadata_size)?),
            None => None,
        };
        let lba_shift = f.data_size.trailing_zeros() as u8;
        let stride = u64::from(f.data_size) + u64::from(f.metadata_size);
        let nsze = backend.size() / stride;
        (nsze > 0).then_some(Self {
            nsid,
            ids,
            format_index: index,
            lba_shift,
            ms: f.metadata_size,
            extended: extended && f.metadata_size > 0,
            pi,
            nsze,
            backend,
            readiness: Readiness::Immediate,
            attached: Attached::default(),
            formatting_until: None,
            sanitize: None,
            uncorrectable: Arc::default(),
            zones: None,
            reservations: Arc::default(),
            counters: Arc::default(),
        })
    }

    /// Bytes per logical block in the backend: data plus metadata.
    pub fn stride(&self) -> u64 {
        (1u64 << self.lba_shift) + u64::from(self.ms)
    }

    /// Bytes moved through the data pointer (PRPs) per block: metadata too
    /// for extended LBAs.
    pub fn data_bytes_per_block(&self) -> u64 {
        if self.extended {
            self.stride()
        } else {
            1u64 << self.lba_shift
        }
    }

    /// Metadata bytes moved through MPTR per block (separate metadata).
    pub fn separate_metadata_per_block(&self) -> u64 {
        if self.extended {
            0
        } else {
            u64::from(self.ms)
        }
    }

    /// Backend byte offset and length of `nlb` blocks at `slba`, or LBA Out
    /// of Range.
    pub fn byte_range(&self, slba: u64, nlb: u64) -> Result<(u64, u64), Status> {
        let out_of_range = || Status::LBA_OUT_OF_RANGE.with_dnr(true);
        match slba.checked_add(nlb) {
            // nsze * stride <= backend size, so neither product overflows.
            Some(end) if end <= self.nsze => Ok((slba * self.stride(), nlb * self.stride())),
            _ => Err(out_of_range()),
        }
    }

    /// Whether I/O command `op` may run now: the sanitize status while
    /// the NVM subsystem is sanitized or in sanitize failure mode (but for
    /// Flush, which touches no user data: §8.21); Namespace Not Ready (DNR
    /// = 0, or 1 for a never-ready namespace once the host's ready timeout
    /// has passed since enable); or Format In Progress.
    pub fn check_usable(
        &self,
        op: NvmOpcode,
        now: Instant,
        enabled_at: Option<Instant>,
        ready_timeout: Duration,
    ) -> Result<(), Status> {
        if let Some(status) = self.sanitize.filter(|_| op != NvmOpcode::FLUSH) {
            return Err(status);
        }
        let since_enable = enabled_at.map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        match self.readiness {
            Readiness::Immediate => {}
            Readiness::After(d) if since_enable >= d => {}
            Readiness::After(_) => return Err(Status::NAMESPACE_NOT_READY.with_dnr(false)),
            Readiness::Never => {
                return Err(Status::NAMESPACE_NOT_READY.with_dnr(since_enable >= ready_timeout))
            }
        }
        match self.formatting_until {
            Some(until) if now < until => Err(Status::FORMAT_IN_PROGRESS.with_dnr(false)),
            _ => Ok(()),
        }
    }

    /// NSTAT.NRDY (Identify CNS 08h): ready at `since_enable`.
    pub fn is_ready(&self, since_enable: Duration) -> bool {
        match self.readiness {
            Readiness::Immediate => true,
            Readiness::After(d) => since_enable >= d,
            Readiness::Never => false,
        }
    }

    /// Identify Namespace (CNS 00h, 11h): every entry of [`LBA_FORMATS`],
    /// extended or separate metadata, deallocated blocks read as zeroes.
    pub fn identify(&self) -> Box<IdentifyNamespace> {
        let mut id = IdentifyNamespace::new_boxed();
        id.nsze = U64::new(self.nsze);
        id.ncap = U64::new(self.nsze);
        id.nuse = U64::new(self.nsze);
        // NSFEAT bit 0: thin provisioning is not reported; DLFEAT bits 2:0
        // = 001b: deallocated blocks read as zeroes.
        id.nlbaf_z = (LBA_FORMATS.len() - 1) as u8;
        id.set_format_index(self.format_index, self.extended);
        id.mc = MC_EXTENDED_AND_SEPARATE;
        id.dpc = dpc::TYPE1 | dpc::TYPE2 | dpc::TYPE3 | dpc::FIRST | dpc::LAST;
        if let Some(pi) = &self.pi {
            id.dps = pi.pi_type.pit() | if pi.first { dps::FIRST } else { 0 };
        }
        id.dlfeat = 0x01;
        id.mssrl = U16::new(MSSRL);
        id.mcl = U32::new(MCL);
        id.msrc_z = MSRC_Z;
        for (slot, f) in id.lbaf.iter_mut().zip(LBA_FORMATS) {
            *slot = LbaFormat {
                ms: U16::new(f.metadata_size),
                lbads: f.data_size.trailing_zeros() as u8,
                // Relative Performance: 00b best for the plain formats.
                rp: u8::from(f.metadata_size != 0),
            };
        }
        let bytes = u128::from(self.backend.size());
        id.nvmcap = bytes.to_le_bytes();
        id.nguid = self.ids.nguid;
        id.endgid = U16::new(ENDURANCE_GROUP_ID);
        id.eui64 = self.ids.eui64;
        id.rescap = rescap::ALL_TYPES
            | rescap::IEKEY13
            | if self.reservations.can_persist() {
                rescap::PTPLS
            } else {
                0
            };
        id
    }

    /// The NVM Command Set's Identify Namespace (CNS 05h): one Extended LBA
    /// Format per entry of [`LBA_FORMATS`], whose PIF gives its guard; no
    /// storage tags (STS 0). The same for every namespace.
    pub fn identify_nvm() -> Box<IdentifyNamespaceNvm> {
        let mut id = IdentifyNamespaceNvm::new_boxed();
        for (slot, f) in id.elbaf.iter_mut().zip(LBA_FORMATS) {
            let pif = match f.guard {
                Guard::Crc16 => pif::GUARD_16B,
                Guard::Crc64 => pif::GUARD_64B,
            };
            *slot = U32::new(ExtendedLbaFormat::new().with_pif(pif).into());
        }
        id
    }
}
