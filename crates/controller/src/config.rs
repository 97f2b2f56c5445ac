//! Controller and namespace configuration, checked once at construction.

use std::sync::Arc;

use vnvme_blockdev::BlockDevice;

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
