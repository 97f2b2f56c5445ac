//! Which message-signalled interrupt capability the function offers, and the
//! MSI capability itself (PCI Local Bus 3.0 §6.8.1).
//!
//! MSI-X is the default: a vector per queue. MSI exists for one reason, a
//! QEMU bug: QEMU 11.1's `vfio-user-pci` aborts the whole VM when a device
//! with an MSI-X capability is hot-unplugged (`device_del`), because its
//! finalizer removes the MSI-X PBA's memory region from a container the
//! region was already detached from (see docs/hotplug.md, "Attaching and
//! detaching at run time"). A function without MSI-X never reaches that
//! code.

use std::fmt;
use std::str::FromStr;

use crate::config::{cap_id, ConfigSpace};

/// The interrupt capability in the function's capability list.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Interrupts {
    /// MSI-X: up to 2048 vectors, table and PBA in BAR0.
    #[default]
    Msix,
    /// MSI: up to 32 vectors (a power of two), no table. An x86 guest
    /// without interrupt remapping gets one vector (Linux's nvme driver
    /// then uses one I/O queue).
    Msi,
}

/// Most vectors an MSI capability can announce (Multiple Message Capable
/// 101b).
pub const MAX_MSI_VECTORS: u16 = 32;

impl Interrupts {
    pub const NAMES: &'static str = "msix | msi";
}

impl fmt::Display for Interrupts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Msix => "msix",
            Self::Msi => "msi",
        })
    }
}

/// An interrupt kind that is neither `msix` nor `msi`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown interrupt kind {0:?} (expected {names})", names = Interrupts::NAMES)]
pub struct UnknownInterrupts(pub String);

impl FromStr for Interrupts {
    type Err = UnknownInterrupts;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "msix" | "msi-x" => Ok(Self::Msix),
            "msi" => Ok(Self::Msi),
            _ => Err(UnknownInterrupts(s.to_owned())),
        }
    }
}

/// MSI Message Control bits.
pub mod msi_ctrl {
    pub const ENABLE: u16 = 1 << 0;
    /// Multiple Message Capable: log2 of the vectors the function asks for.
    pub const MMC_SHIFT: u16 = 1;
    /// Multiple Message Enable: log2 of the vectors the host granted.
    pub const MME_MASK: u16 = 0b111 << 4;
    pub const ADDR_64: u16 = 1 << 7;
}

/// The vectors an MSI capability can announce for a wish of `want`: the
/// largest power of two not above it, at most [`MAX_MSI_VECTORS`].
pub fn msi_vectors(want: u16) -> u16 {
    let n = want.clamp(1, MAX_MSI_VECTORS);
    1 << (15 - n.leading_zeros())
}

/// Defines a 64-bit MSI capability without per-vector masking at `at`
/// (14 bytes) announcing `vectors` (a power of two, at most 32), linked to
/// `next`. Enable, Multiple Message Enable, address and data are the
/// host's to write.
pub(crate) fn define_msi(c: &mut ConfigSpace, at: usize, next: usize, vectors: u16) {
    let mmc = vectors.trailing_zeros() as u16;
    c.define(at, 1, cap_id::MSI.into(), 0, 0);
    c.define(at + 1, 1, next as u32, 0, 0);
    let ctrl = msi_ctrl::ADDR_64 | mmc << msi_ctrl::MMC_SHIFT;
    let writable = msi_ctrl::ENABLE | msi_ctrl::MME_MASK;
    c.define(at + 2, 2, ctrl.into(), writable.into(), 0);
    // Message Address: dword aligned; Upper Address; Data (16 bits).
    c.define(at + 4, 4, 0, !0b11, 0);
    c.define(at + 8, 4, 0, !0, 0);
    c.define(at + 0xc, 2, 0, 0xffff, 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msi_vectors_are_a_power_of_two_up_to_32() {
        let got: Vec<u16> = [0, 1, 2, 3, 5, 8, 31, 32, 65, 2048]
            .into_iter()
            .map(msi_vectors)
            .collect();
        assert_eq!(got, [1, 1, 2, 2, 4, 8, 16, 32, 32, 32]);
    }

    #[test]
    fn interrupt_kinds_parse_and_print() {
        assert_eq!("msi".parse(), Ok(Interrupts::Msi));
        assert_eq!("msix".parse(), Ok(Interrupts::Msix));
        assert_eq!(Interrupts::Msi.to_string(), "msi");
        let err = "intx".parse::<Interrupts>().unwrap_err().to_string();
        assert!(
            err.contains("\"intx\"") && err.contains("msix | msi"),
            "{err}"
        );
    }
}
