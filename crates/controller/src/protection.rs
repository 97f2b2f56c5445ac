//! End-to-end data protection (NVM Command Set 1.0 §5.3): the protection
//! information (PI) a namespace formatted with a PI type keeps in each
//! block's metadata, generated (PRACT) and checked (PRCHK) on the way in
//! and out.
//!
//! The PI tuples ([`vnvme_spec::pi`]) lie at the first or the last bytes
//! of the metadata (DPS.PIP). The guard covers the block's data, and with
//! PI in the last bytes the metadata bytes before it (§5.3.1.1).
//!
//! A block never written since the namespace was formatted, or zeroed or
//! deallocated since, holds a PI tuple of zeroes: it reads as all FFh
//! (the escape values, so no check applies), as a deallocated block does
//! with DLFEAT bit 3 clear. The one written tuple that is all zeroes, of
//! a block of zeroes with tag 0 and reference tag 0 and a 16-bit guard,
//! reads back as FFh too.

use vnvme_blockdev::ReadFill;
use vnvme_spec::cdw::{Cdw12ReadWrite, Cdw15ReadWrite, Prinfo};
use vnvme_spec::pi::GuardCrc;
pub use vnvme_spec::pi::{Guard, Tuple};
use vnvme_spec::{Command, Status};

/// Protection Information type (DPS.PIT).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PiType {
    /// The reference tag is the LBA (its low 32 or 48 bits).
    Type1,
    /// The reference tag counts up from the command's initial reference tag.
    Type2,
    /// The reference tag is not checked; the application tag and the
    /// reference tag together are the escape.
    Type3,
}

impl PiType {
    /// The type of DPS.PIT or Format NVM PI value 1 to 3.
    pub fn from_pit(pit: u8) -> Option<Self> {
        match pit {
            1 => Some(PiType::Type1),
            2 => Some(PiType::Type2),
            3 => Some(PiType::Type3),
            _ => None,
        }
    }

    pub fn pit(self) -> u8 {
        match self {
            PiType::Type1 => 1,
            PiType::Type2 => 2,
            PiType::Type3 => 3,
        }
    }
}

/// How a namespace protects its blocks: chosen in the configuration
/// (`pi=`, `pil=`) or by Format NVM (PI, PIL).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Protection {
    pub pi_type: PiType,
    /// PI in the first bytes of the metadata (PIL = 1), else the last.
    pub first: bool,
}

/// A namespace's protection: its settings on its format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PiFormat {
    pub pi_type: PiType,
    pub guard: Guard,
    pub first: bool,
    /// Logical block data bytes.
    lba: usize,
    /// Metadata bytes per block (at least the tuple).
    ms: usize,
}

/// The PI fields of a Read, Write or Compare: PRINFO, the initial
/// reference tag (CDW14, and CDW3 15:0 above it for 48-bit tags) and the
/// application tag and mask (CDW15).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PiCommand {
    pub prinfo: Prinfo,
    pub ilbrt: u64,
    pub lbat: u16,
    pub lbatm: u16,
}

impl PiFormat {
    /// `protection` on blocks of `lba` data bytes and `ms` metadata bytes
    /// guarded by `guard`; `None` if the tuple does not fit the metadata.
    pub fn new(protection: Protection, guard: Guard, lba: u32, ms: u16) -> Option<Self> {
        (ms >= guard.pi_size()).then_some(Self {
            pi_type: protection.pi_type,
            guard,
            first: protection.first,
            lba: lba as usize,
            ms: usize::from(ms),
        })
    }

    /// Where the tuple starts in the metadata.
    fn offset(&self) -> usize {
        if self.first {
            0
        } else {
            self.ms - usize::from(self.guard.pi_size())
        }
    }

    /// With PRACT and metadata that is the tuple alone, the metadata does
    /// not move between the host and the controller (§5.3.2.1, §5.3.2.2).
    pub fn strips(&self, prinfo: Prinfo) -> bool {
        prinfo.pract() && self.ms == usize::from(self.guard.pi_size())
    }

    /// The PI fields of `cmd`, checked against the namespace: with a Type 1
    /// reference tag check, the initial reference tag must be the SLBA
    /// (Invalid Protection Information).
    pub fn parse(&self, cmd: &Command) -> Result<PiCommand, Status> {
        let prinfo = Prinfo::from(Cdw12ReadWrite::from(cmd.cdw12).prinfo());
        let mut ilbrt = u64::from(cmd.cdw14.get());
        if self.guard == Guard::Crc64 {
            ilbrt |= u64::from(cmd.cdw3.get() & 0xFFFF) << 32;
        }
        let cdw15 = Cdw15ReadWrite::from(cmd.cdw15.get());
        let mask = self.guard.ref_mask();
        if self.pi_type == PiType::Type1 && prinfo.prchk_ref() && ilbrt != cmd.slba() & mask {
            return Err(Status::INVALID_PROTECTION_INFORMATION.with_dnr(true));
        }
        Ok(PiCommand {
            prinfo,
            ilbrt,
            lbat: cdw15.lbat(),
            lbatm: cdw15.lbatm(),
        })
    }

    /// Bytes of a block in the backend: data, then metadata.
    fn stride(&self) -> usize {
        self.lba + self.ms
    }

    /// Bytes of a block the guard covers: the data, and with PI last the
    /// metadata before it.
    fn covered(&self) -> usize {
        self.lba + self.offset()
    }

    /// The guard of one block (data and metadata, backend layout).
    fn guard_of(&self, block: &[u8]) -> u64 {
        self.guard.checksum(&block[..self.covered()])
    }

    /// The reference tag of block `i` of the command.
    fn ref_tag(&self, pc: &PiCommand, i: u64) -> u64 {
        match self.pi_type {
            PiType::Type1 | PiType::Type2 => pc.ilbrt.wrapping_add(i) & self.guard.ref_mask(),
            PiType::Type3 => pc.ilbrt & self.guard.ref_mask(),
        }
    }

    /// A write's blocks in `media` (backend layout, whole blocks): with
    /// PRACT the controller generates each tuple, else it checks those
    /// PRCHK names.
    pub fn on_write(&self, pc: &PiCommand, media: &mut [u8]) -> Result<(), Status> {
        let stride = self.stride();
        for (i, block) in (0u64..).zip(media.chunks_exact_mut(stride)) {
            if pc.prinfo.pract() {
                let tuple = Tuple {
                    guard: self.guard_of(block),
                    app: pc.lbat,
                    reference: self.ref_tag(pc, i),
                };
                let at = self.lba + self.offset();
                tuple.store(self.guard, &mut block[at..]);
            } else {
                self.check(pc, block, i, None)?;
            }
        }
        Ok(())
    }

    /// Checks a read's blocks in `media` as PRCHK says; a tuple of zeroes
    /// (a block never written) reads as FFh, so it is not checked. Whether
    /// there was such a tuple: [`Self::show_unwritten`] makes it FFh for
    /// the host.
    ///
    /// `guards`: the blocks' guards if [`GuardFill`] computed them as the
    /// backend read them (else they are computed here).
    pub fn on_read(&self, pc: &PiCommand, media: &[u8], guards: &[u64]) -> Result<bool, Status> {
        let stride = self.stride();
        let known = guards.len() == media.len() / stride;
        let mut unwritten = false;
        for (i, block) in (0u64..).zip(media.chunks_exact(stride)) {
            if self.tuple_of(block).iter().all(|&b| b == 0) {
                unwritten = true;
            } else {
                let guard = guards.get(i as usize).filter(|_| known);
                self.check(pc, block, i, guard.copied())?;
            }
        }
        Ok(unwritten)
    }

    /// Turns the tuples of zeroes in `media` into FFh.
    pub fn show_unwritten(&self, media: &mut [u8]) {
        let stride = self.stride();
        let (at, size) = (self.lba + self.offset(), usize::from(self.guard.pi_size()));
        for block in media.chunks_exact_mut(stride) {
            let tuple = &mut block[at..at + size];
            if tuple.iter().all(|&b| b == 0) {
                tuple.fill(0xFF);
            }
        }
    }

    /// The PI tuple of one block (backend layout).
    fn tuple_of<'b>(&self, block: &'b [u8]) -> &'b [u8] {
        let at = self.lba + self.offset();
        &block[at..at + usize::from(self.guard.pi_size())]
    }

    /// Checks block `i` of the command as PRCHK says, unless its tags are
    /// the escape values (application tag FFFFh; for Type 3 with a
    /// reference tag of all ones as well). `guard`: the block's, if known.
    fn check(
        &self,
        pc: &PiCommand,
        block: &[u8],
        i: u64,
        guard: Option<u64>,
    ) -> Result<(), Status> {
        let prchk = pc.prinfo;
        if !(prchk.prchk_guard() || prchk.prchk_app() || prchk.prchk_ref()) {
            return Ok(());
        }
        let at = self.lba + self.offset();
        let t = Tuple::load(self.guard, &block[at..]);
        let escape = t.app == 0xFFFF
            && (self.pi_type != PiType::Type3 || t.reference == self.guard.ref_mask());
        if escape {
            return Ok(());
        }
        if prchk.prchk_guard() && t.guard != guard.unwrap_or_else(|| self.guard_of(block)) {
            return Err(Status::GUARD_CHECK_ERROR.with_dnr(true));
        }
        if prchk.prchk_app() && (t.app ^ pc.lbat) & pc.lbatm != 0 {
            return Err(Status::APPLICATION_TAG_CHECK_ERROR.with_dnr(true));
        }
        if prchk.prchk_ref() && self.pi_type != PiType::Type3 && t.reference != self.ref_tag(pc, i)
        {
            return Err(Status::REFERENCE_TAG_CHECK_ERROR.with_dnr(true));
        }
        Ok(())
    }
}

/// Computes the guard of each block of a read in the copy that brings it
/// from the backend ([`vnvme_blockdev::BlockDevice::read_with`]): the
/// backend's memory is read once, and the CRC's arithmetic runs while the
/// copy waits on it. (A 4 KiB block copied from a RAM namespace, then
/// checked, took 240-300 ns more than the copy alone; checked in the copy,
/// 160-210 ns more.)
pub(crate) struct GuardFill {
    format: PiFormat,
    /// Bytes of the current block seen so far.
    at: usize,
    crc: GuardCrc,
    guards: Vec<u64>,
}

impl GuardFill {
    /// Guards into `guards` (cleared), for blocks of `format`.
    pub fn new(format: PiFormat, mut guards: Vec<u64>) -> Self {
        guards.clear();
        GuardFill {
            format,
            at: 0,
            crc: GuardCrc::new(format.guard),
            guards,
        }
    }

    /// The guards of the whole blocks seen, in order.
    pub fn into_guards(self) -> Vec<u64> {
        self.guards
    }

    /// Takes the next bytes of the read, copying them to `dst` if given.
    fn take(&mut self, mut src: &[u8], mut dst: Option<&mut [u8]>) {
        let (covered, stride) = (self.format.covered(), self.format.stride());
        while !src.is_empty() {
            let end = if self.at < covered { covered } else { stride };
            let n = (end - self.at).min(src.len());
            let (part, rest) = src.split_at(n);
            let out = dst.take().map(|d| d.split_at_mut(n)).map(|(out, more)| {
                dst = Some(more);
                out
            });
            match out {
                Some(out) if self.at < covered => self.crc.update_copy(part, out),
                Some(out) => out.copy_from_slice(part),
                None if self.at < covered => self.crc.update(part),
                None => {}
            }
            self.at += n;
            if self.at == covered {
                self.guards.push(self.crc.finalize());
                self.crc = GuardCrc::new(self.format.guard);
            }
            if self.at == stride {
                self.at = 0;
            }
            src = rest;
        }
    }
}

impl ReadFill for GuardFill {
    fn copy(&mut self, src: &[u8], dst: &mut [u8]) {
        self.take(src, Some(dst));
    }

    fn filled(&mut self, buf: &[u8]) {
        self.take(buf, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Numbers that look random, the same on every run (xorshift64).
    fn noise(seed: u64, n: usize) -> Vec<u64> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            })
            .collect()
    }

    #[test]
    fn guard_fill_computes_each_blocks_guard_in_pieces_cut_anywhere() {
        let formats = [
            (Guard::Crc16, 512, 8, false),
            (Guard::Crc16, 4096, 8, false),
            (Guard::Crc16, 4096, 64, false),
            (Guard::Crc16, 4096, 64, true),
            (Guard::Crc64, 4096, 16, false),
            (Guard::Crc64, 4096, 64, false),
        ];
        for (seed, (guard, lba, ms, first)) in (1u64..).zip(formats) {
            let protection = Protection {
                pi_type: PiType::Type1,
                first,
            };
            let format = PiFormat::new(protection, guard, lba, ms).unwrap();
            let stride = lba as usize + usize::from(ms);
            let media: Vec<u8> = noise(seed, 3 * stride).iter().map(|&x| x as u8).collect();
            let want: Vec<u64> = media.chunks(stride).map(|b| format.guard_of(b)).collect();
            for trial in 0..50u64 {
                let mut cuts: Vec<usize> = noise(seed * 1000 + trial, 4)
                    .iter()
                    .map(|&x| x as usize % media.len())
                    .collect();
                cuts.sort_unstable();
                let mut fill = GuardFill::new(format, vec![7]);
                let mut copy = vec![0u8; media.len()];
                let mut start = 0;
                for (i, end) in cuts.into_iter().chain([media.len()]).enumerate() {
                    // Copies and pieces already in place, as a backend mixes them.
                    if i % 2 == 0 {
                        fill.copy(&media[start..end], &mut copy[start..end]);
                    } else {
                        copy[start..end].copy_from_slice(&media[start..end]);
                        fill.filled(&copy[start..end]);
                    }
                    start = end;
                }
                assert_eq!(copy, media, "{guard:?} {lba}+{ms}: copied");
                assert_eq!(
                    fill.into_guards(),
                    want,
                    "{guard:?} {lba}+{ms} first {first}"
                );
            }
        }
    }
}
