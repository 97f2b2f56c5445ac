//! I/O on namespaces formatted with protection information (NVM Command
//! Set 1.0 §5.3): the PI fields of a Read or Write, where its metadata
//! goes, and the calls that carry PI the driver makes and checks itself
//! ([`crate::pi`]).
//!
//! The block API ([`IoQueue::read`], [`IoQueue::write`]) sets PRACT on
//! every format: the controller generates the PI of a write and checks
//! that of a read, so callers of the block API need not know the format.
//! The driver does not generate PI itself there: it would cost a CRC pass
//! over every block on the host as well as on the controller, for what
//! PRACT gives, and a read would still need the metadata back. Where the
//! metadata is the tuple alone, PRACT moves none (§5.3.2). Where it is
//! more, the metadata still moves, through buffers of the queue's own:
//! writes read zeroes (the bytes beside the tuple, which the controller
//! guards and stores as given) from one buffer only the controller reads,
//! and reads write into another nobody reads, so commands in flight share
//! them and none needs a buffer of its own.

use std::sync::Arc;

use vnvme_spec::cdw::{Cdw12ReadWrite, Prinfo};
use vnvme_spec::command::Command;
use vnvme_spec::identify::sgls;
use vnvme_spec::sgl::{psdt, Descriptor};
use vnvme_spec::{Completion, NvmOpcode};

use crate::access::{DeviceAccess, DmaBuffer};
use crate::error::Error;
use crate::pi::NsProtection;

use super::IoQueue;

/// How [`IoQueue::write_protected`] and [`IoQueue::read_protected`] point
/// the controller at their metadata buffer (CDW0 PSDT, MPTR).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetadataPointer {
    /// PSDT 00b: PRPs for the data, MPTR the metadata buffer's address.
    #[default]
    Contiguous,
    /// PSDT 10b: an SGL Data Block for the data; MPTR the address of one
    /// Data Block descriptor of the whole metadata buffer.
    Sgl,
    /// PSDT 10b, MPTR the address of a Last Segment descriptor that leads
    /// to one Data Block per logical block's metadata (as a host whose
    /// metadata is scattered would send it).
    SglPerBlock,
}

/// The queue's memory for metadata it moves on its own.
#[derive(Debug)]
pub(super) struct MetaBuffers {
    access: Arc<dyn DeviceAccess>,
    /// Zeroes, read by the controller as a PRACT write's metadata.
    zeroes: Option<DmaBuffer>,
    /// Written by the controller with a PRACT read's metadata; never read.
    sink: Option<DmaBuffer>,
    /// Metadata SGL descriptors of the one protected call waiting: those
    /// calls are synchronous, so one area serves them all (a call that
    /// did not see its completion retires it: [`abandon`](Self::abandon)).
    sgl: Option<DmaBuffer>,
    /// Data and metadata of the one protected call waiting on a namespace
    /// with extended LBAs, interleaved as the controller moves them.
    bounce: Option<DmaBuffer>,
    /// Buffers outgrown or abandoned: a command still in flight (or one
    /// that timed out) may point into them, so they live as long as the
    /// queue.
    retired: Vec<DmaBuffer>,
    /// Identify Controller SGLS.
    sgls: u32,
    pub mode: MetadataPointer,
}

impl MetaBuffers {
    pub fn new(access: Arc<dyn DeviceAccess>, sgls: u32) -> Self {
        Self {
            access,
            zeroes: None,
            sink: None,
            sgl: None,
            bounce: None,
            retired: Vec::new(),
            sgls,
            mode: MetadataPointer::Contiguous,
        }
    }

    /// `len` bytes at least of `slot`, allocated (zeroed) or grown by
    /// doubling on first need.
    fn grow(&mut self, which: Slot, len: usize) -> Result<DmaBuffer, Error> {
        let access = Arc::clone(&self.access);
        let slot = match which {
            Slot::Zeroes => &mut self.zeroes,
            Slot::Sink => &mut self.sink,
            Slot::Sgl => &mut self.sgl,
            Slot::Bounce => &mut self.bounce,
        };
        if let Some(b) = slot.as_ref().filter(|b| b.len() >= len) {
            return Ok(b.clone());
        }
        let size = len.max(slot.as_ref().map_or(0, |b| b.len() * 2)).max(4096);
        let fresh = access.dma_alloc(size)?;
        fresh.fill(0, size, 0)?;
        if let Some(old) = slot.replace(fresh.clone()) {
            self.retired.push(old);
        }
        Ok(fresh)
    }

    /// A protected call ended without its completion (a timeout): its
    /// command may still run, following the descriptors and filling the
    /// bounce buffer it was given. The next call gets areas of its own, or
    /// that late command would put its metadata into the next caller's
    /// buffer after that call returned.
    fn abandon(&mut self) {
        self.retired.extend(self.sgl.take());
        self.retired.extend(self.bounce.take());
    }
}

#[derive(Clone, Copy)]
enum Slot {
    Zeroes,
    Sink,
    Sgl,
    Bounce,
}

/// Every check that applies to `pi`'s type, and PRACT unless the command
/// carries PI of the driver's (`own_app`, the application tag): then the
/// controller generates the PI of a write and checks that of a read. The
/// initial reference tag is the LBA (Type 1 requires it; Type 2 takes any,
/// Type 3 checks none), its upper 16 bits in CDW3 for 48-bit tags.
pub(super) fn protect(
    cmd: &mut Command,
    pi: NsProtection,
    lba: u64,
    nlb_z: u16,
    own_app: Option<u16>,
) {
    let prinfo = Prinfo::new()
        .with_pract(own_app.is_none())
        .with_prchk_guard(true)
        .with_prchk_app(own_app.is_some())
        .with_prchk_ref(pi.pit != 3);
    if let Some(app) = own_app {
        // ELBAT, and ELBATM: every bit.
        cmd.cdw15 = (u32::from(app) | 0xFFFF << 16).into();
    }
    cmd.cdw12 = Cdw12ReadWrite::new()
        .with_nlb_z(nlb_z)
        .with_prinfo(prinfo.into_bits())
        .into();
    cmd.cdw14 = (lba as u32).into();
    if pi.guard_64 {
        cmd.cdw3 = ((lba >> 32) as u32 & 0xFFFF).into();
    }
}

/// Where a Read or Write's metadata is.
pub(super) enum Meta<'a> {
    /// None moves apart from the data (no PI, or PRACT on a tuple alone,
    /// or extended LBAs).
    None,
    /// The queue's own buffers (PRACT, metadata beyond the tuple).
    Queue,
    /// The caller's, with PI of its own.
    Own(&'a DmaBuffer),
}

impl IoQueue {
    /// Chooses how [`write_protected`](Self::write_protected) and
    /// [`read_protected`](Self::read_protected) pass their metadata; the
    /// SGL ways need a controller that offers a metadata SGL (Identify
    /// Controller SGLS bit 19).
    pub fn set_metadata_pointer(&mut self, mode: MetadataPointer) -> Result<(), Error> {
        if mode != MetadataPointer::Contiguous && self.meta.sgls & sgls::MSDS == 0 {
            return Err(Error::Unsupported(
                "the controller takes no metadata SGL (SGLS bit 19)".into(),
            ));
        }
        self.meta.mode = mode;
        Ok(())
    }

    /// Points `cmd` (`cid`'s) at `len` bytes of data in `buf` and `meta_len`
    /// bytes of metadata where `meta` says.
    pub(super) fn set_pointers(
        &mut self,
        cmd: &mut Command,
        cid: u16,
        (buf, len): (&DmaBuffer, usize),
        meta: Meta<'_>,
        meta_len: usize,
    ) -> Result<(), Error> {
        if meta_len > self.max_transfer() {
            // What a hostile device's MS would make us allocate.
            return Err(Error::TransferTooLarge {
                len: meta_len,
                max: self.max_transfer(),
            });
        }
        let own = match meta {
            Meta::None => None,
            Meta::Queue => {
                let write = cmd.opcode() == NvmOpcode::WRITE.0;
                let slot = if write { Slot::Zeroes } else { Slot::Sink };
                cmd.mptr = self.meta.grow(slot, meta_len)?.iova().into();
                None
            }
            Meta::Own(m) if self.meta.mode == MetadataPointer::Contiguous => {
                cmd.mptr = m.iova().into();
                None
            }
            Meta::Own(m) => Some(m),
        };
        let Some(m) = own else {
            return self.qp.set_data(cmd, cid, buf, len);
        };
        if len > buf.len() {
            return Err(Error::BufferTooSmall {
                len,
                buffer: buf.len(),
            });
        }
        if len > self.max_transfer() {
            return Err(Error::TransferTooLarge {
                len,
                max: self.max_transfer(),
            });
        }
        // Both lengths are bounded by MDTS: they fit a descriptor's 32 bits.
        let u32_of = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        cmd.set_psdt(psdt::SGL_MPTR_SGL);
        cmd.set_sgl1(&Descriptor::data_block(buf.iova(), u32_of(len)));
        let mut descs = Vec::new();
        if self.meta.mode == MetadataPointer::SglPerBlock {
            let nblocks = usize::from(Cdw12ReadWrite::from(cmd.cdw12).nlb_z()) + 1;
            let ms = meta_len / nblocks;
            let area = self
                .meta
                .grow(Slot::Sgl, (nblocks + 1) * Descriptor::SIZE)?;
            // The Last Segment descriptor MPTR points to, its segment right
            // behind it (as Linux lays a metadata SGL out).
            let first = area.iova() + Descriptor::SIZE as u64;
            let head = Descriptor::segment(first, u32_of(nblocks * Descriptor::SIZE), true);
            descs.extend_from_slice(&head.to_bytes());
            for i in 0..nblocks {
                let d = Descriptor::data_block(m.iova() + (i * ms) as u64, u32_of(ms));
                descs.extend_from_slice(&d.to_bytes());
            }
        } else {
            descs.extend_from_slice(&Descriptor::data_block(m.iova(), u32_of(meta_len)).to_bytes());
        }
        let area = self.meta.grow(Slot::Sgl, descs.len())?;
        area.write_bytes(0, &descs)?;
        cmd.mptr = area.iova().into();
        Ok(())
    }

    /// Writes `nblocks` at `lba` from `buf` with protection information
    /// the driver generates into `meta` (application tag `app`, reference
    /// tags from the LBA), which the controller checks; waits. `meta` holds
    /// each block's whole metadata (MS bytes): the tuple is written at its
    /// place there, and the other bytes are sent as the caller left them
    /// (guarded, before a last-placed tuple).
    pub fn write_protected(
        &mut self,
        nsid: u32,
        lba: u64,
        (buf, meta): (&DmaBuffer, &DmaBuffer),
        nblocks: u32,
        app: u16,
    ) -> Result<Completion, Error> {
        let (pi, lba_size) = self.protection_of(nsid, nblocks, meta)?;
        let mut m = vec![0; nblocks as usize * usize::from(pi.ms)];
        meta.read_bytes(0, &mut m)?;
        let data = self.data_of(buf, nblocks, lba_size)?;
        pi.generate(&data, lba_size, &mut m, lba, app)?;
        meta.write_bytes(0, &m)?;
        let target = if pi.extended {
            // Each block's metadata right after its data (FLBAS bit 4).
            let ms = usize::from(pi.ms);
            let mut both = Vec::with_capacity(data.len() + m.len());
            for (d, md) in data.chunks_exact(lba_size).zip(m.chunks_exact(ms)) {
                both.extend_from_slice(d);
                both.extend_from_slice(md);
            }
            let bounce = self.meta.grow(Slot::Bounce, both.len())?;
            bounce.write_bytes(0, &both)?;
            bounce
        } else {
            buf.clone()
        };
        let cid = self.enqueue_rw_pi(
            NvmOpcode::WRITE,
            nsid,
            lba,
            nblocks,
            &target,
            Some((meta, app)),
        )?;
        self.ring()?;
        self.complete_protected(cid, NvmOpcode::WRITE)
    }

    /// Reads `nblocks` at `lba` into `buf` and their metadata (MS bytes a
    /// block, PI included) into `meta`, checked by the controller and then
    /// here against the data, `app` and the LBA; waits.
    pub fn read_protected(
        &mut self,
        nsid: u32,
        lba: u64,
        (buf, meta): (&mut DmaBuffer, &mut DmaBuffer),
        nblocks: u32,
        app: u16,
    ) -> Result<Completion, Error> {
        let (pi, lba_size) = self.protection_of(nsid, nblocks, meta)?;
        let ms = usize::from(pi.ms);
        let (data_len, meta_len) = (nblocks as usize * lba_size, nblocks as usize * ms);
        if buf.len() < data_len {
            return Err(Error::BufferTooSmall {
                len: data_len,
                buffer: buf.len(),
            });
        }
        let target = if pi.extended {
            self.meta.grow(Slot::Bounce, data_len + meta_len)?
        } else {
            buf.clone()
        };
        let cid = self.enqueue_rw_pi(
            NvmOpcode::READ,
            nsid,
            lba,
            nblocks,
            &target,
            Some((meta, app)),
        )?;
        self.ring()?;
        let cqe = self.complete_protected(cid, NvmOpcode::READ)?;
        let (mut data, mut m) = (vec![0; data_len], vec![0; meta_len]);
        if pi.extended {
            let mut both = vec![0; data_len + meta_len];
            target.read_bytes(0, &mut both)?;
            let blocks = both.chunks_exact(lba_size + ms);
            for ((block, d), md) in blocks
                .zip(data.chunks_exact_mut(lba_size))
                .zip(m.chunks_exact_mut(ms))
            {
                d.copy_from_slice(&block[..lba_size]);
                md.copy_from_slice(&block[lba_size..]);
            }
            buf.write_bytes(0, &data)?;
            meta.write_bytes(0, &m)?;
        } else {
            buf.read_bytes(0, &mut data)?;
            meta.read_bytes(0, &mut m)?;
        }
        pi.verify(&data, lba_size, &m, lba, app)?;
        Ok(cqe)
    }

    /// Waits for `cid` of a protected call; one that ends without its
    /// completion leaves the queue's shared areas to its command.
    fn complete_protected(&mut self, cid: u16, opcode: NvmOpcode) -> Result<Completion, Error> {
        self.complete(cid, opcode).inspect_err(|e| {
            if !matches!(e, Error::IoCommand { .. }) {
                self.meta.abandon();
            }
        })
    }

    /// The protection of `nsid` and its block size, or why there is none
    /// or `meta` cannot hold `nblocks` blocks' metadata.
    fn protection_of(
        &mut self,
        nsid: u32,
        nblocks: u32,
        meta: &DmaBuffer,
    ) -> Result<(NsProtection, usize), Error> {
        self.sync_namespaces();
        let ns = self.namespace(nsid)?;
        let pi = ns.protection.ok_or_else(|| {
            Error::InvalidRequest(format!("namespace {nsid} has no protection information"))
        })?;
        // The controller moves this much at MPTR.
        let need = nblocks as usize * usize::from(pi.ms);
        if meta.len() < need {
            return Err(Error::BufferTooSmall {
                len: need,
                buffer: meta.len(),
            });
        }
        Ok((pi, ns.lba_size as usize))
    }

    /// The first `nblocks` blocks of `buf`.
    fn data_of(&self, buf: &DmaBuffer, nblocks: u32, lba_size: usize) -> Result<Vec<u8>, Error> {
        let len = nblocks as usize * lba_size;
        if len > buf.len() {
            return Err(Error::BufferTooSmall {
                len,
                buffer: buf.len(),
            });
        }
        let mut data = vec![0; len];
        buf.read_bytes(0, &mut data)?;
        Ok(data)
    }
}
