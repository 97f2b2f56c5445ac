//! A PCI Express endpoint function: type 0 header, 64-bit memory BAR0,
//! and the capability list PM -> MSI-X (or MSI) -> PCI Express. What the
//! function is (IDs, class code, BAR0 size, where the MSI-X table and PBA
//! lie) is the caller's [`PciConfig`]: the NVMe function is `vnvme-device`'s.

use crate::config::{cap_id, ConfigSpace};
use crate::msi::{define_msi, Interrupts, MAX_MSI_VECTORS};

/// Type 0 header offsets (PCI Local Bus 3.0 §6.1).
pub mod offset {
    pub const VENDOR_ID: usize = 0x00;
    pub const DEVICE_ID: usize = 0x02;
    pub const COMMAND: usize = 0x04;
    pub const STATUS: usize = 0x06;
    pub const REVISION: usize = 0x08;
    pub const CLASS_PROG_IF: usize = 0x09;
    pub const CACHE_LINE_SIZE: usize = 0x0c;
    pub const HEADER_TYPE: usize = 0x0e;
    pub const BAR0: usize = 0x10;
    pub const BAR1: usize = 0x14;
    pub const SUBSYSTEM_VENDOR_ID: usize = 0x2c;
    pub const SUBSYSTEM_ID: usize = 0x2e;
    pub const ROM_BAR: usize = 0x30;
    pub const CAPABILITIES_PTR: usize = 0x34;
    pub const INTERRUPT_LINE: usize = 0x3c;
    pub const INTERRUPT_PIN: usize = 0x3d;
}

/// Command register bits.
pub mod command {
    pub const MEMORY_SPACE: u16 = 1 << 1;
    pub const BUS_MASTER: u16 = 1 << 2;
    pub const PARITY_ERROR_RESPONSE: u16 = 1 << 6;
    pub const SERR_ENABLE: u16 = 1 << 8;
    pub const INTX_DISABLE: u16 = 1 << 10;
}

/// Status register bits.
pub mod status {
    pub const INTERRUPT_STATUS: u16 = 1 << 3;
    pub const CAPABILITIES_LIST: u16 = 1 << 4;
    pub const MASTER_DATA_PARITY_ERROR: u16 = 1 << 8;
    pub const SIGNALED_TARGET_ABORT: u16 = 1 << 11;
    pub const RECEIVED_TARGET_ABORT: u16 = 1 << 12;
    pub const RECEIVED_MASTER_ABORT: u16 = 1 << 13;
    pub const SIGNALED_SYSTEM_ERROR: u16 = 1 << 14;
    pub const DETECTED_PARITY_ERROR: u16 = 1 << 15;
    /// The error bits, all write-1-to-clear.
    pub const W1C: u16 = MASTER_DATA_PARITY_ERROR
        | SIGNALED_TARGET_ABORT
        | RECEIVED_TARGET_ABORT
        | RECEIVED_MASTER_ABORT
        | SIGNALED_SYSTEM_ERROR
        | DETECTED_PARITY_ERROR;
}

/// Where our capabilities live.
pub const PM_CAP: usize = 0x40;
pub const MSIX_CAP: usize = 0x50;
/// MSI takes MSI-X's place when [`PciConfig::interrupts`] asks for it.
pub const MSI_CAP: usize = MSIX_CAP;
pub const PCIE_CAP: usize = 0x60;

/// MSI-X Message Control bits.
pub mod msix_ctrl {
    pub const TABLE_SIZE_MASK: u16 = 0x07ff;
    pub const FUNCTION_MASK: u16 = 1 << 14;
    pub const ENABLE: u16 = 1 << 15;
}

/// BAR0 memory type bits: 64-bit (10b in bits 2:1), not prefetchable.
const BAR_MEM_64: u32 = 0b100;

/// What the caller chooses about the function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciConfig {
    pub vendor: u16,
    pub device: u16,
    pub subsystem_vendor: u16,
    pub subsystem: u16,
    pub revision: u8,
    /// Class code: base class, sub-class, programming interface (e.g.
    /// 01:08:02, an NVM Express I/O controller).
    pub class_code: u32,
    /// Size of BAR0: a power of two, at least 4 KiB.
    pub bar0_size: u64,
    /// MSI-X (the default) or MSI.
    pub interrupts: Interrupts,
    /// Number of MSI-X vectors, 1..=2048; with MSI, the vectors the MSI
    /// capability announces: a power of two, at most 32.
    pub msix_vectors: u16,
    /// (BIR, offset) of the MSI-X table; only BAR0 exists, so BIR must be 0.
    pub msix_table: (u8, u32),
    /// (BIR, offset) of the PBA.
    pub msix_pba: (u8, u32),
}

/// A [`PciConfig`] that cannot describe a function.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PciError {
    #[error("BAR0 size {0:#x} is not a power of two of at least 4 KiB")]
    Bar0Size(u64),
    #[error("{0} MSI-X vectors is outside 1..=2048")]
    MsixVectors(u16),
    #[error("{0} MSI vectors is not a power of two up to {MAX_MSI_VECTORS}")]
    MsiVectors(u16),
    #[error("MSI-X {what} at BIR {bir} offset {offset:#x} is not 8-byte aligned inside BAR0")]
    MsixPlacement {
        what: &'static str,
        bir: u8,
        offset: u32,
    },
    #[error("MSI-X table and PBA overlap")]
    MsixOverlap,
}

/// The function's configuration space and what follows from it.
#[derive(Debug, Clone)]
pub struct PciFunction {
    config: ConfigSpace,
    initial: ConfigSpace,
    params: PciConfig,
}

impl PciFunction {
    /// The function `params` describes.
    pub fn new(params: PciConfig) -> Result<Self, PciError> {
        let size = params.bar0_size;
        if !size.is_power_of_two() || size < 4096 {
            return Err(PciError::Bar0Size(size));
        }
        let n = params.msix_vectors;
        match params.interrupts {
            Interrupts::Msix => {
                if n == 0 || n > 2048 {
                    return Err(PciError::MsixVectors(n));
                }
                let n = u64::from(n);
                let table = check_placement("table", params.msix_table, n * 16, size)?;
                let pba = check_placement("PBA", params.msix_pba, n.div_ceil(64) * 8, size)?;
                if table.0 < pba.1 && pba.0 < table.1 {
                    return Err(PciError::MsixOverlap);
                }
            }
            Interrupts::Msi => {
                if !n.is_power_of_two() || n > MAX_MSI_VECTORS {
                    return Err(PciError::MsiVectors(n));
                }
            }
        }

        let mut c = ConfigSpace::default();
        c.define(offset::VENDOR_ID, 2, params.vendor.into(), 0, 0);
        c.define(offset::DEVICE_ID, 2, params.device.into(), 0, 0);
        let cmd_writable = command::MEMORY_SPACE
            | command::BUS_MASTER
            | command::PARITY_ERROR_RESPONSE
            | command::SERR_ENABLE
            | command::INTX_DISABLE;
        c.define(offset::COMMAND, 2, 0, cmd_writable.into(), 0);
        c.define(
            offset::STATUS,
            2,
            status::CAPABILITIES_LIST.into(),
            0,
            status::W1C.into(),
        );
        c.define(offset::REVISION, 1, params.revision.into(), 0, 0);
        c.define(offset::CLASS_PROG_IF, 3, params.class_code, 0, 0);
        c.define(offset::CACHE_LINE_SIZE, 1, 0, 0xff, 0);
        c.define(offset::HEADER_TYPE, 1, 0, 0, 0);
        // 64-bit BAR0/BAR1: the address bits below the size are read-only 0,
        // so writing all ones reads back the size mask.
        let mask = !(size - 1);
        c.define(offset::BAR0, 4, BAR_MEM_64, (mask as u32) & !0xf, 0);
        c.define(offset::BAR1, 4, 0, (mask >> 32) as u32, 0);
        c.define(
            offset::SUBSYSTEM_VENDOR_ID,
            2,
            params.subsystem_vendor.into(),
            0,
            0,
        );
        c.define(offset::SUBSYSTEM_ID, 2, params.subsystem.into(), 0, 0);
        c.define(offset::ROM_BAR, 4, 0, 0, 0);
        c.define(offset::CAPABILITIES_PTR, 1, PM_CAP as u32, 0, 0);
        c.define(offset::INTERRUPT_LINE, 1, 0, 0xff, 0);
        c.define(offset::INTERRUPT_PIN, 1, 1, 0, 0); // INTA#

        // Power Management (PCI PM 1.2 §3.2): version 3, D0 only.
        c.define(PM_CAP, 1, cap_id::POWER_MANAGEMENT.into(), 0, 0);
        c.define(PM_CAP + 1, 1, MSIX_CAP as u32, 0, 0); // MSI-X or MSI, same place
        c.define(PM_CAP + 2, 2, 0x0003, 0, 0);
        // PMCSR: PowerState (1:0) writable, No_Soft_Reset (3) set, PME_Status W1C.
        c.define(PM_CAP + 4, 2, 1 << 3, 0x0003, 1 << 15);

        match params.interrupts {
            Interrupts::Msix => define_msix(&mut c, &params),
            Interrupts::Msi => define_msi(&mut c, MSI_CAP, PCIE_CAP, n),
        }

        // PCI Express capability, version 2, endpoint (PCIe Base 4.0 §7.5.3).
        c.define(PCIE_CAP, 1, cap_id::PCI_EXPRESS.into(), 0, 0);
        c.define(PCIE_CAP + 1, 1, 0, 0, 0);
        c.define(PCIE_CAP + 2, 2, 0x0002, 0, 0);
        // Device Capabilities: 128-byte max payload, role-based error reporting.
        c.define(PCIE_CAP + 4, 4, 1 << 15, 0, 0);
        // Device Control: error reporting enables, relaxed ordering, max
        // payload, extended tag, no snoop, max read request are writable; not
        // Initiate FLR (no FLR offered).
        c.define(PCIE_CAP + 8, 2, 0x2810, 0x7fff, 0);
        // Device Status: error detected bits are W1C.
        c.define(PCIE_CAP + 0xa, 2, 0, 0, 0x000f);
        // Link: 2.5 GT/s x1.
        c.define(PCIE_CAP + 0xc, 4, 0x0000_0011, 0, 0);
        c.define(PCIE_CAP + 0x10, 2, 0, 0x00cb, 0);
        c.define(PCIE_CAP + 0x12, 2, 0x0011, 0, 0);
        c.define(PCIE_CAP + 0x2c, 4, 1 << 1, 0, 0); // Link Capabilities 2: 2.5 GT/s
        c.define(PCIE_CAP + 0x30, 2, 1, 0, 0); // Link Control 2: target 2.5 GT/s
                                               // Extended space at 0x100 reads as an empty list (all zeros).

        Ok(Self {
            initial: c.clone(),
            config: c,
            params,
        })
    }

    /// The parameters the function was built from.
    pub fn params(&self) -> &PciConfig {
        &self.params
    }

    /// Guest config read: any size at any offset; out of range reads 0.
    pub fn config_read(&self, offset: u64, buf: &mut [u8]) {
        self.config.read(offset, buf);
    }

    /// Guest config write: any size at any offset; read-only bits are kept,
    /// W1C bits clear, out of range is ignored.
    pub fn config_write(&mut self, offset: u64, data: &[u8]) {
        self.config.write(offset, data);
    }

    /// Back to power-on state (a function-level reset).
    pub fn reset(&mut self) {
        self.config = self.initial.clone();
    }

    /// Config space as a live upgrade left it ([`ConfigSpace::load`]:
    /// only what the guest can change is taken). False if `saved` is not
    /// a whole config space.
    pub fn restore_config(&mut self, saved: &[u8]) -> bool {
        self.config.load(saved)
    }

    /// The raw storage, for device-side updates.
    pub fn config_space(&self) -> &ConfigSpace {
        &self.config
    }

    pub fn command(&self) -> u16 {
        self.config.get_u16(offset::COMMAND)
    }

    pub fn status(&self) -> u16 {
        self.config.get_u16(offset::STATUS)
    }

    /// The guest-programmed BAR0 address (64-bit, flag bits removed).
    pub fn bar0_address(&self) -> u64 {
        let lo = u64::from(self.config.get_u32(offset::BAR0) & !0xf);
        let hi = u64::from(self.config.get_u32(offset::BAR1));
        (hi << 32 | lo) & !(self.params.bar0_size - 1)
    }

    pub fn memory_enabled(&self) -> bool {
        self.command() & command::MEMORY_SPACE != 0
    }

    pub fn bus_master_enabled(&self) -> bool {
        self.command() & command::BUS_MASTER != 0
    }

    pub fn intx_disabled(&self) -> bool {
        self.command() & command::INTX_DISABLE != 0
    }

    fn msix_control(&self) -> u16 {
        match self.params.interrupts {
            Interrupts::Msix => self.config.get_u16(MSIX_CAP + 2),
            Interrupts::Msi => 0,
        }
    }

    pub fn msix_enabled(&self) -> bool {
        self.msix_control() & msix_ctrl::ENABLE != 0
    }

    pub fn msix_function_masked(&self) -> bool {
        self.msix_control() & msix_ctrl::FUNCTION_MASK != 0
    }

    /// MSI-X vectors, or with MSI the vectors its capability announces.
    pub fn msix_vectors(&self) -> u16 {
        self.params.msix_vectors
    }

    /// MSI-X or MSI.
    pub fn interrupts(&self) -> Interrupts {
        self.params.interrupts
    }

    /// Status.Interrupt Status reflects the device's INTx# level.
    pub fn set_intx_status(&mut self, asserted: bool) {
        let s = self.config.get_u16(offset::STATUS);
        let s = if asserted {
            s | status::INTERRUPT_STATUS
        } else {
            s & !status::INTERRUPT_STATUS
        };
        self.config.set_u16(offset::STATUS, s);
    }

    /// The device sets a status error bit (the guest clears it with W1C).
    pub fn set_status_bits(&mut self, bits: u16) {
        let s = self.config.get_u16(offset::STATUS) | (bits & status::W1C);
        self.config.set_u16(offset::STATUS, s);
    }

    /// Walks the capability list for `id`; bounded against loops.
    pub fn find_capability(&self, id: u8) -> Option<usize> {
        let mut ptr = usize::from(self.config.get_u8(offset::CAPABILITIES_PTR) & !3);
        for _ in 0..48 {
            if ptr < 0x40 {
                return None;
            }
            if self.config.get_u8(ptr) == id {
                return Some(ptr);
            }
            ptr = usize::from(self.config.get_u8(ptr + 1) & !3);
        }
        None
    }
}

/// MSI-X (PCI 3.0 §6.8.2) at [`MSIX_CAP`]: table size, enable and function
/// mask, table and PBA in BAR0.
fn define_msix(c: &mut ConfigSpace, params: &PciConfig) {
    c.define(MSIX_CAP, 1, cap_id::MSIX.into(), 0, 0);
    c.define(MSIX_CAP + 1, 1, PCIE_CAP as u32, 0, 0);
    let ctrl = params.msix_vectors - 1;
    let ctrl_writable = msix_ctrl::ENABLE | msix_ctrl::FUNCTION_MASK;
    c.define(MSIX_CAP + 2, 2, ctrl.into(), ctrl_writable.into(), 0);
    c.define(
        MSIX_CAP + 4,
        4,
        params.msix_table.1 | u32::from(params.msix_table.0),
        0,
        0,
    );
    c.define(
        MSIX_CAP + 8,
        4,
        params.msix_pba.1 | u32::from(params.msix_pba.0),
        0,
        0,
    );
}

/// Checks a table/PBA placement; returns its [start, end) in BAR0.
fn check_placement(
    what: &'static str,
    (bir, offset): (u8, u32),
    len: u64,
    bar0: u64,
) -> Result<(u64, u64), PciError> {
    let err = PciError::MsixPlacement { what, bir, offset };
    if bir != 0 || offset % 8 != 0 {
        return Err(err);
    }
    let end = u64::from(offset) + len;
    if end > bar0 {
        return Err(err);
    }
    Ok((u64::from(offset), end))
}

#[cfg(test)]
mod tests {
    use super::*;

    const VENDOR: u16 = 0x7e57;
    const DEVICE: u16 = 0x4e56;
    const CLASS: u32 = 0x01_08_02;

    /// A function laid out as vnvme's NVMe one: 16 KiB BAR0, the MSI-X
    /// table at 8 KiB and the PBA at 12 KiB, 64 vectors.
    fn config() -> PciConfig {
        PciConfig {
            vendor: VENDOR,
            device: DEVICE,
            subsystem_vendor: VENDOR,
            subsystem: DEVICE,
            revision: 1,
            class_code: CLASS,
            bar0_size: 0x4000,
            interrupts: Interrupts::Msix,
            msix_vectors: 64,
            msix_table: (0, 0x2000),
            msix_pba: (0, 0x3000),
        }
    }

    fn f() -> PciFunction {
        PciFunction::new(config()).unwrap()
    }

    fn read32(f: &PciFunction, off: u64) -> u32 {
        let mut b = [0u8; 4];
        f.config_read(off, &mut b);
        u32::from_le_bytes(b)
    }

    fn read16(f: &PciFunction, off: u64) -> u16 {
        let mut b = [0u8; 2];
        f.config_read(off, &mut b);
        u16::from_le_bytes(b)
    }

    #[test]
    fn ids_and_class_code_are_read_only() {
        let mut f = f();
        assert_eq!(read32(&f, 0), u32::from(DEVICE) << 16 | u32::from(VENDOR));
        assert_eq!(read32(&f, 8) >> 8, CLASS);
        f.config_write(0, &[0xff; 4]);
        f.config_write(8, &[0xff; 4]);
        f.config_write(0x2c, &[0xff; 4]);
        assert_eq!(read16(&f, 0), VENDOR);
        assert_eq!(read32(&f, 8) >> 8, CLASS);
        assert_eq!(read16(&f, 0x2e), DEVICE);
        // Header type, BIST, capability pointer, interrupt pin: read-only.
        f.config_write(0x3d, &[4]);
        assert_eq!(read16(&f, 0x3c) >> 8, 1);
        f.config_write(0x3c, &[0x0b]);
        assert_eq!(read16(&f, 0x3c) & 0xff, 0x0b);
    }

    #[test]
    fn command_register_keeps_read_only_bits() {
        let mut f = f();
        f.config_write(4, &0xffffu16.to_le_bytes());
        assert_eq!(
            f.command(),
            command::MEMORY_SPACE
                | command::BUS_MASTER
                | command::PARITY_ERROR_RESPONSE
                | command::SERR_ENABLE
                | command::INTX_DISABLE
        );
        assert!(f.bus_master_enabled() && f.memory_enabled() && f.intx_disabled());
        f.config_write(4, &[0, 0]);
        assert!(!f.bus_master_enabled() && !f.intx_disabled());
    }

    #[test]
    fn status_error_bits_are_write_one_to_clear() {
        let mut f = f();
        f.set_status_bits(status::RECEIVED_MASTER_ABORT | status::DETECTED_PARITY_ERROR);
        f.set_intx_status(true);
        // Writing 0 changes nothing; writing 1 clears only that bit.
        f.config_write(6, &[0, 0]);
        assert_ne!(f.status() & status::RECEIVED_MASTER_ABORT, 0);
        f.config_write(6, &status::RECEIVED_MASTER_ABORT.to_le_bytes());
        assert_eq!(f.status() & status::RECEIVED_MASTER_ABORT, 0);
        assert_ne!(f.status() & status::DETECTED_PARITY_ERROR, 0);
        // Read-only status bits survive a write of all ones.
        f.config_write(6, &0xffffu16.to_le_bytes());
        assert_eq!(
            f.status(),
            status::CAPABILITIES_LIST | status::INTERRUPT_STATUS
        );
        // A dword write to 4 touches command and status at once.
        f.set_status_bits(status::SIGNALED_SYSTEM_ERROR);
        f.config_write(
            4,
            &(u32::from(status::SIGNALED_SYSTEM_ERROR) << 16 | 2).to_le_bytes(),
        );
        assert_eq!(f.status() & status::SIGNALED_SYSTEM_ERROR, 0);
        assert!(f.memory_enabled());
    }

    #[test]
    fn bar0_sizing_returns_the_size_and_address_programs() {
        let mut f = PciFunction::new(PciConfig {
            bar0_size: 0x4000,
            ..config()
        })
        .unwrap();
        assert_eq!(read32(&f, 0x10), BAR_MEM_64);
        f.config_write(0x10, &[0xff; 4]);
        f.config_write(0x14, &[0xff; 4]);
        let lo = read32(&f, 0x10);
        let hi = read32(&f, 0x14);
        assert_eq!(lo & 0xf, BAR_MEM_64, "type bits are read-only");
        let size = !((u64::from(hi) << 32) | u64::from(lo & !0xf)) + 1;
        assert_eq!(size, 0x4000);
        f.config_write(0x10, &0xfebf_0000u32.to_le_bytes());
        f.config_write(0x14, &1u32.to_le_bytes());
        assert_eq!(f.bar0_address(), 0x1_febf_0000);
        // Unaligned byte writes only touch writable bits.
        f.config_write(0x11, &[0xff]);
        assert_eq!(f.bar0_address(), 0x1_febf_c000);
        // No other BAR, no expansion ROM.
        f.config_write(0x18, &[0xff; 4]);
        f.config_write(0x30, &[0xff; 4]);
        assert_eq!(read32(&f, 0x18), 0);
        assert_eq!(read32(&f, 0x30), 0);
    }

    #[test]
    fn capability_chain_finds_pm_msix_and_pcie() {
        let f = f();
        assert_ne!(f.status() & status::CAPABILITIES_LIST, 0);
        let mut seen = Vec::new();
        let mut mb = [0u8; 1];
        f.config_read(0x34, &mut mb);
        let mut ptr = u64::from(mb[0]);
        while ptr != 0 {
            let mut h = [0u8; 2];
            f.config_read(ptr, &mut h);
            seen.push((h[0], ptr));
            ptr = u64::from(h[1]);
        }
        assert_eq!(
            seen,
            vec![
                (cap_id::POWER_MANAGEMENT, PM_CAP as u64),
                (cap_id::MSIX, MSIX_CAP as u64),
                (cap_id::PCI_EXPRESS, PCIE_CAP as u64)
            ]
        );
        assert_eq!(f.find_capability(cap_id::MSIX), Some(MSIX_CAP));
        assert_eq!(f.find_capability(0x05), None);
        // PCIe: version 2, endpoint.
        assert_eq!(read16(&f, PCIE_CAP as u64 + 2), 0x0002);
        // MSI-X table/PBA location and size.
        assert_eq!(
            read16(&f, MSIX_CAP as u64 + 2) & msix_ctrl::TABLE_SIZE_MASK,
            63
        );
        assert_eq!(read32(&f, MSIX_CAP as u64 + 4), 0x2000);
        assert_eq!(read32(&f, MSIX_CAP as u64 + 8), 0x3000);
        // Empty extended capability list.
        assert_eq!(read32(&f, 0x100), 0);
    }

    #[test]
    fn msix_enable_and_function_mask_are_writable_table_size_is_not() {
        let mut f = f();
        assert!(!f.msix_enabled());
        let ctrl = MSIX_CAP as u64 + 2;
        f.config_write(ctrl, &0xffffu16.to_le_bytes());
        assert!(f.msix_enabled() && f.msix_function_masked());
        assert_eq!(read16(&f, ctrl) & msix_ctrl::TABLE_SIZE_MASK, 63);
        f.config_write(ctrl + 1, &[0x80]);
        assert!(f.msix_enabled() && !f.msix_function_masked());
        f.config_write(MSIX_CAP as u64 + 4, &[0xff; 4]);
        assert_eq!(read32(&f, MSIX_CAP as u64 + 4), 0x2000);
        f.reset();
        assert!(!f.msix_enabled());
    }

    #[test]
    fn msi_replaces_msix_in_the_chain_and_takes_the_hosts_writes() {
        use crate::msi::msi_ctrl;
        let mut f = PciFunction::new(PciConfig {
            interrupts: Interrupts::Msi,
            msix_vectors: 32,
            ..config()
        })
        .unwrap();
        assert_eq!(f.find_capability(cap_id::MSIX), None);
        assert_eq!(f.find_capability(cap_id::MSI), Some(MSI_CAP));
        assert_eq!(f.find_capability(cap_id::PCI_EXPRESS), Some(PCIE_CAP));
        let ctrl = MSI_CAP as u64 + 2;
        // 64-bit, Multiple Message Capable 101b (32 vectors), disabled.
        assert_eq!(read16(&f, ctrl), msi_ctrl::ADDR_64 | 5 << 1);
        f.config_write(ctrl, &0xffffu16.to_le_bytes());
        assert_eq!(
            read16(&f, ctrl),
            msi_ctrl::ADDR_64 | 5 << 1 | msi_ctrl::MME_MASK | msi_ctrl::ENABLE
        );
        f.config_write(MSI_CAP as u64 + 4, &0xfee0_0003u32.to_le_bytes());
        assert_eq!(read32(&f, MSI_CAP as u64 + 4), 0xfee0_0000);
        f.config_write(MSI_CAP as u64 + 0xc, &0x4041u16.to_le_bytes());
        assert_eq!(read16(&f, MSI_CAP as u64 + 0xc), 0x4041);
        assert!(!f.msix_enabled(), "MSI's enable bit is not MSI-X's");
        f.reset();
        assert_eq!(read16(&f, ctrl) & msi_ctrl::ENABLE, 0);
    }

    #[test]
    fn msi_vectors_must_be_a_power_of_two_up_to_32() {
        for n in [0, 3, 64] {
            let c = PciConfig {
                interrupts: Interrupts::Msi,
                msix_vectors: n,
                ..config()
            };
            assert_eq!(PciFunction::new(c).unwrap_err(), PciError::MsiVectors(n));
        }
    }

    #[test]
    fn pm_state_is_writable_and_pcie_device_status_is_w1c() {
        let mut f = f();
        f.config_write(PM_CAP as u64 + 4, &[0x03, 0]);
        assert_eq!(read16(&f, PM_CAP as u64 + 4) & 3, 3);
        assert_ne!(
            read16(&f, PM_CAP as u64 + 4) & (1 << 3),
            0,
            "No_Soft_Reset stays"
        );
        f.config_write(PCIE_CAP as u64 + 8, &[0xff, 0xff]);
        assert_eq!(read16(&f, PCIE_CAP as u64 + 8) & 0x8000, 0, "no FLR");
    }

    #[test]
    fn bad_configs_are_refused() {
        let bad = |c: PciConfig| PciFunction::new(c).unwrap_err();
        assert_eq!(
            bad(PciConfig {
                bar0_size: 0x3000,
                ..config()
            }),
            PciError::Bar0Size(0x3000)
        );
        assert_eq!(
            bad(PciConfig {
                msix_vectors: 0,
                ..config()
            }),
            PciError::MsixVectors(0)
        );
        assert!(matches!(
            bad(PciConfig {
                msix_table: (1, 0x2000),
                ..config()
            }),
            PciError::MsixPlacement { .. }
        ));
        assert!(matches!(
            bad(PciConfig {
                msix_pba: (0, 0x3ffc),
                ..config()
            }),
            PciError::MsixPlacement { .. }
        ));
        assert_eq!(
            bad(PciConfig {
                msix_pba: (0, 0x2008),
                ..config()
            }),
            PciError::MsixOverlap
        );
    }
}
