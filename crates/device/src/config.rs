//! What an [`NvmeDevice`](crate::NvmeDevice) is built from, and why it may
//! refuse.

use vnvme_controller::{
    ConfigError, ControllerConfig, NamespaceConfig, PollGroups, MAX_NAMESPACES,
};
use vnvme_pci::{msi_vectors, Interrupts, PciError, MSIX_ENTRY_SIZE};
use vnvme_spec::regs::Bar0Layout;

/// Device ID used by default: 0x4E56 ("NV"), with
/// [`DEFAULT_VENDOR_ID`](vnvme_controller::DEFAULT_VENDOR_ID).
pub const DEFAULT_DEVICE_ID: u16 = 0x4e56;
/// Class code: mass storage (01), non-volatile memory (08), NVM Express I/O
/// controller (02).
pub const CLASS_CODE_NVME: u32 = 0x01_08_02;

/// MSI-X vectors the function can have: its table fills one page of BAR0
/// ([`Bar0Layout::MSIX_TABLE`]) with 16-byte entries, 256 of them.
pub const MAX_MSIX_VECTORS: u16 =
    ((Bar0Layout::MSIX_TABLE.end - Bar0Layout::MSIX_TABLE.start) / MSIX_ENTRY_SIZE) as u16;

/// The device: a controller, its namespaces (backends already opened) and
/// what belongs to the PCI function.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// The controller. Its `msix_vectors`, `vid` and `ssvid` are replaced by
    /// the PCI function's, so that Identify Controller and config space agree.
    pub controller: ControllerConfig,
    /// Namespaces in the order given; each carries its NSID.
    pub namespaces: Vec<NamespaceConfig>,
    /// MSI-X vectors, 1..=[`MAX_MSIX_VECTORS`]. `None`: one per I/O queue
    /// plus the admin queue's, at most [`MAX_MSIX_VECTORS`] (fewer vectors
    /// than queues means CQs share vectors). With MSI: the largest power of
    /// two not above it, at most 32.
    pub msix_vectors: Option<u16>,
    /// MSI-X (the default) or MSI; see [`Interrupts`] for why MSI exists.
    pub interrupts: Interrupts,
    /// Serve the queues from these poll group threads, shared with other
    /// devices, instead of the controller's own (`None`, the default).
    pub poll_groups: Option<PollGroups>,
    /// Be another controller of this controller's NVM subsystem (its
    /// namespaces shared; `namespaces` is then ignored), with
    /// `controller.cntlid` its own (`None`, the default: a subsystem of its
    /// own).
    pub subsystem_of: Option<std::sync::Arc<vnvme_controller::Controller>>,
}

impl DeviceConfig {
    /// `controller` with `namespaces`, one vector per queue.
    pub fn new(controller: ControllerConfig, namespaces: Vec<NamespaceConfig>) -> Self {
        Self {
            controller,
            namespaces,
            msix_vectors: None,
            interrupts: Interrupts::Msix,
            poll_groups: None,
            subsystem_of: None,
        }
    }

    /// The MSI-X (or MSI) vectors the function exposes.
    pub(crate) fn vectors(&self) -> Result<u16, DeviceError> {
        let msix = self.msix_vectors()?;
        Ok(match self.interrupts {
            Interrupts::Msix => msix,
            Interrupts::Msi => msi_vectors(msix),
        })
    }

    fn msix_vectors(&self) -> Result<u16, DeviceError> {
        match self.msix_vectors {
            None => Ok(self
                .controller
                .max_io_queues
                .saturating_add(1)
                .min(MAX_MSIX_VECTORS)),
            Some(n) if (1..=MAX_MSIX_VECTORS).contains(&n) => Ok(n),
            Some(got) => Err(DeviceError::MsixVectors {
                got,
                max: MAX_MSIX_VECTORS,
            }),
        }
    }

    /// Refuses more namespaces than an Identify list can name.
    pub(crate) fn check_namespaces(&self) -> Result<(), DeviceError> {
        let got = self.namespaces.len();
        if u32::try_from(got).is_ok_and(|n| n <= MAX_NAMESPACES) {
            return Ok(());
        }
        Err(DeviceError::TooManyNamespaces {
            got,
            max: MAX_NAMESPACES,
        })
    }
}

/// A [`DeviceConfig`] the device cannot be built from.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("msix_vectors must be 1..={max} (the MSI-X table fills one page of BAR0), got {got}")]
    MsixVectors { got: u16, max: u16 },
    #[error("at most {max} namespaces are supported, got {got}")]
    TooManyNamespaces { got: usize, max: u32 },
    #[error("building the PCI function")]
    Pci(#[source] PciError),
    #[error("creating the shared doorbell page")]
    DoorbellPage(#[source] std::io::Error),
    #[error("configuring the NVMe controller")]
    Controller(#[source] ConfigError),
    #[error("restoring the NVMe controller's saved state")]
    Restore(#[source] vnvme_controller::StateError),
    #[error("the function handed over does not fit: {0}")]
    Handover(String),
}
