//! Why a state could not be saved, decoded or restored.

use crate::config::ConfigError;
use crate::saved_check::InvalidState;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("the saved state is {len} bytes long, shorter than its {need}-byte header")]
    Truncated { len: usize, need: usize },
    #[error("not a vnvme saved state (its first bytes are not the magic VNVMESTA)")]
    BadMagic,
    #[error(
        "the saved state has format version {found}; this vnvme reads versions \
         {oldest} to {newest}: restore it with a vnvme of its version"
    )]
    UnsupportedVersion {
        found: u32,
        oldest: u32,
        newest: u32,
    },
    #[error(
        "the saved state's header says {declared} bytes; {actual} follow it (truncated or padded)"
    )]
    Length { declared: u64, actual: u64 },
    #[error("the saved state's header length is {0}, not a known one")]
    HeaderLength(u32),
    #[error(
        "the saved state's checksum is {stored:#018x}, its body's is {computed:#018x} (corrupt)"
    )]
    Checksum { stored: u64, computed: u64 },
    #[error("the saved state's body is not a valid state of format version {version}")]
    Body {
        version: u32,
        #[source]
        source: serde_json::Error,
    },
    #[error("the saved state does not fit this controller")]
    Invalid(#[from] InvalidState),
    #[error("the controller's configuration")]
    Config(#[from] ConfigError),
    #[error("the controller is running: pause it before saving its state")]
    NotPaused,
    #[error("the controller is not quiescent ({0}): let its commands complete before saving")]
    Busy(String),
    #[error("a {0} is in progress: saving it is not supported yet; wait for it to complete")]
    BackgroundBusy(&'static str),
}
