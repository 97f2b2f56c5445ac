//! Controller and namespace configuration, checked once at construction.

use std::sync::Arc;
use std::time::Duration;

use vnvme_blockdev::BlockDevice;

use crate::vendor::VendorCommands;

/// How the controller presents itself and how much it grants. Everything here
/// is chosen by the operator, not the guest.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Serial Number (Identify Controller SN, 20 ASCII characters).
    pub serial: String,
    /// Model Number (MN, 40 ASCII characters).
    pub model: String,
    /// Firmware Revision (FR, 8 characters). Defaults to the crate version.
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
    /// Queue worker threads (>= 1). Queue pairs are spread over them by CQ id;
    /// the admin queue runs on worker 0.
    pub workers: usize,
    /// Bits OR-ed into Identify Controller OACS (e.g. Doorbell Buffer Config).
    pub oacs_extra: u16,
    /// PCI Vendor ID and Subsystem Vendor ID reported in Identify Controller;
    /// must match the PCI config space the glue exposes.
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
    /// Handlers of vendor specific admin and I/O opcodes (C0h-FFh); the
    /// default holds the built-in examples (see [`crate::vendor`]).
    pub vendor: VendorCommands,
}

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
            vid: 0x1b36,
            ssvid: 0x1af4,
            cntlid: 1,
            subnqn: None,
            doorbells: DoorbellMode::default(),
            idle_poll: DEFAULT_IDLE_POLL,
            vendor: VendorCommands::builtin(),
        }
    }
}

impl ControllerConfig {
    /// Largest data transfer in bytes (MDTS in CAP.MPSMIN = 4 KiB units).
    pub fn max_transfer(&self) -> u64 {
        4096u64 << self.mdts.min(12)
    }

    pub(crate) fn nqn(&self) -> String {
        self.subnqn
            .clone()
            .unwrap_or_else(|| format!("nqn.2024-01.io.vnvme:{}", self.serial))
    }
}

/// Default [`ControllerConfig::idle_poll`].
pub const DEFAULT_IDLE_POLL: Duration = Duration::from_micros(100);

/// How doorbell writes reach the controller (DESIGN.md, "Doorbells").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DoorbellMode {
    /// No shadow buffers (OACS bit 8 clear): every SQ tail and CQ head update
    /// is a register write that traps.
    Trap,
    /// Doorbell Buffer Config (§5.8) with QEMU's algorithm: process on trap,
    /// then publish EventIdx = the value seen, fence, re-read the shadow.
    Shadow,
    /// Doorbell Buffer Config; while busy the worker polls the shadow
    /// doorbells and keeps EventIdx behind them so the host never traps;
    /// after [`ControllerConfig::idle_poll`] without work it arms EventIdx,
    /// fences, re-reads, and sleeps until a trap.
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

/// One namespace: its id, logical block size, and storage.
#[derive(Debug, Clone)]
pub struct NamespaceConfig {
    /// Namespace ID, 1..=0xFFFF_FFFE, unique.
    pub nsid: u32,
    /// Logical block size: 512 or 4096.
    pub lba_size: u32,
    pub backend: Arc<dyn BlockDevice>,
}

/// A configuration the controller cannot serve.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("workers must be at least 1")]
    NoWorkers,
    #[error("max_io_queues must be 1..=65534, got {0}")]
    MaxIoQueues(u16),
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
    #[error("namespace {nsid}: LBA size {lba_size} is not 512 or 4096")]
    LbaSize { nsid: u32, lba_size: u32 },
    #[error("namespace {0}: backend is smaller than one logical block")]
    TooSmall(u32),
}
