//! Controller and namespace configuration, checked once at construction.

use std::sync::Arc;
use std::time::Duration;

use vnvme_blockdev::BlockDevice;

use crate::protection::{Guard, Protection};
use crate::vendor::VendorCommands;
use crate::zoned::{ZonedConfig, ZonedError};

mod ids;
pub use ids::NamespaceIds;

/// How the controller presents itself and how much it grants. Everything here
/// is chosen by the operator, not the guest.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Serial Number (Identify Controller SN, 20 ASCII characters).
    pub serial: String,
    /// Model Number (MN, 40 ASCII characters).
    pub model: String,
    /// Firmware Revision (FR, 8 characters) of the factory image in the read
    /// only firmware slot 1, running at start. Defaults to the crate version.
    pub firmware: String,
    /// I/O queue pairs the controller grants at most (Number of Queues).
    pub max_io_queues: u16,
    /// MSI-X vectors the PCI function exposes: valid CQ interrupt vectors are
    /// `0..msix_vectors`.
    pub msix_vectors: u16,
    /// CAP.MQES: largest I/O queue, in entries, 0's based (>= 1).
    pub mqes_z: u16,
    /// MDTS: largest transfer is `2^mdts` minimum-size (4 KiB) pages (1..=12).
    pub mdts: u8,
    /// I/O queue worker threads (>= 1). Queue pairs are spread over them by
    /// CQ id; the admin queue has a worker thread of its own besides.
    pub workers: usize,
    /// Bits OR-ed into Identify Controller OACS (e.g. Doorbell Buffer Config).
    pub oacs_extra: u16,
    /// PCI Vendor ID and Subsystem Vendor ID reported in Identify Controller;
    /// must match the PCI config space the glue exposes. Default:
    /// [`DEFAULT_VENDOR_ID`], which the NVMe PCI function uses too.
    pub vid: u16,
    pub ssvid: u16,
    /// Controller ID.
    pub cntlid: u16,
    /// NVM Subsystem NQN; derived from the serial when `None`.
    pub subnqn: Option<String>,
    /// How the host's doorbell writes reach the queue workers.
    pub doorbells: DoorbellMode,
    /// Adaptive mode: how long a worker keeps polling the shadow doorbells
    /// without finding work before it arms EventIdx and sleeps. Mmap-poll
    /// mode: how long it spins before backing off to short sleeps.
    pub idle_poll: Duration,
    /// Adaptive mode: let each worker tune its poll window between 0 and
    /// `idle_poll` from what polling buys and costs (the `poll_window` module);
    /// off, the window is always `idle_poll`. Off by default: on a 2-core host
    /// shared with a TCG guest the tuned window closed and doorbell traps at
    /// QD 32 rose from about 0.05 to 0.5 per I/O.
    pub adaptive_window: bool,
    /// Adaptive mode: after the poll window, how long the worker keeps
    /// looking at the shadow doorbells every 25 µs, sleeping in between,
    /// before it arms EventIdx. The host does not trap meanwhile, and the
    /// core is free for the threads that produce its requests (a guest's
    /// vCPUs issue one every 30-250 µs under TCG). Zero: arm at once.
    pub doze: Duration,
    /// Move an I/O worker to the idle scheduling class (`SCHED_IDLE`: it gets
    /// a core only when no other thread wants one) while it has to fight for
    /// a core, and back to the usual class when it has one again or starves
    /// (the `worker::priority` module): a polling worker then does not take
    /// the core a guest's vCPUs need. On by default; off, always the usual
    /// class.
    pub idle_class: bool,
    /// Hold an I/O CQ's interrupt while its host is still submitting below
    /// the queue depth it has shown, so that a host filling its queue gets
    /// one interrupt when it is full (the `irq_batch` module): only a slow
    /// host (commands more than 25 µs apart, as from a TCG guest), at most
    /// 2 ms, and never when the host asked for Interrupt Coalescing or
    /// disabled it on the vector. On by default.
    pub batch_interrupts: bool,
    /// Handlers of vendor specific admin and I/O opcodes (C0h-FFh); the
    /// default holds the built-in examples (see [`crate::vendor`]).
    pub vendor: VendorCommands,
    /// The host's patience: CAP.TO and CRTO.CRWMT/CRIMT (500 ms units,
    /// rounded up, and raised to cover the longest [`Readiness::After`]
    /// delay). A [`Readiness::Never`] namespace answers Namespace Not Ready
    /// with DNR = 1 once this long has passed since enable. Default 5 s.
    pub ready_timeout: Duration,
    /// Namespaces the subsystem supports: Identify Controller NN is the
    /// larger of this and the largest configured NSID, and Namespace
    /// Management creates namespaces with free NSIDs up to NN. At most
    /// [`MAX_NAMESPACES`]. Default 0: NN is the largest configured NSID,
    /// which leaves Namespace Management no free NSID unless one is
    /// deleted (set e.g. 16 to create namespaces).
    pub max_namespaces: u32,
    /// Total NVM capacity in bytes (TNVMCAP) that namespaces are allocated
    /// from; configured namespaces count against it, and it is raised to
    /// their total if smaller. What is left (UNVMCAP) is what Namespace
    /// Management can create RAM-backed namespaces in. Default 0: no room
    /// beyond the configured namespaces.
    pub nvm_capacity: u64,
    /// How long Format NVM keeps a namespace busy (I/O to it gets Format In
    /// Progress meanwhile). Default 0: the format completes at once.
    pub format_duration: Duration,
    /// How fast a sanitize operation goes over the medium, in bytes per
    /// second (an Overwrite takes this per pass, a Crypto Erase goes 16
    /// times faster); it sets the Sanitize Status log's estimates. 0: as
    /// fast as the backends go, no estimates. Default
    /// [`DEFAULT_SANITIZE_RATE`].
    pub sanitize_rate: u64,
    /// How fast a device self-test reads the medium, in bytes per second
    /// (a short test reads 1/16 of it; Identify Controller EDSTT follows).
    /// 0: as fast as the backends go. Default [`DEFAULT_SELF_TEST_RATE`].
    pub self_test_rate: u64,
    /// Offer NVM Subsystem Reset (CAP.NSSRS). Off by default, as in QEMU:
    /// Linux treats the reset as a PCIe link loss it finds out about only
    /// when a command times out (30 s with I/O, 60 s without), since a
    /// vfio-user device has no link to drop. On for hosts that handle it.
    pub nssr: bool,
}

/// Largest [`ControllerConfig::max_namespaces`]: an Identify namespace list
/// holds 1024 entries.
pub const MAX_NAMESPACES: u32 = 1024;

/// Vendor ID used by default: 0x7E57 ("TEST"), for the Subsystem Vendor ID
/// too: the VID and SSVID of Identify Controller and of the NVMe PCI
/// function (`vnvme-device`). It is *not* assigned by the PCI-SIG: it was
/// chosen for testing, so hosts bind the device by its class code
/// (01:08:02, NVM Express) and apply no vendor-specific quirks. Override it
/// to impersonate a real device (e.g. 0x1B36:0x0010 is QEMU's NVMe
/// controller, for which Linux enables quirks).
pub const DEFAULT_VENDOR_ID: u16 = 0x7e57;

/// Default [`ControllerConfig::sanitize_rate`]: a 64 MiB namespace is
/// block erased in 64 ms, in about 32 steps the Sanitize Status log shows.
pub const DEFAULT_SANITIZE_RATE: u64 = 1 << 30;
/// Default [`ControllerConfig::self_test_rate`]: a short self-test of a
/// 1 GiB namespace (64 MiB read) takes 2 s, the extended one 32 s. What
/// `nvme device-self-test --wait` needs: nvme-cli looks at the progress
/// once a second and gives up on a test it never saw running.
pub const DEFAULT_SELF_TEST_RATE: u64 = 32 << 20;

/// Default [`ControllerConfig::ready_timeout`].
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(5);

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            serial: "VNVME0001".into(),
            model: "vnvme".into(),
            firmware: env!("CARGO_PKG_VERSION").into(),
            max_io_queues: 64,
            msix_vectors: 65,
            mqes_z: 1023,
            mdts: 5,
            workers: 1,
            oacs_extra: 0,
            vid: DEFAULT_VENDOR_ID,
            ssvid: DEFAULT_VENDOR_ID,
            cntlid: 1,
            subnqn: None,
            doorbells: DoorbellMode::default(),
            idle_poll: DEFAULT_IDLE_POLL,
            adaptive_window: false,
            doze: DEFAULT_DOZE,
            idle_class: true,
            batch_interrupts: true,
            vendor: VendorCommands::builtin(),
            ready_timeout: DEFAULT_READY_TIMEOUT,
            max_namespaces: 0,
            nvm_capacity: 0,
            format_duration: Duration::ZERO,
            sanitize_rate: DEFAULT_SANITIZE_RATE,
            self_test_rate: DEFAULT_SELF_TEST_RATE,
            nssr: false,
        }
    }
}

impl ControllerConfig {
    /// Largest data transfer in bytes (MDTS in CAP.MPSMIN = 4 KiB units).
    pub fn max_transfer(&self) -> u64 {
        4096u64 << self.mdts.min(12)
    }

    /// The NVM Subsystem NQN: `subnqn`, else derived from the serial.
    pub fn nqn(&self) -> String {
        self.subnqn
            .clone()
            .unwrap_or_else(|| format!("nqn.2024-01.io.vnvme:{}", self.serial))
    }
}

/// Default [`ControllerConfig::idle_poll`]: longer than the 30-250 µs a
/// TCG guest at queue depth 1 takes between a completion and its next
/// command, so polling usually catches it (a 100 µs window, or no window
/// and dozing at once, measured 0.8-0.9x QEMU's own nvme there; 300 µs
/// 1.05-1.2x, see the closing note of issue 4).
pub const DEFAULT_IDLE_POLL: Duration = Duration::from_micros(300);
/// Default [`ControllerConfig::doze`].
pub const DEFAULT_DOZE: Duration = Duration::from_millis(1);

/// How doorbell writes reach the controller (DESIGN.md, "Doorbells").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DoorbellMode {
    /// No shadow buffers (OACS bit 8 clear): every SQ tail and CQ head update
    /// is a register write that traps.
    Trap,
    /// Doorbell Buffer Config (§5.8) with QEMU's algorithm: process on trap,
    /// then publish EventIdx = the value seen, fence, re-read the shadow.
    Shadow,
    /// Doorbell Buffer Config, and BAR0's doorbell page offered for mmap as
    /// well (a client may ring through either, or trap). While busy the
    /// worker polls the shadow doorbells and the page, and keeps EventIdx
    /// behind them so the host never traps; after
    /// [`ControllerConfig::idle_poll`] without work it polls between short
    /// sleeps for [`ControllerConfig::doze`], then arms EventIdx, fences,
    /// re-reads, and sleeps: until a trap, and no longer than a back-off
    /// (25 µs doubling to 1 ms, 5 ms after a second of silence) after which
    /// it looks at the page and the shadows again, since a client that
    /// mapped the page never traps.
    #[default]
    Adaptive,
    /// OACS bit 8 clear; BAR0's doorbell page is shared memory the client
    /// maps (sparse mmap) and the worker polls it: no traps at all.
    MmapPoll,
}

impl DoorbellMode {
    pub const ALL: [DoorbellMode; 4] = [
        DoorbellMode::Trap,
        DoorbellMode::Shadow,
        DoorbellMode::Adaptive,
        DoorbellMode::MmapPoll,
    ];

    /// Whether Doorbell Buffer Config is advertised (OACS bit 8) and accepted.
    pub fn uses_dbbuf(self) -> bool {
        matches!(self, DoorbellMode::Shadow | DoorbellMode::Adaptive)
    }

    /// Whether BAR0's doorbell page is offered as a sparse-mmap area, so a
    /// client (SPDK's host, QEMU) can map it and ring doorbells with plain
    /// stores. `trap` and `shadow` do not offer it: they are the reference
    /// modes in which every doorbell the page would take is a trap.
    pub fn offers_page(self) -> bool {
        matches!(self, DoorbellMode::Adaptive | DoorbellMode::MmapPoll)
    }

    pub fn name(self) -> &'static str {
        match self {
            DoorbellMode::Trap => "trap",
            DoorbellMode::Shadow => "shadow",
            DoorbellMode::Adaptive => "adaptive",
            DoorbellMode::MmapPoll => "mmap-poll",
        }
    }
}

impl std::fmt::Display for DoorbellMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A doorbell mode name that is not one of `trap|shadow|adaptive|mmap-poll`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown doorbell mode {0:?} (expected trap, shadow, adaptive or mmap-poll)")]
pub struct UnknownDoorbellMode(pub String);

impl std::str::FromStr for DoorbellMode {
    type Err = UnknownDoorbellMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| UnknownDoorbellMode(s.to_string()))
    }
}

/// One entry of the controller's LBA format table (NVM Command Set §4.1.5.1,
/// LBAF[]): data bytes per logical block and metadata bytes per block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LbaFormatSpec {
    /// Logical block data size in bytes (512 or 4096).
    pub data_size: u32,
    /// Metadata bytes per logical block (0, 8, 16 or 64).
    pub metadata_size: u16,
    /// The guard of protection information in this format (Identify CNS
    /// 05h ELBAF.PIF), when a PI type is chosen.
    pub guard: Guard,
}

/// The LBA formats every namespace reports in Identify Namespace LBAF[]
/// (NLBAF = `LBA_FORMATS.len() - 1`), by index:
///
/// | index | data | metadata |
/// |---|---|---|
/// | 0 | 512 | 0 |
/// | 1 | 512 | 8 |
/// | 2 | 512 | 64 |
/// | 3 | 4096 | 0 (the default) |
/// | 4 | 4096 | 8 |
/// | 5 | 4096 | 64 |
/// | 6 | 4096 | 16, 64-bit guard |
/// | 7 | 4096 | 64, 64-bit guard |
///
/// Formats with metadata transfer it either with the data (extended LBAs,
/// FLBAS bit 4) or in a separate buffer at MPTR, as chosen at Format NVM
/// (MSET) or in [`NamespaceConfig::extended_metadata`]. Protection
/// information (Format NVM PI and PIL, [`NamespaceConfig::protection`])
/// fits every format with metadata: an 8-byte tuple with a 16-bit guard
/// (CRC-16 T10-DIF) in formats 1, 2, 4 and 5, a 16-byte tuple with a
/// 64-bit guard (CRC-64 NVMe) in formats 6 and 7 (see
/// the `protection` module). New formats are appended: hosts and
/// configurations name them by index.
pub const LBA_FORMATS: &[LbaFormatSpec] = &[
    LbaFormatSpec {
        data_size: 512,
        metadata_size: 0,
        guard: Guard::Crc16,
    },
    LbaFormatSpec {
        data_size: 512,
        metadata_size: 8,
        guard: Guard::Crc16,
    },
    LbaFormatSpec {
        data_size: 512,
        metadata_size: 64,
        guard: Guard::Crc16,
    },
    LbaFormatSpec {
        data_size: 4096,
        metadata_size: 0,
        guard: Guard::Crc16,
    },
    LbaFormatSpec {
        data_size: 4096,
        metadata_size: 8,
        guard: Guard::Crc16,
    },
    LbaFormatSpec {
        data_size: 4096,
        metadata_size: 64,
        guard: Guard::Crc16,
    },
    LbaFormatSpec {
        data_size: 4096,
        metadata_size: 16,
        guard: Guard::Crc64,
    },
    LbaFormatSpec {
        data_size: 4096,
        metadata_size: 64,
        guard: Guard::Crc64,
    },
];

/// Index in [`LBA_FORMATS`] of 4096-byte blocks without metadata.
pub const DEFAULT_FORMAT_INDEX: u8 = 3;

/// Index in [`LBA_FORMATS`] of `data_size`-byte blocks without metadata.
pub fn format_index_for(data_size: u32) -> Option<u8> {
    LBA_FORMATS
        .iter()
        .position(|f| f.data_size == data_size && f.metadata_size == 0)
        .and_then(|i| u8::try_from(i).ok())
}

/// When a namespace becomes ready after the controller is enabled (CC.EN
/// 0 -> 1). Until then I/O to it completes with Namespace Not Ready (generic
/// 0x82) and Identify CNS 08h reports NSTAT.NRDY = 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Readiness {
    /// Ready as soon as the controller is.
    #[default]
    Immediate,
    /// Ready this long after each enable; then a Namespace Attribute Changed
    /// event is raised (if enabled in Asynchronous Event Configuration).
    After(Duration),
    /// Never ready: Namespace Not Ready with DNR = 0 until the controller's
    /// ready timeout (CRTO.CRWMT) has passed since enable, DNR = 1 after.
    Never,
}

/// One namespace: its id, LBA format, storage and how it behaves at start.
#[derive(Debug, Clone)]
pub struct NamespaceConfig {
    /// Namespace ID, 1..=0xFFFF_FFFE, unique.
    pub nsid: u32,
    /// Logical block data size: 512 or 4096. Must equal
    /// `LBA_FORMATS[format_index].data_size`; [`NamespaceConfig::new`] and
    /// [`NamespaceConfig::with_format`] keep the two in step.
    pub lba_size: u32,
    pub backend: Arc<dyn BlockDevice>,
    /// When the namespace becomes ready (default: at once).
    pub readiness: Readiness,
    /// Attached to this controller at start (default true). A detached
    /// namespace is allocated but inactive: Identify CNS 00h returns zeroes
    /// and I/O gets Invalid Namespace or Format until Namespace Attachment.
    pub attached: bool,
    /// Index into [`LBA_FORMATS`] (default [`DEFAULT_FORMAT_INDEX`], or the
    /// no-metadata format of `lba_size` with [`NamespaceConfig::new`]).
    pub format_index: u8,
    /// For formats with metadata: extended LBAs (metadata follows each
    /// block's data in one buffer, FLBAS bit 4) rather than a separate
    /// buffer at MPTR. Default false.
    pub extended_metadata: bool,
    /// End-to-end protection: a PI type and where the tuple lies in the
    /// metadata (default none). Needs a format with metadata.
    pub protection: Option<Protection>,
    /// A zoned namespace (Zoned Namespace Command Set): its zones.
    /// Default `None`, a conventional NVM namespace.
    pub zoned: Option<ZonedConfig>,
    /// Where the namespace's reservations persist through power loss
    /// while PTPL is set (RESCAP.PTPLS); loaded at start if it exists.
    /// `None` (default): reservations cannot persist.
    pub reservation_file: Option<std::path::PathBuf>,
    /// NGUID, EUI-64 and UUID. `None` (default): derived from the
    /// controller's serial number and the NSID
    /// ([`NamespaceIds::for_controller`]).
    pub ids: Option<NamespaceIds>,
}

impl NamespaceConfig {
    /// A ready, attached namespace of `lba_size`-byte blocks (512 or 4096)
    /// without metadata. Another `lba_size` keeps the default format index
    /// and is refused by [`crate::Controller::new`].
    pub fn new(nsid: u32, lba_size: u32, backend: Arc<dyn BlockDevice>) -> Self {
        Self {
            nsid,
            lba_size,
            backend,
            readiness: Readiness::Immediate,
            attached: true,
            format_index: format_index_for(lba_size).unwrap_or(DEFAULT_FORMAT_INDEX),
            extended_metadata: false,
            protection: None,
            zoned: None,
            reservation_file: None,
            ids: None,
        }
    }

    /// Reports `ids` instead of the identifiers derived from the
    /// controller's serial number.
    pub fn with_ids(mut self, ids: NamespaceIds) -> Self {
        self.ids = Some(ids);
        self
    }

    /// Selects LBA format `index` (see [`LBA_FORMATS`]) and the matching
    /// `lba_size`. An unknown index is kept and refused at construction.
    pub fn with_format(mut self, index: u8) -> Self {
        self.format_index = index;
        if let Some(f) = LBA_FORMATS.get(usize::from(index)) {
            self.lba_size = f.data_size;
        }
        self
    }

    pub fn with_readiness(mut self, readiness: Readiness) -> Self {
        self.readiness = readiness;
        self
    }

    pub fn with_attached(mut self, attached: bool) -> Self {
        self.attached = attached;
        self
    }

    pub fn with_protection(mut self, protection: Option<Protection>) -> Self {
        self.protection = protection;
        self
    }

    pub fn with_extended_metadata(mut self, extended: bool) -> Self {
        self.extended_metadata = extended;
        self
    }

    pub fn with_zoned(mut self, zoned: Option<ZonedConfig>) -> Self {
        self.zoned = zoned;
        self
    }

    /// The format this configuration selects, if the index is valid.
    pub fn format(&self) -> Option<LbaFormatSpec> {
        LBA_FORMATS.get(usize::from(self.format_index)).copied()
    }
}

/// A configuration the controller cannot serve.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("workers must be at least 1")]
    NoWorkers,
    #[error(
        "max_io_queues must be 1..={max} (the doorbells of that many queue pairs fill BAR0's \
         doorbell page), got {got}"
    )]
    MaxIoQueues { got: u16, max: u16 },
    #[error("msix_vectors must be 1..=2048, got {0}")]
    MsixVectors(u16),
    #[error("mqes_z must be at least 1 (queues of two entries)")]
    Mqes,
    #[error("mdts must be 1..=12, got {0}")]
    Mdts(u8),
    #[error("namespace id {0:#x} is invalid")]
    Nsid(u32),
    #[error("namespace id {0} is configured twice")]
    DuplicateNsid(u32),
    #[error(
        "the subsystem has a controller with CNTLID {0} already: each controller of a subsystem \
         needs its own (hosts reject a duplicate)"
    )]
    DuplicateCntlid(u16),
    #[error(
        "namespaces {other} and {nsid} have the same {id}: hosts would not tell them apart; give \
         one of them its own"
    )]
    DuplicateId {
        nsid: u32,
        other: u32,
        id: &'static str,
    },
    #[error("namespace {nsid}: LBA size {lba_size} is not 512 or 4096")]
    LbaSize { nsid: u32, lba_size: u32 },
    #[error("namespace {0}: backend is smaller than one logical block")]
    TooSmall(u32),
    #[error("namespace {nsid}: LBA format index {index} is not in the format table")]
    FormatIndex { nsid: u32, index: u8 },
    #[error("namespace {nsid}: LBA size {lba_size} does not match format {index} ({data_size}-byte blocks)")]
    FormatMismatch {
        nsid: u32,
        lba_size: u32,
        index: u8,
        data_size: u32,
    },
    #[error(
        "namespace {nsid}: protection information needs a format with at least {pi_size} \
         bytes of metadata, format {index} has {ms}"
    )]
    ProtectionDoesNotFit {
        nsid: u32,
        index: u8,
        ms: u16,
        pi_size: u16,
    },
    #[error("max_namespaces must be at most {max}, got {got}")]
    MaxNamespaces { got: u32, max: u32 },
    #[error("ready_timeout must be 500 ms..=32767 s, got {0:?}")]
    ReadyTimeout(Duration),
    #[error("namespace {nsid}: {problem}")]
    Zoned { nsid: u32, problem: ZonedError },
    #[error("namespace {nsid}: reservation file {path}: {message}")]
    Reservations {
        nsid: u32,
        path: String,
        message: String,
    },
}
