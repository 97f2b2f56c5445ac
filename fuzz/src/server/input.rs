//! The input format of the vfio_user_server target: messages, actions and
//! the fds to pass with them, decoded with `arbitrary` so the committed
//! corpus keeps its meaning (see [`EXT_TAG`]).

use arbitrary::{Arbitrary, Unstructured};

/// Marks an item of the input format added after the committed corpus was
/// made. `arbitrary`'s derive picks an enum variant as `u32 * COUNT >> 32`,
/// so appending variants would re-map most old discriminants (and with them
/// most of the corpus). So the old enums stay as they were ([`Msg`],
/// [`BaseFd`]) and a new item is this byte followed by a new enum ([`Ext`],
/// [`ExtFd`]). An old input decodes as before unless one of its
/// discriminants starts with this byte (1 in 256 at random; none in the
/// committed corpus, checked with `cargo fuzz fmt`).
const EXT_TAG: u8 = 0xa7;

/// `A` as the derive decodes it (the old format), or `B` after an
/// [`EXT_TAG`] byte.
fn base_or_ext<'a, A: Arbitrary<'a>, B: Arbitrary<'a>>(
    u: &mut Unstructured<'a>,
) -> arbitrary::Result<Result<A, B>> {
    if u.peek_bytes(1) == Some(&[EXT_TAG][..]) {
        u.bytes(1)?;
        return Ok(Err(B::arbitrary(u)?));
    }
    // Decode from a copy of the rest, then consume what it used.
    let rest = u.peek_bytes(u.len()).unwrap_or(&[]);
    let mut base = Unstructured::new(rest);
    let a = A::arbitrary(&mut base)?;
    u.bytes(rest.len() - base.len())?;
    Ok(Ok(a))
}

/// The fd kinds of the first input format (do not change: see [`EXT_TAG`]).
#[derive(Arbitrary)]
enum BaseFd {
    Memfd { pages: u8 },
    Eventfd,
    Pipe,
}

/// Fd kinds added since (new ones go at the end).
#[derive(Arbitrary)]
enum ExtFd {
    PipeRead,
    PipeWrite,
    Socket,
    SocketFull,
    EventfdFull,
    File { pages: u8 },
}

/// An fd to pass with a message ([`BaseFd`] or [`ExtFd`] in the input).
#[derive(Debug, Clone, Copy)]
pub enum Fd {
    /// A memfd of `pages` 4 KiB pages (the guest RAM when `pages == 0`).
    Memfd {
        pages: u8,
    },
    Eventfd,
    /// A pipe's read end whose write end is closed: not mappable, not an eventfd.
    Pipe,
    /// A pipe's read end whose writer stays open and silent: a read blocks.
    PipeRead,
    /// A pipe's write end, full, whose reader stays open and never reads: a
    /// write blocks (or fails with EAGAIN if made non-blocking).
    PipeWrite,
    /// One end of a socketpair whose peer is closed (a write fails with EPIPE).
    Socket,
    /// One end of a socketpair, its send buffer full, whose peer stays open
    /// and never reads: a write blocks.
    SocketFull,
    /// An eventfd at its maximum count (0xffff_ffff_ffff_fffe): a write
    /// blocks, or fails with EAGAIN if made non-blocking.
    EventfdFull,
    /// A regular file in `std::env::temp_dir()` (unlinked at once) of `pages`
    /// 4 KiB pages (`RAM` bytes when `pages == 0`).
    File {
        pages: u8,
    },
}

impl<'a> Arbitrary<'a> for Fd {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match base_or_ext::<BaseFd, ExtFd>(u)? {
            Ok(BaseFd::Memfd { pages }) => Fd::Memfd { pages },
            Ok(BaseFd::Eventfd) => Fd::Eventfd,
            Ok(BaseFd::Pipe) => Fd::Pipe,
            Err(ExtFd::PipeRead) => Fd::PipeRead,
            Err(ExtFd::PipeWrite) => Fd::PipeWrite,
            Err(ExtFd::Socket) => Fd::Socket,
            Err(ExtFd::SocketFull) => Fd::SocketFull,
            Err(ExtFd::EventfdFull) => Fd::EventfdFull,
            Err(ExtFd::File { pages }) => Fd::File { pages },
        })
    }
}

/// The messages and actions of the first input format (do not add variants
/// here: see [`EXT_TAG`]; new ones go to [`Ext`]).
#[derive(Arbitrary, Debug)]
pub enum Msg {
    Version {
        major: u16,
        minor: u16,
        json: Vec<u8>,
        nul: bool,
    },
    /// VERSION with sane capabilities (most inputs start with it).
    Hello,
    DmaMap {
        iova: u64,
        size: u64,
        offset: u64,
        flags: u32,
        argsz_delta: i8,
        fd: Option<Fd>,
    },
    /// The guest RAM memfd mapped at `iova_page * 4 KiB` (`size` pages, 0 = all).
    MapRam {
        iova_page: u16,
        size_pages: u8,
        writable: bool,
    },
    DmaUnmap {
        iova: u64,
        size: u64,
        flags: u32,
        argsz: u32,
    },
    /// Unmap what `MapRam` mapped.
    UnmapRam {
        iova_page: u16,
        size_pages: u8,
    },
    GetInfo {
        argsz: u32,
    },
    GetRegionInfo {
        argsz: u32,
        index: u32,
        short: u8,
    },
    GetIrqInfo {
        argsz: u32,
        index: u32,
    },
    SetIrqs {
        argsz_delta: i8,
        flags: u32,
        index: u32,
        start: u32,
        count: u32,
        fds: Vec<Fd>,
        data: Vec<u8>,
    },
    RegionRead {
        index: u32,
        offset: u64,
        count: u32,
    },
    RegionWrite {
        index: u32,
        offset: u64,
        data: Vec<u8>,
        posted: bool,
    },
    /// A 4-byte BAR0 register or doorbell write (0..0x4000).
    Bar0 {
        offset: u16,
        value: u32,
        posted: bool,
    },
    /// Admin queue at ASQ/ACQ, CC.EN = 1.
    EnableNvme {
        qsize_z: u8,
    },
    /// Bytes into guest RAM (SQEs, PRP lists, data).
    Guest {
        offset: u32,
        bytes: Vec<u8>,
    },
    /// An SQE into admin SQ slot `slot` and the tail doorbell set past it.
    AdminCmd {
        slot: u8,
        sqe: [u8; 64],
    },
    Reset,
    /// Any header and payload, any fds.
    Raw {
        command: u16,
        flags: u32,
        msg_id: u16,
        size_delta: i32,
        payload: Vec<u8>,
        fds: Vec<Fd>,
    },
    /// Bytes straight into the stream (framing abuse).
    Bytes(Vec<u8>),
    Pause {
        micros: u16,
    },
}

/// Actions added since the first input format (new ones go at the end).
#[derive(Arbitrary, Debug)]
pub enum Ext {
    /// Shrinks (ftruncate) a memfd or file passed earlier with DMA_MAP (the
    /// guest RAM too, if it was): to 0 or to half its size. `which` picks
    /// among those passed. With `kick`, an Identify whose data buffer is the
    /// last page of the guest RAM goes into the admin SQ and its doorbell is
    /// rung, so the server reads and writes lost pages at once.
    Truncate { which: u8, half: bool, kick: bool },
    /// Fds to attach to the next message sent, whatever it is (on top of its
    /// own): DMA_UNMAP, REGION_WRITE, VERSION, a doorbell...
    Fds(Vec<Fd>),
}

/// One item of an input: a [`Msg`], or an [`EXT_TAG`] byte and an [`Ext`].
pub enum Step {
    Msg(Msg),
    Ext(Ext),
}

impl<'a> Arbitrary<'a> for Step {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match base_or_ext::<Msg, Ext>(u)? {
            Ok(m) => Step::Msg(m),
            Err(e) => Step::Ext(e),
        })
    }
}

/// Transparent, so `cargo fuzz fmt` prints old inputs as it did.
impl std::fmt::Debug for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Msg(m) => m.fmt(f),
            Step::Ext(e) => e.fmt(f),
        }
    }
}

#[derive(Arbitrary, Debug)]
pub struct Input {
    /// Bits 0-1: doorbell mode. Bit 2: the guest RAM is a regular file in
    /// `std::env::temp_dir()` instead of a memfd.
    pub mode: u8,
    /// Answer the server's DMA_READ/DMA_WRITE (else fail them with EFAULT).
    pub answer_dma: bool,
    pub msgs: Vec<Step>,
}
