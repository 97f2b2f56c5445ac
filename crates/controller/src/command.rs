//! What a command handler has at hand ([`Ctx`]: the shared state, the
//! client's memory, the worker's buffers and its commands in flight) and
//! how a command finishes ([`Outcome`]); the bridge to vendor handlers.
//!
//! Below the admin and I/O handlers, above the state they reach through it.

use std::sync::atomic::Ordering::Relaxed;

use vnvme_spec::identify::fill_ascii;
use vnvme_spec::status::invalid_field;
use vnvme_spec::{Command, Status};
use zerocopy::little_endian::{U16, U32, U64};

use crate::inflight::InFlight;
use crate::memory::GuestAddress;
use crate::namespace::reservation::Fence;
use crate::prp::Segment;
use crate::state::{Session, Shared};
use crate::subsystem::cache::NamespaceCache;
use crate::vendor::{CommandSet, NamespaceGeometry, VendorContext, VendorHost, VendorInfo};

/// Per-worker scratch buffers, reused across commands, and where the
/// worker last found its namespaces.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    pub namespaces: NamespaceCache,
    pub segs: Vec<Segment>,
    pub buf: Vec<u8>,
    pub buf2: Vec<u8>,
    /// Separate metadata (MPTR) of the command in flight, and its data
    /// while split from or merged with the metadata.
    pub meta: Vec<u8>,
    pub split: Vec<u8>,
    /// The pieces of a metadata SGL (PSDT 10b).
    pub meta_segs: Vec<Segment>,
    /// A read's guards as the backend's copy computed them
    /// ([`crate::protection::GuardFill`]).
    pub guards: Vec<u64>,
    /// What the completion of a Preempt and Abort just run waits for
    /// ([`Outcome::Fenced`]).
    pub fence: Option<Fence>,
    /// The command just run changed the saved state under a crash record
    /// ([`Outcome::Owed`]).
    pub owed: bool,
}

/// What a command handler has at hand.
pub(crate) struct Ctx<'a> {
    pub shared: &'a Shared,
    /// The SQ the command came from: its worker is the one running it,
    /// and the only one adding to its counters ([`crate::stats::Owned`]).
    pub qid: u16,
    pub session: &'a Session,
    pub scratch: &'a mut Scratch,
    /// The worker's commands in flight on asynchronous backends.
    pub inflight: &'a mut InFlight,
}

/// How a command finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Done {
        dw0: u32,
        status: Status,
    },
    /// Completed later (Asynchronous Event Request).
    Deferred,
    /// In flight on an asynchronous backend, under this token: the
    /// completion is posted when the backend finishes (see
    /// [`crate::inflight`]).
    Submitted(u64),
    /// A Reservation Acquire (Preempt and Abort) succeeded, and completes
    /// once the commands admitted before it are done: the fence is in
    /// [`Scratch::fence`], and the worker holds the command meanwhile.
    Fenced,
    /// A Zone Append succeeded, at this LBA: completion DW0 (bits 31:0)
    /// and DW1 (bits 63:32), ZNS 1.1 §3.4.1.
    Appended(u64),
    /// Done, and the saved state changed (a reservation command), under a
    /// crash record: the completion is owed until a kept state holds the
    /// change ([`crate::queue::owed`]).
    Owed {
        dw0: u32,
        status: Status,
    },
}

impl Outcome {
    pub fn ok(dw0: u32) -> Self {
        Outcome::Done {
            dw0,
            status: Status::SUCCESS,
        }
    }

    pub fn from_result(r: Result<u32, Status>) -> Self {
        match r {
            Ok(dw0) => Self::ok(dw0),
            Err(status) => Outcome::Done { dw0: 0, status },
        }
    }
}

impl Ctx<'_> {
    /// The I/O command being run changed saved state no crash record word
    /// holds (a reservation, a zone descriptor extension, a Write
    /// Uncorrectable mark set or cleared): a supervised server keeps it at
    /// its next checkpoint, which this asks for, and the command's
    /// completion, if it is done in its pass, is owed until then
    /// ([`Outcome::Owed`]).
    pub fn state_changed(&mut self) {
        let rec = self.shared.crash.get();
        self.scratch.owed |= rec.is_some();
        crate::crash_record::admin_done(rec);
    }

    /// Maps the command's data pointer for `len` bytes into the scratch
    /// segment list: PRPs, or (PSDT 01b, I/O commands) an SGL, whose
    /// direction the opcode's data transfer bits give.
    pub fn map_prps(&mut self, cmd: &Command, len: u64) -> Result<(), Status> {
        let (prp1, prp2) = (cmd.prp1.get(), cmd.prp2.get());
        if cmd.psdt() == 0 {
            return crate::prp::map(
                &*self.session.mem,
                GuestAddress(prp1),
                GuestAddress(prp2),
                len,
                self.session.page_size,
                &mut self.scratch.segs,
            );
        }
        self.shared
            .stats
            .sgl_commands
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut sgl1 = [0u8; 16];
        sgl1[..8].copy_from_slice(&prp1.to_le_bytes());
        sgl1[8..].copy_from_slice(&prp2.to_le_bytes());
        let dir = if cmd.opcode() & 0x3 == 0x2 {
            crate::sgl::Direction::ToHost
        } else {
            crate::sgl::Direction::FromHost
        };
        crate::sgl::map(&*self.session.mem, sgl1, len, dir, &mut self.scratch.segs)
    }

    /// Copies `data` to the host buffer described by the command's PRPs.
    pub fn send(&mut self, cmd: &Command, data: &[u8]) -> Result<(), Status> {
        let len = data.len() as u64;
        if len > self.shared.config.max_transfer() {
            return Err(invalid_field());
        }
        self.map_prps(cmd, len)?;
        crate::prp::write_to_guest(&*self.session.mem, &self.scratch.segs, data)
    }

    /// Copies `len` bytes (at most MDTS) from the host buffer described by
    /// the command's PRPs into `out`.
    pub fn receive(&mut self, cmd: &Command, len: usize, out: &mut Vec<u8>) -> Result<(), Status> {
        if len as u64 > self.shared.config.max_transfer() {
            return Err(invalid_field());
        }
        self.map_prps(cmd, len as u64)?;
        out.clear();
        out.resize(len, 0);
        crate::prp::read_from_guest(&*self.session.mem, &self.scratch.segs, out)
    }
}

/// Executes vendor specific `cmd` of `set`: its handler, or Invalid Command
/// Opcode. The dispatch hook of `admin::execute` and `io::execute`.
pub(crate) fn execute_vendor(
    ctx: &mut Ctx<'_>,
    set: CommandSet,
    cmd: &Command,
) -> Result<u32, Status> {
    let handler = ctx
        .shared
        .config
        .vendor
        .get(set, cmd.opcode())
        .cloned()
        .ok_or(Status::INVALID_OPCODE.with_dnr(true))?;
    if cmd.fuse() != 0 || cmd.psdt() != 0 {
        return Err(invalid_field());
    }
    handler.execute(&mut VendorContext::new(ctx), cmd)
}

impl VendorHost for Ctx<'_> {
    fn send(&mut self, cmd: &Command, data: &[u8]) -> Result<(), Status> {
        Ctx::send(self, cmd, data)
    }

    fn receive(&mut self, cmd: &Command, len: usize) -> Result<Vec<u8>, Status> {
        let mut data = Vec::new();
        Ctx::receive(self, cmd, len, &mut data)?;
        Ok(data)
    }

    fn namespace(&self, nsid: u32) -> Result<NamespaceGeometry, Status> {
        let ns = self.shared.namespace(nsid)?;
        Ok(NamespaceGeometry {
            lba_size: 1 << ns.lba_shift,
            nsze: ns.nsze,
        })
    }

    fn read_blocks(&mut self, nsid: u32, slba: u64, out: &mut [u8]) -> Result<(), Status> {
        let ns = self.shared.namespace(nsid)?;
        // User data is not the vendor's to read while it is sanitized.
        if let Some(status) = ns.sanitize {
            return Err(status);
        }
        let lba_size = 1u64 << ns.lba_shift;
        let len = out.len() as u64;
        if !len.is_multiple_of(lba_size) {
            return Err(invalid_field());
        }
        let (offset, _) = ns.byte_range(slba, len / lba_size)?;
        ns.uncorrectable
            .check(slba, len / lba_size)
            .inspect_err(|_| {
                self.shared.stats.media_errors.fetch_add(1, Relaxed);
            })?;
        ns.backend.read(offset, out).map_err(|e| {
            let stats = &self.shared.stats;
            stats.backend_error(crate::backend_error::BackendOp::Read, nsid, &e)
        })
    }

    fn vendor_info(&self) -> VendorInfo {
        let shared = self.shared;
        let config = &shared.config;
        let mut info = VendorInfo {
            magic: VendorInfo::MAGIC,
            version: U32::new(1),
            namespaces: U32::new(
                u32::try_from(shared.subsystem.namespaces.len()).unwrap_or(u32::MAX),
            ),
            max_io_queues: U16::new(config.max_io_queues),
            mdts: config.mdts,
            vendor_commands: u8::try_from(config.vendor.len()).unwrap_or(u8::MAX),
            host_read_commands: U64::new(shared.stats.host_read_commands()),
            host_write_commands: U64::new(shared.stats.host_write_commands()),
            firmware: shared.subsystem.firmware.lock().running(),
            serial: [b' '; 20],
        };
        fill_ascii(&mut info.serial, &config.serial);
        info
    }

    fn max_transfer(&self) -> u64 {
        self.shared.config.max_transfer()
    }

    fn take_buffer(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.scratch.buf2)
    }

    fn put_buffer(&mut self, buf: Vec<u8>) {
        self.scratch.buf2 = buf;
    }
}
