//! The BAR0 register file (NVMe Base 2.0 §3.1.4): values, read-only bits,
//! and what a write asks the controller to do. No threads, no queues: the
//! controller acts on the returned [`Action`].

use std::time::Instant;

use vnvme_spec::regs::{css, offset, shutdown, version, Aqa, Cap, Cc, Crto, Csts, NSSR_RESET};

use crate::config::ControllerConfig;

mod saved;
pub(crate) use saved::SavedRegs;

/// CRTO.CRWMT/CRIMT in 500 ms units: `ready_timeout` rounded up (at least
/// 1). This is the host's patience: the controller is ready at once, its
/// namespaces may not be (see [`crate::Readiness`]).
fn ready_timeout_units(config: &ControllerConfig) -> u16 {
    let units = config.ready_timeout.as_millis().div_ceil(500).max(1);
    u16::try_from(units).unwrap_or(u16::MAX)
}
/// Largest memory page size supported: 2^(12 + 4) = 64 KiB.
pub(crate) const MPSMAX: u8 = 4;

/// Something a register write asks of the controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// CC.EN 0 -> 1.
    Enable,
    /// CC.EN 1 -> 0: controller reset.
    Disable,
    /// CC.SHN set to normal or abrupt.
    Shutdown,
    /// NSSR written with "NVMe".
    SubsystemReset,
    /// INTMC cleared mask bits: deliver interrupts held while masked.
    Unmasked,
}

#[derive(Debug)]
pub(crate) struct Regs {
    pub cap: Cap,
    pub vs: u32,
    /// Interrupt mask (INTMS/INTMC), one bit per vector.
    pub intm: u32,
    pub cc: Cc,
    pub csts: Csts,
    pub aqa: Aqa,
    pub asq: u64,
    pub acq: u64,
    pub crto: Crto,
    /// In Controller Ready With Media mode (CC.CRIME = 0 at enable),
    /// CSTS.RDY turns 1 only at this instant, once every attached namespace
    /// that will become ready is (NVMe 2.0 §3.5.4): see [`Regs::settle`].
    pub rdy_at: Option<Instant>,
}

impl Regs {
    pub fn new(config: &ControllerConfig) -> Self {
        let timeout = ready_timeout_units(config);
        let cap = Cap::new()
            .with_mqes_z(config.mqes_z)
            .with_cqr(true)
            // CAP.TO is 8 bits: hosts that read CRTO (CAP.CRMS set) use it.
            .with_to(u8::try_from(timeout).unwrap_or(u8::MAX))
            .with_dstrd(0)
            .with_nssrs(config.nssr)
            // The NVM Command Set, also selectable as the one combination
            // of "all supported I/O command sets" (Identify CNS 1Ch).
            .with_css(css::CAP_NVM | css::CAP_IOCS)
            .with_mpsmin(0)
            .with_mpsmax(MPSMAX)
            .with_crwms(true)
            .with_crims(true);
        Self {
            cap,
            vs: version(2, 0, 0),
            intm: 0,
            cc: Cc::new(),
            csts: Csts::new(),
            aqa: Aqa::new(),
            asq: 0,
            acq: 0,
            crto: Crto::new().with_crwmt(timeout).with_crimt(timeout),
            rdy_at: None,
        }
    }

    /// Sets CSTS.RDY once a pending ready-with-media instant has passed.
    /// Called before registers are read, so RDY needs no timer thread.
    pub fn settle(&mut self, now: Instant) {
        if self.rdy_at.is_some_and(|t| now >= t) {
            self.rdy_at = None;
            self.csts.set_rdy(true);
        }
    }

    /// Reads the dword at `off` (4-aligned). Unknown offsets read 0.
    pub fn read32(&self, off: u64) -> u32 {
        let cap = u64::from(self.cap);
        match off {
            offset::CAP => cap as u32,
            0x04 => (cap >> 32) as u32,
            offset::VS => self.vs,
            offset::INTMS | offset::INTMC => self.intm,
            offset::CC => u32::from(self.cc),
            offset::CSTS => u32::from(self.csts),
            offset::AQA => u32::from(self.aqa),
            offset::ASQ => self.asq as u32,
            0x2C => (self.asq >> 32) as u32,
            offset::ACQ => self.acq as u32,
            0x34 => (self.acq >> 32) as u32,
            offset::CRTO => u32::from(self.crto),
            _ => 0,
        }
    }

    /// Applies a dword write at `off` (4-aligned). Read-only and unknown
    /// registers ignore writes.
    pub fn write32(&mut self, off: u64, value: u32) -> Option<Action> {
        let enabled = self.cc.en();
        match off {
            offset::INTMS => {
                self.intm |= value;
                None
            }
            offset::INTMC => {
                let was = self.intm;
                self.intm &= !value;
                (was & value != 0).then_some(Action::Unmasked)
            }
            offset::CC => self.write_cc(Cc::from(value)),
            offset::CSTS => {
                // NSSRO is write-1-to-clear; everything else is read-only.
                if Csts::from(value).nssro() {
                    self.csts.set_nssro(false);
                }
                None
            }
            // Reserved without CAP.NSSRS: the write is ignored.
            offset::NSSR => {
                (self.cap.nssrs() && value == NSSR_RESET).then_some(Action::SubsystemReset)
            }
            // Admin queue attributes may change only while disabled (§3.1.4.8).
            offset::AQA if !enabled => {
                self.aqa = Aqa::from(value & 0x0FFF_0FFF);
                None
            }
            offset::ASQ if !enabled => {
                self.asq = (self.asq & !0xFFFF_FFFF) | u64::from(value & !0xFFF);
                None
            }
            0x2C if !enabled => {
                self.asq = (self.asq & 0xFFFF_FFFF) | (u64::from(value) << 32);
                None
            }
            offset::ACQ if !enabled => {
                self.acq = (self.acq & !0xFFFF_FFFF) | u64::from(value & !0xFFF);
                None
            }
            0x34 if !enabled => {
                self.acq = (self.acq & 0xFFFF_FFFF) | (u64::from(value) << 32);
                None
            }
            _ => None,
        }
    }

    fn write_cc(&mut self, new: Cc) -> Option<Action> {
        let old = self.cc;
        let mut action = None;
        if old.en() {
            // While enabled, only EN, SHN and the I/O queue entry sizes change
            // (Linux sets IOSQES/IOCQES with EN; others may set them later).
            self.cc = old
                .with_en(new.en())
                .with_shn(new.shn())
                .with_iosqes(new.iosqes())
                .with_iocqes(new.iocqes());
        } else {
            self.cc = new.with_crime(new.crime() && self.cap.crims());
        }
        if new.shn() != shutdown::NONE && old.shn() == shutdown::NONE {
            action = Some(Action::Shutdown);
        } else if new.shn() == shutdown::NONE && old.shn() != shutdown::NONE {
            self.csts.set_shst(shutdown::NONE);
        }
        match (old.en(), new.en()) {
            (false, true) => Some(Action::Enable),
            (true, false) => Some(Action::Disable),
            _ => action,
        }
    }

    /// Checks CC and the admin queue registers at CC.EN 0 -> 1 (§3.5.1);
    /// a failure sets CSTS.CFS. Returns the memory page size.
    pub fn validate_enable(&self) -> Result<u64, &'static str> {
        let cc = self.cc;
        if cc.mps() < self.cap.mpsmin() || cc.mps() > self.cap.mpsmax() {
            return Err("CC.MPS outside CAP.MPSMIN..=MPSMAX");
        }
        if cc.css() != css::NVM && cc.css() != css::ALL_IOCS {
            return Err("CC.CSS selects an unsupported command set");
        }
        if cc.ams() != 0 {
            return Err("CC.AMS selects an unsupported arbitration mechanism");
        }
        if self.aqa.asqs_z() == 0 || self.aqa.acqs_z() == 0 {
            return Err("AQA: admin queues need at least two entries");
        }
        let page = 4096u64 << cc.mps();
        if self.asq & (page - 1) != 0 || self.acq & (page - 1) != 0 {
            return Err("ASQ or ACQ not aligned to the memory page size");
        }
        Ok(page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_only_registers_ignore_writes() {
        let mut r = Regs::new(&ControllerConfig::default());
        let cap = r.read32(offset::CAP);
        r.write32(offset::CAP, 0);
        r.write32(offset::VS, 0);
        r.write32(offset::CSTS, 0xFFFF_FFFF);
        assert_eq!(r.read32(offset::CAP), cap);
        assert_eq!(r.read32(offset::VS), version(2, 0, 0));
        assert_eq!(r.read32(offset::CSTS), 0);
        assert_eq!(r.read32(0x50), 0);
    }

    #[test]
    fn intms_and_intmc_set_and_clear_the_mask() {
        let mut r = Regs::new(&ControllerConfig::default());
        r.write32(offset::INTMS, 0b101);
        assert_eq!(r.read32(offset::INTMC), 0b101);
        assert_eq!(r.write32(offset::INTMC, 0b001), Some(Action::Unmasked));
        assert_eq!(r.read32(offset::INTMS), 0b100);
        assert_eq!(r.write32(offset::INTMC, 0b001), None);
    }

    #[test]
    fn admin_queue_registers_are_frozen_while_enabled() {
        let mut r = Regs::new(&ControllerConfig::default());
        r.write32(offset::ASQ, 0x1234_5FFF);
        assert_eq!(r.asq, 0x1234_5000, "low 12 bits are reserved");
        r.write32(offset::AQA, 0x001F_001F);
        assert_eq!(r.write32(offset::CC, 1), Some(Action::Enable));
        r.write32(offset::ASQ, 0x9000);
        assert_eq!(r.asq, 0x1234_5000);
    }
}
