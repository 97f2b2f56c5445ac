//! The hostile guest: a client that drives the controller by hand over a real
//! vfio-user socket, and the device it talks to.
#![allow(dead_code)]

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vnvme::device::DeviceOptions;
use vnvme_controller::Controller;
use vnvme_driver::access::DmaRegion;
use vnvme_driver::DmaBuffer;
use vnvme_spec::{AdminOpcode, Command, Completion, NvmOpcode, Status};
use vnvme_vfio_user::{Client, ServerOptions};
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, IntoBytes};

/// Where the guest's RAM sits in its physical (IOVA) space.
pub(crate) const RAM_IOVA: u64 = 0x1_0000_0000;
pub(crate) const RAM_SIZE: usize = 4 << 20;
pub(crate) const ASQ: u64 = RAM_IOVA;
pub(crate) const ACQ: u64 = RAM_IOVA + 0x1000;
pub(crate) const SHADOW: u64 = RAM_IOVA + 0x2000;
pub(crate) const EVENTIDX: u64 = RAM_IOVA + 0x3000;
pub(crate) const IDENTIFY_BUF: u64 = RAM_IOVA + 0x4000;
pub(crate) const IOSQ: u64 = RAM_IOVA + 0x10000;
pub(crate) const IOCQ: u64 = RAM_IOVA + 0x20000;
pub(crate) const DATA: u64 = RAM_IOVA + 0x100000;
/// Where a typical VMM (QEMU q35) places the NVMe BAR0 in guest physical
/// space, and so where a malicious guest would aim a PRP to reach the
/// doorbells (BAR0 + 0x1000) or the MSI-X table (BAR0 + 0x2000).
pub(crate) const BAR0_GPA: u64 = 0xFEBF_0000;
pub(crate) const ADMIN_ENTRIES: u16 = 32;
pub(crate) const TIMEOUT: Duration = Duration::from_secs(5);

/// A device served by `Server::serve_listener` on its own thread.
pub(crate) struct Served {
    pub(crate) path: PathBuf,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) thread: Option<JoinHandle<()>>,
    pub(crate) ctrl: Arc<Controller>,
}

impl Served {
    pub(crate) fn start() -> Self {
        Self::with_namespace("16M:ram")
    }

    /// Serves one namespace given as `--ns` takes it.
    pub(crate) fn with_namespace(spec: &str) -> Self {
        Self::with_options(DeviceOptions::default(), spec)
    }

    /// Serves one namespace with `opts` (at most 4 I/O queues).
    pub(crate) fn with_options(opts: DeviceOptions, spec: &str) -> Self {
        Self::with_server_options(opts, ServerOptions::default(), spec)
    }

    /// As [`Served::with_options`], with what the server allows a client.
    pub(crate) fn with_server_options(
        opts: DeviceOptions,
        server_opts: ServerOptions,
        spec: &str,
    ) -> Self {
        let opts = DeviceOptions {
            max_io_queues: 4,
            ..opts
        };
        let device = opts
            .build(
                &[spec.parse().unwrap()],
                &vnvme::identity::Origin::embedded(),
            )
            .unwrap();
        let ctrl = Arc::clone(device.controller());
        let path = std::env::temp_dir().join(format!(
            "vnvme-hostile-{}-{:?}.sock",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut server = vnvme_vfio_user::Server::with_options(device, server_opts);
            server.serve_listener(&listener, &stop2).unwrap();
        });
        Self {
            path,
            stop,
            thread: Some(thread),
            ctrl,
        }
    }

    /// A new client (after the previous one has gone) enables the
    /// controller, identifies it and reads a block.
    pub(crate) fn assert_serves_a_new_client(&self) {
        let mut g = Guest::connect(self);
        g.enable();
        g.create_io_pair(1, 64, IOSQ, IOCQ, 1);
        g.assert_serving();
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

#[derive(Clone, Copy)]
pub(crate) struct Ring {
    pub(crate) sq: u64,
    pub(crate) cq: u64,
    pub(crate) size: u16,
    /// CQ entries, when the CQ is not the SQ's size.
    pub(crate) cq_size: u16,
    pub(crate) tail: u16,
    pub(crate) head: u16,
    pub(crate) phase: bool,
}

/// A guest driving the controller by hand: registers through REGION_WRITE,
/// queues and data in a memfd mapped with DMA_MAP at `RAM_IOVA`.
pub(crate) struct Guest {
    pub(crate) client: Client,
    pub(crate) ram: Arc<DmaRegion>,
    pub(crate) mem: DmaBuffer,
    pub(crate) rings: [Option<Ring>; 5],
    pub(crate) cid: u16,
    /// Doorbell Buffer Config's shadow buffer, once configured: I/O queue
    /// doorbells are then written there before the register, as every
    /// host does (the controller reads I/O queues' shadow slots only).
    pub(crate) shadow: Option<u64>,
}

impl Guest {
    pub(crate) fn connect(srv: &Served) -> Self {
        Self::connect_path(&srv.path)
    }

    /// Connects to the server at `path`, retrying while it is busy with a
    /// previous client (it refuses others at once, and drops a stalled one
    /// after its message deadline, 5 s by default).
    pub(crate) fn connect_path(path: &std::path::Path) -> Self {
        let deadline = Instant::now() + 3 * TIMEOUT;
        let client = loop {
            match Client::connect(path) {
                Ok(c) => break c,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("connect: {e}"),
            }
        };
        // Not sealed: some tests shrink it under the server, as a hostile
        // client may.
        let ram = Arc::new(DmaRegion::resizable(RAM_SIZE, RAM_IOVA).unwrap());
        client
            .dma_map(RAM_IOVA, RAM_SIZE as u64, ram.fd(), 0, true)
            .unwrap();
        let mem = ram.buffer(0, RAM_SIZE).unwrap();
        Self {
            client,
            ram,
            mem,
            rings: [None; 5],
            cid: 0,
            shadow: None,
        }
    }

    pub(crate) fn w32(&self, off: u64, v: u32) {
        self.client.region_write(0, off, &v.to_le_bytes()).unwrap();
    }

    pub(crate) fn w64(&self, off: u64, v: u64) {
        self.client.region_write(0, off, &v.to_le_bytes()).unwrap();
    }

    pub(crate) fn r32(&self, off: u64) -> u32 {
        let mut b = [0u8; 4];
        self.client.region_read(0, off, &mut b).unwrap();
        u32::from_le_bytes(b)
    }

    pub(crate) fn csts(&self) -> u32 {
        self.r32(0x1C)
    }

    pub(crate) fn write_mem(&self, iova: u64, bytes: &[u8]) {
        self.mem
            .write_bytes((iova - RAM_IOVA) as usize, bytes)
            .unwrap();
    }

    pub(crate) fn read_mem(&self, iova: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem
            .read_bytes((iova - RAM_IOVA) as usize, &mut v)
            .unwrap();
        v
    }

    pub(crate) fn wait_csts(&self, what: &str, done: impl Fn(u32) -> bool) {
        let deadline = Instant::now() + TIMEOUT;
        while !done(self.csts()) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// CC.EN = 0, then the admin queue and CC.EN = 1; waits for RDY.
    pub(crate) fn enable(&mut self) {
        self.w32(0x14, 0);
        self.wait_csts("CSTS.RDY = 0", |c| c & 1 == 0);
        self.mem.fill((ACQ - RAM_IOVA) as usize, 0x1000, 0).unwrap();
        let q = u32::from(ADMIN_ENTRIES - 1);
        self.w32(0x24, q | (q << 16));
        self.w64(0x28, ASQ);
        self.w64(0x30, ACQ);
        self.w32(0x14, 0x0046_0001);
        self.wait_csts("CSTS.RDY = 1", |c| c & 1 == 1);
        assert_eq!(self.csts() & 2, 0, "CSTS.CFS after enable");
        self.rings = [None; 5];
        self.rings[0] = Some(Ring {
            sq: ASQ,
            cq: ACQ,
            size: ADMIN_ENTRIES,
            cq_size: ADMIN_ENTRIES,
            tail: 0,
            head: 0,
            phase: true,
        });
    }

    /// Puts `cmd` on SQ `qid` and rings the tail doorbell; returns the CID.
    pub(crate) fn push(&mut self, qid: u16, cmd: Command) -> u16 {
        let tail = self.stage(qid, cmd);
        self.ring(qid, 0, tail);
        self.cid
    }

    /// Rings doorbell `which` (0: SQ tail, 1: CQ head) of `qid` with
    /// `value`: the shadow slot first, if configured (I/O queues), then the
    /// register.
    pub(crate) fn ring(&self, qid: u16, which: u64, value: u16) {
        let off = 8 * u64::from(qid) + 4 * which;
        if let Some(shadow) = self.shadow.filter(|_| qid != 0) {
            self.write_mem(shadow + off, &u32::from(value).to_le_bytes());
        }
        self.w32(0x1000 + off, u32::from(value));
    }

    /// Doorbell Buffer Config with the test's buffers; on success, I/O
    /// queue doorbells go through the shadow buffer from now on.
    pub(crate) fn configure_dbbuf(&mut self) -> Status {
        let mut c = cmd(AdminOpcode::DOORBELL_BUFFER_CONFIG.0);
        c.prp1 = U64::new(SHADOW);
        c.prp2 = U64::new(EVENTIDX);
        let status = self.admin(c).status();
        if status.is_success() {
            self.shadow = Some(SHADOW);
        }
        status
    }

    /// Puts `cmd` on SQ `qid` without ringing the doorbell; returns the new
    /// tail.
    pub(crate) fn stage(&mut self, qid: u16, mut cmd: Command) -> u16 {
        self.cid = self.cid.wrapping_add(1);
        cmd.set_cid(self.cid);
        let r = self.rings[usize::from(qid)].as_mut().expect("queue");
        let slot = r.sq + u64::from(r.tail) * 64;
        r.tail = (r.tail + 1) % r.size;
        let tail = r.tail;
        self.write_mem(slot, cmd.as_bytes());
        tail
    }

    /// The next completion on `qid` within `timeout`, consumed and the CQ
    /// head doorbell rung.
    pub(crate) fn reap_within(&mut self, qid: u16, timeout: Duration) -> Option<Completion> {
        let deadline = Instant::now() + timeout;
        let r = self.rings[usize::from(qid)].expect("queue");
        loop {
            let b = self.read_mem(r.cq + u64::from(r.head) * 16, 16);
            let cqe = Completion::read_from_bytes(&b).unwrap();
            if cqe.phase() == r.phase {
                let r = self.rings[usize::from(qid)].as_mut().unwrap();
                r.head += 1;
                if r.head == r.cq_size {
                    r.head = 0;
                    r.phase = !r.phase;
                }
                let head = r.head;
                self.ring(qid, 1, head);
                return Some(cqe);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    pub(crate) fn submit(&mut self, qid: u16, cmd: Command) -> Completion {
        let cid = self.push(qid, cmd);
        let cqe = self
            .reap_within(qid, TIMEOUT)
            .unwrap_or_else(|| panic!("no completion for cid {cid} on queue {qid}"));
        assert_eq!(cqe.cid(), cid, "completion for the command submitted");
        cqe
    }

    pub(crate) fn admin(&mut self, cmd: Command) -> Completion {
        self.submit(0, cmd)
    }

    pub(crate) fn create_io_pair(&mut self, qid: u16, size: u16, sq: u64, cq: u64, iv: u16) {
        if (RAM_IOVA..RAM_IOVA + RAM_SIZE as u64).contains(&cq) {
            self.mem
                .fill((cq - RAM_IOVA) as usize, usize::from(size) * 16, 0)
                .unwrap();
        }
        let c = self.admin(create_cq(qid, size, cq, iv));
        assert_eq!(c.status(), Status::SUCCESS, "create CQ {qid}");
        let c = self.admin(create_sq(qid, size, sq, qid));
        assert_eq!(c.status(), Status::SUCCESS, "create SQ {qid}");
        self.rings[usize::from(qid)] = Some(Ring {
            sq,
            cq,
            size,
            cq_size: size,
            tail: 0,
            head: 0,
            phase: true,
        });
    }

    /// Ends a case: this connection still serves, and once it is closed the
    /// server serves a new client.
    pub(crate) fn finish(mut self, srv: &Served) {
        self.assert_serving();
        drop(self);
        srv.assert_serves_a_new_client();
    }

    /// The controller still answers here: Identify Controller, then a write
    /// and read back of one block on I/O queue 1.
    pub(crate) fn assert_serving(&mut self) {
        assert_eq!(self.csts() & 3, 1, "CSTS: RDY = 1, CFS = 0");
        let c = self.admin(identify(1, 0, IDENTIFY_BUF));
        assert_eq!(c.status(), Status::SUCCESS, "identify controller");
        assert_eq!(&self.read_mem(IDENTIFY_BUF + 4, 4), b"VNVM", "serial");
        let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        self.write_mem(DATA, &pattern);
        let c = self.submit(1, rw(NvmOpcode::WRITE, 0, 1, DATA, 0));
        assert_eq!(c.status(), Status::SUCCESS, "write");
        self.mem
            .fill((DATA + 0x1000 - RAM_IOVA) as usize, 4096, 0)
            .unwrap();
        let c = self.submit(1, rw(NvmOpcode::READ, 0, 1, DATA + 0x1000, 0));
        assert_eq!(c.status(), Status::SUCCESS, "read");
        assert_eq!(
            self.read_mem(DATA + 0x1000, 4096),
            pattern,
            "data read back"
        );
    }

    pub(crate) fn stats(&self, srv: &Served) -> vnvme_controller::ControllerStats {
        srv.ctrl.stats()
    }
}

pub(crate) fn cmd(opcode: u8) -> Command {
    Command::new(opcode, 0)
}

pub(crate) fn create_cq(qid: u16, size: u16, base: u64, iv: u16) -> Command {
    let mut c = cmd(AdminOpcode::CREATE_IO_CQ.0);
    c.prp1 = U64::new(base);
    c.cdw10 = U32::new(u32::from(qid) | (u32::from(size - 1) << 16));
    c.cdw11 = U32::new(0b11 | (u32::from(iv) << 16));
    c
}

pub(crate) fn create_sq(qid: u16, size: u16, base: u64, cqid: u16) -> Command {
    let mut c = cmd(AdminOpcode::CREATE_IO_SQ.0);
    c.prp1 = U64::new(base);
    c.cdw10 = U32::new(u32::from(qid) | (u32::from(size - 1) << 16));
    c.cdw11 = U32::new(1 | (u32::from(cqid) << 16));
    c
}

pub(crate) fn delete(op: AdminOpcode, qid: u16) -> Command {
    let mut c = cmd(op.0);
    c.cdw10 = U32::new(u32::from(qid));
    c
}

pub(crate) fn identify(cns: u8, nsid: u32, buf: u64) -> Command {
    let mut c = cmd(AdminOpcode::IDENTIFY.0);
    c.nsid = U32::new(nsid);
    c.prp1 = U64::new(buf);
    c.cdw10 = U32::new(u32::from(cns));
    c
}

/// One 4 KiB block (the namespace's LBA size) at `slba`, `blocks` blocks.
pub(crate) fn rw(op: NvmOpcode, slba: u64, blocks: u32, prp1: u64, prp2: u64) -> Command {
    let mut c = cmd(op.0);
    c.nsid = U32::new(1);
    c.prp1 = U64::new(prp1);
    c.prp2 = U64::new(prp2);
    c.cdw10 = U32::new(slba as u32);
    c.cdw11 = U32::new((slba >> 32) as u32);
    c.cdw12 = U32::new(blocks - 1);
    c
}

pub(crate) fn get_log(lid: u8, dwords: u32, offset: u64, buf: u64) -> Command {
    let mut c = cmd(AdminOpcode::GET_LOG_PAGE.0);
    c.nsid = U32::new(0xFFFF_FFFF);
    c.prp1 = U64::new(buf);
    let numd = dwords - 1;
    c.cdw10 = U32::new(u32::from(lid) | (numd << 16));
    c.cdw11 = U32::new(numd >> 16);
    c.cdw12 = U32::new(offset as u32);
    c.cdw13 = U32::new((offset >> 32) as u32);
    c
}

pub(crate) fn dte() -> Status {
    Status::DATA_TRANSFER_ERROR.with_dnr(true)
}

/// A guest that is up, with I/O queue pair 1 (64 entries).
pub(crate) fn ready(srv: &Served) -> Guest {
    let mut g = Guest::connect(srv);
    g.enable();
    g.create_io_pair(1, 64, IOSQ, IOCQ, 1);
    g
}
