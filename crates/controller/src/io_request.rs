//! NVM I/O commands parsed into typed requests, checked against their
//! namespace before anything runs (Parse, then execute): what command
//! execution ([`crate::io`]) and commands in flight ([`crate::inflight`])
//! both hold.

use vnvme_spec::cdw::{Cdw12ReadWrite, Cdw12WriteZeroes, Cdw13ReadWrite};
use vnvme_spec::status::invalid_field;
use vnvme_spec::{Command, Status};

use crate::namespace::Namespace;
use crate::protection::PiCommand;

/// Read, Write and Compare (§3.2.4, §3.2.6, §3.2.1): SLBA in CDW10-11,
/// NLB (0's based) in CDW12 15:0, FUA in CDW12 bit 30.
///
/// With metadata, `len` (backend bytes: data and metadata of each block,
/// see [`crate::namespace`]) differs from what moves through the PRPs:
/// extended LBAs move all of it there (`data_len == len`); separate
/// metadata moves `data_len` bytes of data through the PRPs (or data SGL)
/// and `meta_len` bytes through the contiguous buffer at MPTR or the
/// metadata SGL it points to (PSDT 10b). With PRACT on
/// a format whose metadata is the PI tuple alone, no metadata moves at
/// all (NVM Command Set 1.0 §5.3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadWrite {
    pub slba: u64,
    pub nlb: u64,
    pub offset: u64,
    pub len: u64,
    /// Bytes through PRP1/PRP2 (bounded by MDTS).
    pub data_len: u64,
    /// Bytes through MPTR (0 without separate metadata; MPTR is then not
    /// read, whatever PSDT says).
    pub meta_len: u64,
    /// Logical block data bytes, for the SMART data unit counters.
    pub block_bytes: u64,
    pub fua: bool,
    /// Directive Type (CDW12 23:20) and Directive Specific (CDW13 31:16):
    /// Write only, 0 for no directive (see [`crate::streams`]).
    pub dtype: u8,
    pub dspec: u16,
    /// The PI fields, on a namespace formatted with protection information.
    pub pi: Option<PiCommand>,
}

impl ReadWrite {
    pub fn parse(cmd: &Command, ns: &Namespace, max_transfer: u64) -> Result<Self, Status> {
        let cdw12 = Cdw12ReadWrite::from(cmd.cdw12);
        // NLB <= 65536 and at most 4160 bytes per block: no overflow.
        let nlb = u64::from(cdw12.nlb_z()) + 1;
        let pi = ns.pi.map(|f| f.parse(cmd)).transpose()?;
        let strip = matches!((ns.pi, pi), (Some(f), Some(c)) if f.strips(c.prinfo));
        let (data_per_block, meta_per_block) = if strip {
            (1u64 << ns.lba_shift, 0)
        } else {
            (ns.data_bytes_per_block(), ns.separate_metadata_per_block())
        };
        let data_len = nlb * data_per_block;
        if data_len > max_transfer {
            return Err(invalid_field());
        }
        let Extent {
            slba,
            nlb,
            offset,
            len,
        } = Extent::of(cmd, ns)?;
        Ok(Self {
            slba,
            nlb,
            offset,
            len,
            data_len,
            meta_len: nlb * meta_per_block,
            block_bytes: nlb << ns.lba_shift,
            fua: cdw12.fua(),
            dtype: cdw12.dtype(),
            dspec: Cdw13ReadWrite::from(cmd.cdw13).dspec(),
            pi,
        })
    }
}

/// Logical blocks of a namespace, and where they lie in its backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Extent {
    pub slba: u64,
    pub nlb: u64,
    pub offset: u64,
    pub len: u64,
}

impl Extent {
    /// `nlb` blocks at `slba`, or LBA Out of Range.
    pub fn new(ns: &Namespace, slba: u64, nlb: u64) -> Result<Self, Status> {
        let (offset, len) = ns.byte_range(slba, nlb)?;
        Ok(Self {
            slba,
            nlb,
            offset,
            len,
        })
    }

    /// The blocks of a command that has SLBA in CDW10-11 and NLB (0's
    /// based) in CDW12 15:0: Read, Write, Compare, Verify (§3.2.5), Write
    /// Uncorrectable (§3.2.7), Write Zeroes.
    pub fn of(cmd: &Command, ns: &Namespace) -> Result<Self, Status> {
        let nlb = u64::from(Cdw12ReadWrite::from(cmd.cdw12).nlb_z()) + 1;
        Self::new(ns, cmd.slba(), nlb)
    }
}

/// Write Zeroes (§3.2.8): SLBA, NLB, DEAC (CDW12 bit 25), FUA (bit 30).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WriteZeroes {
    pub extent: Extent,
    pub deallocate: bool,
    pub fua: bool,
}

impl WriteZeroes {
    pub fn parse(cmd: &Command, ns: &Namespace) -> Result<Self, Status> {
        let cdw12 = Cdw12WriteZeroes::from(cmd.cdw12);
        Ok(Self {
            extent: Extent::of(cmd, ns)?,
            deallocate: cdw12.deac(),
            fua: cdw12.fua(),
        })
    }
}
