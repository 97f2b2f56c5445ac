//! Hostile guests against the NVMe device over a real vfio-user connection
//! (`vnvme serve`'s server loop on a Unix socket). Each case asserts the
//! NVMe status (or the ignored-and-counted outcome) the spec asks for, and
//! then that the server still serves: the next command on the same
//! connection, and a new client after this one has gone.
//!
//! Structural immunity to QEMU's CVE-2021-3929 (DMA into the device's own
//! registers): the controller reaches guest memory only through the DMA map
//! table (`DmaSpace`), so a PRP or queue base that names BAR0 or the MSI-X
//! table, wherever the guest put them, is just an unmapped address.
//! CVE-2021-3947 (stack overflow from the changed namespace list): the list is
//! a bounded set (1024 entries, then the all-ones overflow marker), built
//! without recursion; see the controller's
//! `changed_namespace_list_overflows_to_all_ones` test and, here, reads of it
//! at hostile offsets.

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vnvme::device::{DeviceOptions, NvmeDevice};
use vnvme_controller::Controller;
use vnvme_driver::access::DmaRegion;
use vnvme_driver::DmaBuffer;
use vnvme_spec::{AdminOpcode, Command, Completion, NvmOpcode, Status};
use vnvme_vfio_user::Client;
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, IntoBytes};

/// Where the guest's RAM sits in its physical (IOVA) space.
const RAM_IOVA: u64 = 0x1_0000_0000;
const RAM_SIZE: usize = 4 << 20;
const ASQ: u64 = RAM_IOVA;
const ACQ: u64 = RAM_IOVA + 0x1000;
const SHADOW: u64 = RAM_IOVA + 0x2000;
const EVENTIDX: u64 = RAM_IOVA + 0x3000;
const IDENTIFY_BUF: u64 = RAM_IOVA + 0x4000;
const IOSQ: u64 = RAM_IOVA + 0x10000;
const IOCQ: u64 = RAM_IOVA + 0x20000;
const DATA: u64 = RAM_IOVA + 0x100000;
/// Where a typical VMM (QEMU q35) places the NVMe BAR0 in guest physical
/// space, and so where a malicious guest would aim a PRP to reach the
/// doorbells (BAR0 + 0x1000) or the MSI-X table (BAR0 + 0x2000).
const BAR0_GPA: u64 = 0xFEBF_0000;
const ADMIN_ENTRIES: u16 = 32;
const TIMEOUT: Duration = Duration::from_secs(5);

/// A device served by `Server::serve_listener` on its own thread.
struct Served {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    ctrl: Arc<Controller>,
}

impl Served {
    fn start() -> Self {
        let opts = DeviceOptions {
            max_io_queues: 4,
            ..DeviceOptions::default()
        };
        let device = NvmeDevice::new(&opts, &["16M:ram".parse().unwrap()]).unwrap();
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
            let mut server = vnvme_vfio_user::Server::new(device);
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
    fn assert_serves_a_new_client(&self) {
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
struct Ring {
    sq: u64,
    cq: u64,
    size: u16,
    /// CQ entries, when the CQ is not the SQ's size.
    cq_size: u16,
    tail: u16,
    head: u16,
    phase: bool,
}

/// A guest driving the controller by hand: registers through REGION_WRITE,
/// queues and data in a memfd mapped with DMA_MAP at `RAM_IOVA`.
struct Guest {
    client: Client,
    ram: Arc<DmaRegion>,
    mem: DmaBuffer,
    rings: [Option<Ring>; 5],
    cid: u16,
}

impl Guest {
    fn connect(srv: &Served) -> Self {
        // The server takes the next client once the previous one is gone.
        let deadline = Instant::now() + TIMEOUT;
        let client = loop {
            match Client::connect(&srv.path) {
                Ok(c) => break c,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("connect: {e}"),
            }
        };
        let ram = Arc::new(DmaRegion::new(RAM_SIZE, RAM_IOVA).unwrap());
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
        }
    }

    fn w32(&self, off: u64, v: u32) {
        self.client.region_write(0, off, &v.to_le_bytes()).unwrap();
    }

    fn w64(&self, off: u64, v: u64) {
        self.client.region_write(0, off, &v.to_le_bytes()).unwrap();
    }

    fn r32(&self, off: u64) -> u32 {
        let mut b = [0u8; 4];
        self.client.region_read(0, off, &mut b).unwrap();
        u32::from_le_bytes(b)
    }

    fn csts(&self) -> u32 {
        self.r32(0x1C)
    }

    fn write_mem(&self, iova: u64, bytes: &[u8]) {
        self.mem
            .write_bytes((iova - RAM_IOVA) as usize, bytes)
            .unwrap();
    }

    fn read_mem(&self, iova: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem
            .read_bytes((iova - RAM_IOVA) as usize, &mut v)
            .unwrap();
        v
    }

    fn wait_csts(&self, what: &str, done: impl Fn(u32) -> bool) {
        let deadline = Instant::now() + TIMEOUT;
        while !done(self.csts()) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// CC.EN = 0, then the admin queue and CC.EN = 1; waits for RDY.
    fn enable(&mut self) {
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
    fn push(&mut self, qid: u16, mut cmd: Command) -> u16 {
        self.cid = self.cid.wrapping_add(1);
        cmd.set_cid(self.cid);
        let r = self.rings[usize::from(qid)].as_mut().expect("queue");
        let slot = r.sq + u64::from(r.tail) * 64;
        r.tail = (r.tail + 1) % r.size;
        let tail = r.tail;
        self.write_mem(slot, cmd.as_bytes());
        self.w32(0x1000 + 8 * u64::from(qid), u32::from(tail));
        self.cid
    }

    /// The next completion on `qid` within `timeout`, consumed and the CQ
    /// head doorbell rung.
    fn reap_within(&mut self, qid: u16, timeout: Duration) -> Option<Completion> {
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
                self.w32(0x1000 + 8 * u64::from(qid) + 4, u32::from(head));
                return Some(cqe);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn submit(&mut self, qid: u16, cmd: Command) -> Completion {
        let cid = self.push(qid, cmd);
        let cqe = self
            .reap_within(qid, TIMEOUT)
            .unwrap_or_else(|| panic!("no completion for cid {cid} on queue {qid}"));
        assert_eq!(cqe.cid(), cid, "completion for the command submitted");
        cqe
    }

    fn admin(&mut self, cmd: Command) -> Completion {
        self.submit(0, cmd)
    }

    fn create_io_pair(&mut self, qid: u16, size: u16, sq: u64, cq: u64, iv: u16) {
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

    /// The controller still answers here: Identify Controller, then a write
    /// and read back of one block on I/O queue 1.
    fn assert_serving(&mut self) {
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

    fn stats(&self, srv: &Served) -> vnvme_controller::ControllerStats {
        srv.ctrl.stats()
    }
}

fn cmd(opcode: u8) -> Command {
    Command::new(opcode, 0)
}

fn create_cq(qid: u16, size: u16, base: u64, iv: u16) -> Command {
    let mut c = cmd(AdminOpcode::CREATE_IO_CQ.0);
    c.prp1 = U64::new(base);
    c.cdw10 = U32::new(u32::from(qid) | (u32::from(size - 1) << 16));
    c.cdw11 = U32::new(0b11 | (u32::from(iv) << 16));
    c
}

fn create_sq(qid: u16, size: u16, base: u64, cqid: u16) -> Command {
    let mut c = cmd(AdminOpcode::CREATE_IO_SQ.0);
    c.prp1 = U64::new(base);
    c.cdw10 = U32::new(u32::from(qid) | (u32::from(size - 1) << 16));
    c.cdw11 = U32::new(1 | (u32::from(cqid) << 16));
    c
}

fn delete(op: AdminOpcode, qid: u16) -> Command {
    let mut c = cmd(op.0);
    c.cdw10 = U32::new(u32::from(qid));
    c
}

fn identify(cns: u8, nsid: u32, buf: u64) -> Command {
    let mut c = cmd(AdminOpcode::IDENTIFY.0);
    c.nsid = U32::new(nsid);
    c.prp1 = U64::new(buf);
    c.cdw10 = U32::new(u32::from(cns));
    c
}

/// One 4 KiB block (the namespace's LBA size) at `slba`, `blocks` blocks.
fn rw(op: NvmOpcode, slba: u64, blocks: u32, prp1: u64, prp2: u64) -> Command {
    let mut c = cmd(op.0);
    c.nsid = U32::new(1);
    c.prp1 = U64::new(prp1);
    c.prp2 = U64::new(prp2);
    c.cdw10 = U32::new(slba as u32);
    c.cdw11 = U32::new((slba >> 32) as u32);
    c.cdw12 = U32::new(blocks - 1);
    c
}

fn get_log(lid: u8, dwords: u32, offset: u64, buf: u64) -> Command {
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

fn dte() -> Status {
    Status::DATA_TRANSFER_ERROR.with_dnr(true)
}

/// A guest that is up, with I/O queue pair 1 (64 entries).
fn ready(srv: &Served) -> Guest {
    let mut g = Guest::connect(srv);
    g.enable();
    g.create_io_pair(1, 64, IOSQ, IOCQ, 1);
    g
}

#[test]
fn prp_at_bar0_or_msix_table_address_is_a_data_transfer_error_not_a_register_write() {
    let srv = Served::start();
    let mut g = ready(&srv);
    let mut table = [0u8; 64];
    g.client.region_read(0, 0x2000, &mut table).unwrap();
    // BAR0's guest physical address (doorbells, MSI-X table) and the raw BAR
    // offsets: none is in the DMA map table, whatever the guest's layout.
    for addr in [BAR0_GPA + 0x1000, BAR0_GPA + 0x2000, 0x1000, 0x2000] {
        let c = g.submit(1, rw(NvmOpcode::READ, 0, 1, addr, 0));
        assert_eq!(c.status(), dte(), "read into {addr:#x}");
        let c = g.submit(1, rw(NvmOpcode::WRITE, 0, 1, addr, 0));
        assert_eq!(c.status(), dte(), "write from {addr:#x}");
        // A PRP list whose entries name the registers.
        let list = [addr.to_le_bytes(), (addr + 0x1000).to_le_bytes()].concat();
        g.write_mem(DATA + 0x3000, &list);
        let c = g.submit(1, rw(NvmOpcode::READ, 0, 3, DATA + 0x800, DATA + 0x3000));
        assert_eq!(c.status(), dte(), "PRP list into {addr:#x}");
    }
    // Identify into the MSI-X table: same answer, table untouched.
    let c = g.admin(identify(1, 0, BAR0_GPA + 0x2000));
    assert_eq!(c.status(), dte());
    let mut after = [0u8; 64];
    g.client.region_read(0, 0x2000, &mut after).unwrap();
    assert_eq!(table, after, "MSI-X table unchanged");
    g.assert_serving();
    drop(g);
    srv.assert_serves_a_new_client();
}

#[test]
fn queue_base_at_bar0_address_sets_cfs_and_a_reset_recovers() {
    let srv = Served::start();
    let mut g = ready(&srv);
    // Creation does not touch the memory (the spec leaves it to first use).
    let c = g.admin(create_cq(2, 16, BAR0_GPA + 0x2000, 2));
    assert_eq!(c.status(), Status::SUCCESS);
    let c = g.admin(create_sq(2, 16, BAR0_GPA + 0x1000, 2));
    assert_eq!(c.status(), Status::SUCCESS);
    let fatal_before = g.stats(&srv).fatal_errors;
    // The SQ tail doorbell: the entry is "fetched" from an unmapped address.
    g.w32(0x1000 + 16, 1);
    g.wait_csts("CSTS.CFS", |c| c & 2 != 0);
    assert_eq!(g.stats(&srv).fatal_errors, fatal_before + 1);
    // The host's recovery: a controller reset, then everything works.
    g.enable();
    g.create_io_pair(1, 64, IOSQ, IOCQ, 1);
    g.assert_serving();
    drop(g);
    srv.assert_serves_a_new_client();
}

#[test]
fn prp_into_unmapped_memory_or_across_the_end_of_a_map_fails_cleanly() {
    let srv = Served::start();
    let mut g = ready(&srv);
    let end = RAM_IOVA + RAM_SIZE as u64;
    // A second map right after the first is separate: an access that spans
    // both works only if each page is in one map (PRP pages are).
    let cases = [
        (0x10_0000_0000, 0, 1, "far outside any map"),
        (RAM_IOVA - 0x1000, 0, 1, "the page before the map"),
        (end - 0x200, end, 2, "first page's tail then past the end"),
        (end - 0x1000, 0, 2, "PRP2 zero for a two-page transfer"),
        (u64::MAX - 0xFFF, 0, 1, "the top of the address space"),
    ];
    for (prp1, prp2, blocks, what) in cases {
        let c = g.submit(1, rw(NvmOpcode::READ, 0, blocks, prp1, prp2));
        assert!(
            c.status() == dte() || c.status().sct() == 0 && c.status().sc() != 0,
            "{what}: {:?}",
            c.status()
        );
        assert_ne!(c.status(), Status::SUCCESS, "{what}");
    }
    // Exactly the last page of the map is fine.
    let c = g.submit(1, rw(NvmOpcode::READ, 0, 1, end - 0x1000, 0));
    assert_eq!(c.status(), Status::SUCCESS, "the last page of the map");
    g.assert_serving();
    drop(g);
    srv.assert_serves_a_new_client();
}

#[test]
fn doorbell_beyond_queue_size_and_cq_head_skipping_unposted_entries_are_ignored_and_counted() {
    let srv = Served::start();
    let mut g = ready(&srv);
    let before = srv.ctrl.stats().queue(1);
    // SQ 1 has 64 entries: tail 64 and 0xFFFF are out of range.
    g.w32(0x1008, 64);
    g.w32(0x1008, 0xFFFF);
    // CQ head 10 when nothing has been posted.
    g.w32(0x100C, 10);
    // Doorbells of queues that do not exist.
    g.w32(0x1000 + 8 * 3, 1);
    g.w32(0x1000 + 8 * 200, 1);
    // The bad CQ head is seen when the controller next posts on CQ 1.
    let c = g.submit(1, rw(NvmOpcode::READ, 0, 1, DATA, 0));
    assert_eq!(c.status(), Status::SUCCESS);
    let after = srv.ctrl.stats().queue(1);
    assert_eq!(
        after.invalid_doorbell_writes - before.invalid_doorbell_writes,
        3,
        "two bad SQ tails and one bad CQ head on queue 1"
    );
    assert_eq!(g.csts() & 2, 0, "no fatal status for a bad doorbell value");
    g.assert_serving();
    drop(g);
    srv.assert_serves_a_new_client();
}

#[test]
fn sq_on_a_cq_being_deleted_is_refused_in_both_orders() {
    let srv = Served::start();
    let mut g = ready(&srv);
    let c = g.admin(create_cq(2, 16, IOCQ + 0x4000, 2));
    assert_eq!(c.status(), Status::SUCCESS);
    // Delete CQ 2 and create an SQ on it, back to back in one doorbell.
    let d = g.push(0, delete(AdminOpcode::DELETE_IO_CQ, 2));
    let s = g.push(0, create_sq(2, 16, IOSQ + 0x4000, 2));
    let c1 = g.reap_within(0, TIMEOUT).unwrap();
    let c2 = g.reap_within(0, TIMEOUT).unwrap();
    assert_eq!((c1.cid(), c2.cid()), (d, s));
    assert_eq!(c1.status(), Status::SUCCESS, "delete CQ 2");
    assert_eq!(
        c2.status(),
        Status::INVALID_CQ.with_dnr(true),
        "SQ on deleted CQ"
    );
    // And the other order: a CQ with an SQ on it cannot be deleted.
    let c = g.admin(delete(AdminOpcode::DELETE_IO_CQ, 1));
    assert_eq!(c.status(), Status::INVALID_QUEUE_DELETION.with_dnr(true));
    g.assert_serving();
    drop(g);
    srv.assert_serves_a_new_client();
}

#[test]
fn max_size_queue_in_the_last_pages_of_a_map_works_and_one_crossing_the_end_is_fatal() {
    let srv = Served::start();
    let mut g = ready(&srv);
    let end = RAM_IOVA + RAM_SIZE as u64;
    // CAP.MQES: the largest queue the controller accepts.
    let mqes = (g.r32(0) & 0xFFFF) as u16 + 1;
    let sq_bytes = u64::from(mqes) * 64;
    let cq_bytes = u64::from(mqes) * 16;
    let sq = end - sq_bytes;
    let cq = sq - cq_bytes;
    assert!(cq >= DATA + 0x10000, "room for the test queues");
    g.create_io_pair(2, mqes, sq, cq, 2);
    // Fill it up to the last slot (size - 1 commands), wrapping once.
    for _ in 0..2 {
        for _ in 0..mqes - 1 {
            let r = g.rings[2].as_mut().unwrap();
            let slot = r.sq + u64::from(r.tail) * 64;
            r.tail = (r.tail + 1) % r.size;
            let mut c = rw(NvmOpcode::READ, 0, 1, DATA, 0);
            c.set_cid(1);
            g.write_mem(slot, c.as_bytes());
        }
        let tail = g.rings[2].unwrap().tail;
        g.w32(0x1000 + 16, u32::from(tail));
        for _ in 0..mqes - 1 {
            let c = g.reap_within(2, TIMEOUT).expect("completion");
            assert_eq!(c.status(), Status::SUCCESS);
        }
    }
    // A CQ whose second half lies past the end of the map (512 entries,
    // 8 KiB, in the last page): fine until the controller has to post
    // there, then CSTS.CFS (and never a write anywhere else).
    let fatal_before = srv.ctrl.stats().fatal_errors;
    let c = g.admin(create_cq(3, 512, end - 0x1000, 3));
    assert_eq!(c.status(), Status::SUCCESS);
    let sq3 = DATA + 0x40000;
    let c = g.admin(create_sq(3, 512, sq3, 3));
    assert_eq!(c.status(), Status::SUCCESS);
    let mut c = rw(NvmOpcode::READ, 0, 1, DATA, 0);
    for i in 0..300u64 {
        c.set_cid(i as u16);
        g.write_mem(sq3 + i * 64, c.as_bytes());
    }
    g.w32(0x1000 + 24, 300);
    g.wait_csts("CSTS.CFS", |c| c & 2 != 0);
    assert_eq!(srv.ctrl.stats().fatal_errors, fatal_before + 1);
    g.enable();
    g.create_io_pair(1, 64, IOSQ, IOCQ, 1);
    g.assert_serving();
    drop(g);
    srv.assert_serves_a_new_client();
}

#[test]
fn doorbell_buffer_config_with_one_page_for_both_or_unmapped_buffers_is_invalid_field() {
    let srv = Served::start();
    let mut g = ready(&srv);
    let invalid = Status::INVALID_FIELD.with_dnr(true);
    let dbbuf = |g: &mut Guest, shadow: u64, ei: u64| {
        let mut c = cmd(AdminOpcode::DOORBELL_BUFFER_CONFIG.0);
        c.prp1 = U64::new(shadow);
        c.prp2 = U64::new(ei);
        g.admin(c).status()
    };
    assert_eq!(dbbuf(&mut g, SHADOW, SHADOW), invalid, "both in one page");
    assert_eq!(dbbuf(&mut g, SHADOW, SHADOW + 0x800), invalid, "unaligned");
    assert_eq!(
        dbbuf(&mut g, SHADOW, 0x10_0000_0000),
        invalid,
        "EventIdx unmapped"
    );
    assert_eq!(
        dbbuf(&mut g, BAR0_GPA + 0x1000, EVENTIDX),
        invalid,
        "shadow at the doorbells"
    );
    // I/O keeps trapping as before, and a good config still works.
    g.assert_serving();
    assert_eq!(dbbuf(&mut g, SHADOW, EVENTIDX), Status::SUCCESS);
    drop(g);
    srv.assert_serves_a_new_client();
}

#[test]
fn dma_unmap_of_memory_in_use_fails_the_commands_cleanly() {
    let srv = Served::start();
    let mut g = ready(&srv);
    // A second map for data, used by a batch of commands, unmapped while
    // they wait: their CQ has room for 3 completions, so the controller
    // holds the rest of the batch until the host reaps.
    g.create_io_pair(2, 64, IOSQ + 0x4000, IOCQ + 0x4000, 2);
    let c = g.admin(delete(AdminOpcode::DELETE_IO_SQ, 2));
    assert_eq!(c.status(), Status::SUCCESS);
    let c = g.admin(delete(AdminOpcode::DELETE_IO_CQ, 2));
    assert_eq!(c.status(), Status::SUCCESS);
    g.mem
        .fill((IOCQ + 0x4000 - RAM_IOVA) as usize, 64, 0)
        .unwrap();
    let c = g.admin(create_cq(2, 4, IOCQ + 0x4000, 2));
    assert_eq!(c.status(), Status::SUCCESS);
    let c = g.admin(create_sq(2, 64, IOSQ + 0x4000, 2));
    assert_eq!(c.status(), Status::SUCCESS);
    g.rings[2] = Some(Ring {
        sq: IOSQ + 0x4000,
        cq: IOCQ + 0x4000,
        size: 64,
        cq_size: 4,
        tail: 0,
        head: 0,
        phase: true,
    });
    let extra_iova = 0x2_0000_0000;
    let extra = Arc::new(DmaRegion::new(1 << 20, extra_iova).unwrap());
    let xb = extra.buffer(0, 1 << 20).unwrap();
    g.client
        .dma_map(extra_iova, 1 << 20, extra.fd(), 0, true)
        .unwrap();
    let n = 60u16;
    for i in 0..n {
        // Four 4 KiB blocks: PRP1 and a PRP list of three pages, all in the
        // extra map.
        let base = extra_iova + u64::from(i % 15) * 0x10000;
        let list_at = 0xF_0000 + usize::from(i) * 64;
        let list: Vec<u8> = (1..4u64)
            .flat_map(|p| (base + p * 0x1000).to_le_bytes())
            .collect();
        xb.write_bytes(list_at, &list).unwrap();
        let c = rw(
            NvmOpcode::READ,
            u64::from(i),
            4,
            base,
            extra_iova + list_at as u64,
        );
        let r = g.rings[2].as_mut().unwrap();
        let slot = r.sq + u64::from(r.tail) * 64;
        r.tail = (r.tail + 1) % r.size;
        g.write_mem(slot, c.as_bytes());
    }
    let tail = g.rings[2].unwrap().tail;
    g.w32(0x1010, u32::from(tail));
    std::thread::sleep(Duration::from_millis(50));
    g.client.dma_unmap(extra_iova, 1 << 20).unwrap();
    let mut ok = 0;
    let mut failed = 0;
    for _ in 0..n {
        let c = g.reap_within(2, TIMEOUT).unwrap_or_else(|| {
            panic!(
                "every command completes: {ok} ok, {failed} failed, CSTS {:#x}, {:?}",
                g.csts(),
                srv.ctrl.stats().queue(2)
            )
        });
        match c.status() {
            s if s == Status::SUCCESS => ok += 1,
            s => {
                assert_eq!(s, dte(), "a command whose memory went away");
                failed += 1;
            }
        }
    }
    eprintln!("{ok} completed before the unmap, {failed} failed after");
    assert!(
        failed >= 50,
        "most of the batch ran after the unmap ({failed})"
    );
    drop(xb);
    drop(extra);
    g.assert_serving();
    drop(g);
    srv.assert_serves_a_new_client();
}

#[test]
fn interrupt_vector_beyond_the_table_is_invalid_interrupt_vector() {
    let srv = Served::start();
    let mut g = ready(&srv);
    // max_io_queues 4: 5 MSI-X vectors.
    for iv in [5u16, 255, 2048, 0xFFFF] {
        let c = g.admin(create_cq(2, 16, IOCQ + 0x4000, iv));
        assert_eq!(
            c.status(),
            Status::INVALID_INTERRUPT_VECTOR.with_dnr(true),
            "vector {iv}"
        );
    }
    g.assert_serving();
    drop(g);
    srv.assert_serves_a_new_client();
}

#[test]
fn identify_and_log_page_offsets_past_the_end_are_refused_or_zero_filled() {
    let srv = Served::start();
    let mut g = ready(&srv);
    // Unknown CNS and namespaces far out of range.
    let c = g.admin(identify(0xFF, 0, IDENTIFY_BUF));
    assert_eq!(c.status(), Status::INVALID_FIELD.with_dnr(true), "CNS FFh");
    let c = g.admin(identify(0, 0xFFFF_FFF0, IDENTIFY_BUF));
    assert_ne!(c.status(), Status::SUCCESS, "identify nsid FFFFFFF0h");
    // Log page offsets: past the end is Invalid Field; a read that runs off
    // the end gets zeroes; the largest offset and length don't overflow.
    for (lid, offset, dwords, ok) in [
        (0x02u8, 4096u64, 16u32, false),
        (0x04, 1 << 40, 16, false),
        (0x04, !3u64, 1024, false),
        (0x02, 508, 16, true),
        (0x04, 4092, 1024, true),
    ] {
        g.mem
            .fill((IDENTIFY_BUF - RAM_IOVA) as usize, 4096, 0xAA)
            .unwrap();
        let c = g.admin(get_log(lid, dwords, offset, IDENTIFY_BUF));
        if ok {
            assert_eq!(c.status(), Status::SUCCESS, "log {lid:#x} at {offset}");
            let tail = g.read_mem(IDENTIFY_BUF + 4, dwords as usize * 4 - 4);
            assert!(tail.iter().all(|&b| b == 0), "zeroes past the end");
        } else {
            assert_eq!(
                c.status(),
                Status::INVALID_FIELD.with_dnr(true),
                "log {lid:#x} at {offset:#x}"
            );
        }
    }
    g.assert_serving();
    drop(g);
    srv.assert_serves_a_new_client();
}

#[test]
fn thousands_of_aers_hit_the_limit_and_the_queue_keeps_working() {
    let srv = Served::start();
    let mut g = ready(&srv);
    let aerl = g.read_aerl();
    let outstanding = u32::from(aerl) + 1;
    let batch = u32::from(ADMIN_ENTRIES) - 1;
    // Far more than the limit (3100), in admin-queue-sized batches.
    for round in 0..100 {
        let cids: Vec<u16> = (0..batch)
            .map(|_| {
                let r = g.rings[0].as_mut().unwrap();
                let slot = r.sq + u64::from(r.tail) * 64;
                r.tail = (r.tail + 1) % r.size;
                g.cid = g.cid.wrapping_add(1);
                let mut c = cmd(AdminOpcode::ASYNC_EVENT_REQUEST.0);
                c.set_cid(g.cid);
                g.write_mem(slot, c.as_bytes());
                g.cid
            })
            .collect();
        let tail = g.rings[0].unwrap().tail;
        g.w32(0x1000, u32::from(tail));
        // All but AERL + 1 (held for events) complete with AER Limit Exceeded.
        let expected = if round == 0 {
            batch - outstanding
        } else {
            batch
        };
        for _ in 0..expected {
            let c = g.reap_within(0, TIMEOUT).expect("AER completion");
            assert!(cids.contains(&c.cid()));
            assert_eq!(c.status(), Status::AER_LIMIT_EXCEEDED.with_dnr(true));
        }
    }
    assert!(
        g.reap_within(0, Duration::from_millis(100)).is_none(),
        "AERL + 1 requests stay outstanding"
    );
    g.assert_serving();
    drop(g);
    srv.assert_serves_a_new_client();
}

impl Guest {
    fn read_aerl(&mut self) -> u8 {
        let c = self.admin(identify(1, 0, IDENTIFY_BUF));
        assert_eq!(c.status(), Status::SUCCESS);
        // Identify Controller AERL: byte 259.
        self.read_mem(IDENTIFY_BUF + 259, 1)[0]
    }
}

#[test]
fn a_flood_of_commands_keeps_the_controller_bounded() {
    let srv = Served::start();
    let mut g = ready(&srv);
    // 6300 commands, half of them failing: the controller keeps no
    // per-command state, and its Error Information log holds ELPE + 1
    // entries however many errors there were.
    for round in 0..100u32 {
        for i in 0..63u32 {
            let r = g.rings[1].as_mut().unwrap();
            let slot = r.sq + u64::from(r.tail) * 64;
            r.tail = (r.tail + 1) % r.size;
            let c = if i % 2 == 0 {
                rw(NvmOpcode::READ, u64::from(i), 1, DATA, 0)
            } else {
                rw(NvmOpcode::READ, 1 << 40, 1, 0x10_0000_0000, 0)
            };
            g.write_mem(slot, c.as_bytes());
        }
        let tail = g.rings[1].unwrap().tail;
        g.w32(0x1008, u32::from(tail));
        for _ in 0..63 {
            g.reap_within(1, TIMEOUT)
                .unwrap_or_else(|| panic!("completion in round {round}"));
        }
    }
    let stats = srv.ctrl.stats();
    assert!(stats.commands >= 100 * 63, "{} commands", stats.commands);
    let c = g.admin(identify(1, 0, IDENTIFY_BUF));
    assert_eq!(c.status(), Status::SUCCESS);
    // Identify Controller ELPE: byte 262, 0's based.
    let entries = usize::from(g.read_mem(IDENTIFY_BUF + 262, 1)[0]) + 1;
    let log_at = DATA + 0x10000;
    let len = (entries + 8) * 64;
    g.mem.fill((log_at - RAM_IOVA) as usize, len, 0xAA).unwrap();
    let mut c = get_log(0x01, (len / 4) as u32, 0, log_at);
    c.prp2 = U64::new(log_at + 0x1000);
    let c = g.admin(c);
    assert_eq!(c.status(), Status::SUCCESS);
    let log = g.read_mem(log_at, len);
    assert!(log[..64].iter().any(|&b| b != 0), "errors were logged");
    assert!(
        log[entries * 64..].iter().all(|&b| b == 0),
        "no more than ELPE + 1 = {entries} entries"
    );
    g.assert_serving();
    drop(g);
    srv.assert_serves_a_new_client();
}

#[test]
fn a_client_that_disconnects_mid_command_leaves_the_server_serving() {
    let srv = Served::start();
    let mut g = ready(&srv);
    // A batch in flight, then the client vanishes without a word.
    for i in 0..63u64 {
        let r = g.rings[1].as_mut().unwrap();
        let slot = r.sq + u64::from(r.tail) * 64;
        r.tail = (r.tail + 1) % r.size;
        g.write_mem(
            slot,
            rw(NvmOpcode::WRITE, i, 8, DATA, DATA + 0x2000).as_bytes(),
        );
    }
    let tail = g.rings[1].unwrap().tail;
    g.w32(0x1008, u32::from(tail));
    drop(g);
    srv.assert_serves_a_new_client();
}

/// The server serves one client at a time (QEMU keeps one connection per
/// device); a client that stalls in the middle of a message is dropped after
/// the connection's stall timeout (5 s, `vnvme_vfio_user::conn`), and the
/// next client waiting in the listen backlog is served.
#[test]
fn a_client_that_stalls_mid_message_is_dropped_and_the_next_is_served() {
    use std::io::Write;
    let srv = Served::start();
    let mut s = std::os::unix::net::UnixStream::connect(&srv.path).unwrap();
    // Half a header, then silence (the socket stays open).
    s.write_all(&[1, 0, 1, 0, 0x20]).unwrap();
    let started = Instant::now();
    srv.assert_serves_a_new_client();
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the next client waited {:?}",
        started.elapsed()
    );
    drop(s);
}

/// The stop flag (SIGTERM in `vnvme serve`) ends the server even while a
/// client stalls mid-message: within the stall timeout.
#[test]
fn a_client_that_stalls_mid_message_does_not_keep_the_server_from_stopping() {
    use std::io::Write;
    let srv = Served::start();
    let mut s = std::os::unix::net::UnixStream::connect(&srv.path).unwrap();
    s.write_all(&[1, 0, 1, 0, 0x20]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    drop(srv);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the server took {:?} to stop",
        started.elapsed()
    );
    drop(s);
}

#[test]
fn a_client_that_stalls_mid_message_then_leaves_does_not_block_the_next() {
    use std::io::Write;
    let srv = Served::start();
    let mut s = std::os::unix::net::UnixStream::connect(&srv.path).unwrap();
    // A header announcing 64 bytes, and only 20 of them.
    let mut msg = vec![1u8, 0, 1, 0, 64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    msg.extend_from_slice(&[0; 4]);
    s.write_all(&msg).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    drop(s);
    srv.assert_serves_a_new_client();
}

#[test]
fn guest_ram_mapped_twice_or_overlapping_is_refused() {
    let srv = Served::start();
    let g = ready(&srv);
    // The same range again, and one overlapping its end.
    assert!(g
        .client
        .dma_map(RAM_IOVA, 0x1000, g.ram.fd(), 0, true)
        .is_err());
    assert!(g
        .client
        .dma_map(
            RAM_IOVA + RAM_SIZE as u64 - 0x1000,
            0x2000,
            g.ram.fd(),
            0,
            true
        )
        .is_err());
    let mut g = g;
    g.assert_serving();
    drop(g);
    srv.assert_serves_a_new_client();
}
