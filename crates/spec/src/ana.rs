//! Asymmetric Namespace Access states (NVMe Base 2.0 §8.1.3): the values
//! of an ANA Group Descriptor in log page 0Ch, their names as the
//! operator writes them, and the status I/O gets in each.

use crate::Status;

/// An ANA group's state on one controller (§8.1.3; log page 0Ch values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AnaState {
    #[default]
    Optimized,
    NonOptimized,
    Inaccessible,
    PersistentLoss,
    Change,
}

impl AnaState {
    /// The value in an ANA Group Descriptor (bits 3:0 of byte 16).
    pub fn code(self) -> u8 {
        match self {
            Self::Optimized => 0x01,
            Self::NonOptimized => 0x02,
            Self::Inaccessible => 0x03,
            Self::PersistentLoss => 0x04,
            Self::Change => 0x0F,
        }
    }

    /// The names `ana_set` takes.
    pub const NAMES: &'static [&'static str] = &[
        "optimized",
        "non-optimized",
        "inaccessible",
        "persistent-loss",
        "change",
    ];

    /// What I/O through a controller in this state gets: `None` if it runs.
    pub fn io_status(self) -> Option<Status> {
        match self {
            Self::Optimized | Self::NonOptimized => None,
            // DNR clear: the host retries on another path.
            Self::Inaccessible => Some(Status::ASYMMETRIC_ACCESS_INACCESSIBLE),
            Self::PersistentLoss => Some(Status::ASYMMETRIC_ACCESS_PERSISTENT_LOSS),
            Self::Change => Some(Status::ASYMMETRIC_ACCESS_TRANSITION),
        }
    }
}

impl std::str::FromStr for AnaState {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "optimized" => Self::Optimized,
            "non-optimized" => Self::NonOptimized,
            "inaccessible" => Self::Inaccessible,
            "persistent-loss" => Self::PersistentLoss,
            "change" => Self::Change,
            other => {
                return Err(format!(
                    "unknown ANA state {other:?}: one of {}",
                    Self::NAMES.join(", ")
                ))
            }
        })
    }
}

impl std::fmt::Display for AnaState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = match self {
            Self::Optimized => 0,
            Self::NonOptimized => 1,
            Self::Inaccessible => 2,
            Self::PersistentLoss => 3,
            Self::Change => 4,
        };
        f.write_str(Self::NAMES[i])
    }
}
