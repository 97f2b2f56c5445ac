//! Submission and completion queue entries (§4.2, §4.6).

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::status::Status;

/// A 64-byte submission queue entry (§4.2, Figure 88), common layout.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct Command {
    /// Opcode (7:0), FUSE (9:8), PSDT (15:14), Command Identifier (31:16).
    pub cdw0: U32,
    pub nsid: U32,
    pub cdw2: U32,
    pub cdw3: U32,
    /// Metadata Pointer.
    pub mptr: U64,
    /// Data Pointer: PRP Entry 1.
    pub prp1: U64,
    /// Data Pointer: PRP Entry 2.
    pub prp2: U64,
    pub cdw10: U32,
    pub cdw11: U32,
    pub cdw12: U32,
    pub cdw13: U32,
    pub cdw14: U32,
    pub cdw15: U32,
}

const _: () = assert!(core::mem::size_of::<Command>() == 64);

impl Command {
    /// Size of a submission queue entry in bytes (CC.IOSQES = 6).
    pub const SIZE: usize = 64;

    /// A command with the given opcode and command identifier, all else zero.
    pub fn new(opcode: u8, cid: u16) -> Self {
        Self {
            cdw0: U32::new(u32::from(opcode) | (u32::from(cid) << 16)),
            ..Self::default()
        }
    }

    pub fn opcode(&self) -> u8 {
        self.cdw0.get() as u8
    }

    /// Fused Operation (00b normal).
    pub fn fuse(&self) -> u8 {
        ((self.cdw0.get() >> 8) & 0x3) as u8
    }

    /// PRP or SGL for Data Transfer (00b PRPs).
    pub fn psdt(&self) -> u8 {
        ((self.cdw0.get() >> 14) & 0x3) as u8
    }

    /// Sets PSDT ([`crate::sgl::psdt`]).
    pub fn set_psdt(&mut self, psdt: u8) {
        let cdw0 = (self.cdw0.get() & !(0x3 << 14)) | (u32::from(psdt & 0x3) << 14);
        self.cdw0 = U32::new(cdw0);
    }

    /// Sets SGL Entry 1 (the data pointer's 16 bytes) to `sgl1`, for PSDT
    /// 01b or 10b.
    pub fn set_sgl1(&mut self, sgl1: &crate::sgl::Descriptor) {
        let b = sgl1.to_bytes();
        let (lo, hi) = b.split_at(8);
        let word = |s: &[u8]| {
            let mut w = [0u8; 8];
            w.copy_from_slice(s);
            u64::from_le_bytes(w)
        };
        self.prp1 = U64::new(word(lo));
        self.prp2 = U64::new(word(hi));
    }

    pub fn cid(&self) -> u16 {
        (self.cdw0.get() >> 16) as u16
    }

    pub fn set_cid(&mut self, cid: u16) {
        self.cdw0 = U32::new((self.cdw0.get() & 0xFFFF) | (u32::from(cid) << 16));
    }

    /// Starting LBA of the NVM command set's block commands: CDW10 holds
    /// bits 31:0, CDW11 bits 63:32 (NVM Command Set 1.0 §3.2.6).
    #[inline]
    pub fn slba(&self) -> u64 {
        u64::from(self.cdw10.get()) | (u64::from(self.cdw11.get()) << 32)
    }

    pub fn set_slba(&mut self, slba: u64) {
        self.cdw10 = U32::new(slba as u32);
        self.cdw11 = U32::new((slba >> 32) as u32);
    }

    /// Command dword `n` (0..=15) as the controller sees it.
    pub fn cdw(&self, n: usize) -> u32 {
        let words: &[U32; 16] = zerocopy::transmute_ref!(self);
        words.get(n).map_or(0, |w| w.get())
    }

    /// Parses a command from the first 64 bytes of `bytes`.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        Self::read_from_prefix(bytes).ok().map(|(c, _)| c)
    }
}

/// A 16-byte completion queue entry (§4.6, Figure 91).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct Completion {
    /// Command specific dword 0.
    pub dw0: U32,
    /// Command specific dword 1.
    pub dw1: U32,
    /// SQ Head Pointer (15:0), SQ Identifier (31:16).
    pub dw2: U32,
    /// Command Identifier (15:0), Phase Tag (16), Status (31:17).
    pub dw3: U32,
}

const _: () = assert!(core::mem::size_of::<Completion>() == 16);

impl Completion {
    /// Size of a completion queue entry in bytes (CC.IOCQES = 4).
    pub const SIZE: usize = 16;

    pub fn new(dw0: u32, sq_head: u16, sqid: u16, cid: u16, phase: bool, status: Status) -> Self {
        Self {
            dw0: U32::new(dw0),
            dw1: U32::new(0),
            dw2: U32::new(u32::from(sq_head) | (u32::from(sqid) << 16)),
            dw3: U32::new(
                u32::from(cid) | (u32::from(phase) << 16) | (u32::from(status.raw()) << 17),
            ),
        }
    }

    pub fn sq_head(&self) -> u16 {
        self.dw2.get() as u16
    }

    pub fn sqid(&self) -> u16 {
        (self.dw2.get() >> 16) as u16
    }

    pub fn cid(&self) -> u16 {
        self.dw3.get() as u16
    }

    pub fn phase(&self) -> bool {
        self.dw3.get() & (1 << 16) != 0
    }

    pub fn status(&self) -> Status {
        Status::from_raw((self.dw3.get() >> 17) as u16)
    }
}

/// PRP entry helpers (§4.1.1).
pub mod prp {
    /// Size of one PRP list entry.
    pub const ENTRY_SIZE: u64 = 8;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::Status;

    #[test]
    fn command_fields_round_trip_through_bytes() {
        let mut c = Command::new(0x02, 0xBEEF);
        c.nsid = U32::new(1);
        c.prp1 = U64::new(0x1000);
        c.cdw10 = U32::new(7);
        let bytes = c.as_bytes().to_vec();
        assert_eq!(bytes[0], 0x02);
        assert_eq!(&bytes[2..4], &[0xEF, 0xBE]);
        assert_eq!(&bytes[24..32], &0x1000u64.to_le_bytes());
        let back = Command::from_slice(&bytes).unwrap();
        assert_eq!(back, c);
        assert_eq!(back.cdw(10), 7);
        assert_eq!(back.cdw(1), 1);
        assert_eq!(back.cdw(16), 0);
    }

    #[test]
    fn slba_spans_cdw10_low_and_cdw11_high() {
        let mut c = Command::new(0x02, 1);
        c.set_slba(0x1234_5678_9ABC_DEF0);
        assert_eq!((c.cdw10.get(), c.cdw11.get()), (0x9ABC_DEF0, 0x1234_5678));
        assert_eq!(c.slba(), 0x1234_5678_9ABC_DEF0);
    }

    #[test]
    fn completion_packs_phase_and_status() {
        let s = Status::INVALID_FIELD.with_dnr(true);
        let c = Completion::new(5, 3, 1, 42, true, s);
        assert_eq!(c.cid(), 42);
        assert!(c.phase());
        assert_eq!(c.status(), s);
        assert_eq!(c.sq_head(), 3);
        assert_eq!(c.sqid(), 1);
        assert_eq!(c.dw3.get() >> 17 & 0xFF, 0x02);
        assert_eq!(c.dw3.get() >> 31, 1, "DNR is bit 31 of DW3");
    }
}
