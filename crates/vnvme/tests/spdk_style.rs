//! Our driver drives `vnvme serve`, in its default doorbell mode, the way
//! SPDK's NVMe host drives a vfio-user controller, so that CI covers what
//! SPDK relies on without SPDK: BAR0's doorbell page mapped (a sparse mmap
//! area) and every doorbell, the admin queue's too, a store to it; no
//! Doorbell Buffer Config; completions polled, no interrupts; every
//! DMA_UNMAP carrying the fd of the memory it unmaps.
//!
//! Each test ends by stopping the server and reading the counters it writes
//! at exit (`--stats`): not one doorbell write trapped, and queue 1 fetched
//! every I/O command sent.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::pattern::pattern;
use common::{serve, temp_dir, Served, TempDir};
use serde_json::Value;
use vnvme_driver::{
    admin, Controller, DeviceAccess, DmaBuffer, DmaPool, DoorbellKind, InitOptions, IoQueue,
    VfioUserAccess,
};
use vnvme_spec::identify::{Cns, IdentifyNamespace, IDENTIFY_SIZE};
use vnvme_spec::regs::{offset, Doorbell};
use vnvme_spec::NvmOpcode;
use zerocopy::FromBytes;

const NSID: u32 = 1;
/// Commands in flight at once at the deep end (a ring of QD + 1 entries).
const QD: usize = 128;

/// `vnvme serve` with a 64 MiB RAM namespace and no --doorbells flag.
struct Server {
    served: Served,
    socket: PathBuf,
    stats: PathBuf,
    _dir: TempDir,
}

impl Server {
    fn start(name: &str, extra: &[&str]) -> Self {
        let dir = temp_dir(name);
        let (socket, stats) = (dir.join("vnvme.sock"), dir.join("stats.json"));
        let mut args = vec!["--ns", "64M:ram", "--serial", "SPDK-STYLE"];
        args.extend(["--stats", stats.to_str().unwrap()]);
        args.extend(extra);
        Self {
            served: serve(&socket, &args),
            socket,
            stats,
            _dir: dir,
        }
    }

    /// Connects (waiting out the EBUSY a previous client leaves until the
    /// server has seen it go) and brings the controller up as SPDK does.
    fn attach(&self) -> Host {
        let deadline = Instant::now() + Duration::from_secs(10);
        let access = loop {
            match VfioUserAccess::connect(&self.socket) {
                Err(vnvme_vfio_user::Error::Busy) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                r => break Arc::new(r.unwrap().unmap_with_fd(true)),
            }
        };
        let opts = InitOptions {
            queue_depth: QD as u16 + 1,
            interrupts: false,
            map_doorbells: true,
            ..InitOptions::default()
        };
        let ctrl = Controller::init(access.clone(), opts).unwrap();
        let host = Host { access, ctrl };
        host.assert_doorbells_mapped();
        host
    }

    /// Stops the server (SIGTERM) and returns the counters it wrote at exit,
    /// after checking that none of them is a doorbell trap and that queue 1
    /// fetched `io_commands`.
    fn stop(self, io_commands: u64) -> Value {
        assert!(self.served.terminate().success());
        let stats: Value = serde_json::from_slice(&std::fs::read(&self.stats).unwrap()).unwrap();
        assert_eq!(stats["sq_doorbell_traps"], 0, "{stats:#}");
        assert_eq!(stats["cq_doorbell_traps"], 0, "{stats:#}");
        assert_eq!(stats["dbbuf_configs"], 0);
        let queues = stats["queues"].as_array().unwrap();
        let q1 = queues
            .iter()
            .find(|q| q["qid"] == 1)
            .expect("queue 1 counted");
        assert_eq!(q1["commands"], io_commands, "{stats:#}");
        stats
    }
}

/// The driver, attached the SPDK way.
struct Host {
    access: Arc<VfioUserAccess>,
    ctrl: Controller,
}

impl Host {
    fn assert_doorbells_mapped(&self) {
        assert!(!self.access.mapped_areas().is_empty());
        let dstrd = self.ctrl.cap().dstrd();
        for db in [Doorbell::SqTail(0), Doorbell::CqHead(1)] {
            assert!(self.access.is_mapped(db.offset(dstrd)), "{db:?} mapped");
        }
        assert!(!self.access.is_mapped(offset::CC), "CC still traps");
        assert_eq!(self.ctrl.doorbell_kind(), DoorbellKind::Mapped);
    }

    /// Takes the I/O queue, whose doorbells must be stores to the page.
    fn queue(&self) -> IoQueue {
        self.ctrl.take_io_queue(0).unwrap()
    }

    fn block_size(&self) -> usize {
        self.ctrl.namespaces()[0].lba_size as usize
    }

    /// Writes `n` blocks from `lba` (`seed`'s pattern, per block), `qd`
    /// commands in flight at a time.
    fn write(&self, q: &mut IoQueue, lba: u64, n: usize, qd: usize, seed: u32) {
        let bufs: Vec<DmaBuffer> = (0..n as u64)
            .map(|i| {
                let buf = self.access.dma_alloc(self.block_size()).unwrap();
                buf.write_bytes(0, &block(lba + i, seed, self.block_size()))
                    .unwrap();
                buf
            })
            .collect();
        run(q, NvmOpcode::WRITE, lba, &bufs, qd);
    }

    /// Reads `n` blocks from `lba`, `qd` at a time, and checks they hold
    /// what [`write`](Self::write) wrote with `seed`.
    fn verify(&self, q: &mut IoQueue, lba: u64, n: usize, qd: usize, seed: u32) {
        let bufs: Vec<DmaBuffer> = (0..n)
            .map(|_| self.access.dma_alloc(self.block_size()).unwrap())
            .collect();
        run(q, NvmOpcode::READ, lba, &bufs, qd);
        for (i, buf) in bufs.iter().enumerate() {
            let at = lba + i as u64;
            assert!(
                buf.to_vec() == block(at, seed, self.block_size()),
                "LBA {at}"
            );
        }
    }

    /// Disconnects, checking first that the driver's queue never wrote a
    /// doorbell register and that no DMA_UNMAP failed.
    fn detach(self, q: IoQueue) {
        let c = q.counters();
        assert_eq!((c.sq_doorbell_writes, c.cq_doorbell_writes), (0, 0));
        assert_eq!(c.sq_mapped_writes, c.submitted);
        assert!(c.cq_mapped_writes > 0);
        assert_eq!(self.ctrl.admin_counters().sq_doorbell_writes, 0);
        assert_eq!(self.access.failed_unmaps(), 0);
    }
}

/// The content of `lba` as written with `seed`.
fn block(lba: u64, seed: u32, len: usize) -> Vec<u8> {
    pattern(len, seed.wrapping_add(lba as u32))
}

/// One command per buffer, block `lba + i` to/from `bufs[i]`: `qd` are
/// submitted, one doorbell store each, before any is reaped.
fn run(q: &mut IoQueue, op: NvmOpcode, lba: u64, bufs: &[DmaBuffer], qd: usize) {
    for (batch, chunk) in bufs.chunks(qd).enumerate() {
        let first = lba + (batch * qd) as u64;
        for (i, buf) in chunk.iter().enumerate() {
            q.enqueue_rw(op, NSID, first + i as u64, 1, buf).unwrap();
            q.ring().unwrap();
        }
        assert_eq!(q.outstanding(), chunk.len());
        let mut done = Vec::new();
        while done.len() < chunk.len() {
            let left = chunk.len() - done.len();
            q.wait(&mut done, left, Duration::from_secs(10)).unwrap();
        }
        assert!(done.iter().all(|c| c.status().is_success()), "{done:?}");
        let mut cids: Vec<u16> = done.iter().map(|c| c.cid()).collect();
        cids.sort_unstable();
        cids.dedup();
        assert_eq!(cids.len(), chunk.len(), "each command completed once");
    }
}

#[test]
fn identify_and_io_at_depth_1_and_128_through_the_mapped_doorbell_page() {
    let server = Server::start("spdk-io", &[]);
    let host = server.attach();
    assert!(host.ctrl.identify().sn.starts_with(b"SPDK-STYLE"));
    let mut id = host.access.dma_alloc(IDENTIFY_SIZE).unwrap();
    host.ctrl
        .admin(admin::identify(Cns::NAMESPACE, NSID), Some(&mut id))
        .unwrap();
    let ns = IdentifyNamespace::read_from_bytes(&id.to_vec()).unwrap();
    assert_eq!(ns.nsze.get() * host.block_size() as u64, 64 << 20);

    let mut q = host.queue();
    host.write(&mut q, 0, 32, 1, 1);
    host.verify(&mut q, 0, 32, 1, 1);
    // 512 blocks, 128 at a time: the ring of 129 entries wraps again and again.
    host.write(&mut q, 1000, 512, QD, 2);
    host.verify(&mut q, 1000, 512, QD, 2);
    host.detach(q);
    server.stop(2 * 32 + 2 * 512);
}

#[test]
fn io_after_a_controller_reset_still_rings_the_mapped_page() {
    let server = Server::start("spdk-reset", &[]);
    let mut host = server.attach();
    let mut q = host.queue();
    host.write(&mut q, 0, 256, QD, 3);
    drop(q);
    host.ctrl.reset().unwrap();
    host.assert_doorbells_mapped();
    let mut q = host.queue();
    host.verify(&mut q, 0, 256, QD, 3);
    host.write(&mut q, 256, 256, QD, 4);
    host.verify(&mut q, 256, 256, QD, 4);
    host.detach(q);
    let stats = server.stop(256 + 3 * 256);
    assert_eq!(stats["enables"], 2);
}

#[test]
fn a_second_client_after_a_disconnect_is_served_the_same_way() {
    let server = Server::start("spdk-reconnect", &[]);
    let first = server.attach();
    let mut q = first.queue();
    first.write(&mut q, 0, 256, QD, 5);
    first.detach(q);

    let second = server.attach();
    let mut q = second.queue();
    second.verify(&mut q, 0, 256, QD, 5);
    second.write(&mut q, 0, 256, QD, 6);
    second.verify(&mut q, 0, 256, QD, 6);
    second.detach(q);
    server.stop(4 * 256);
}

#[test]
fn dma_unmaps_with_the_fd_attached_free_the_servers_maps() {
    // Eight maps at most: had the server refused (or kept) the unmaps, one
    // of the 32 maps below would have been refused.
    let server = Server::start("spdk-unmap", &["--max-dma-maps", "8"]);
    let host = server.attach();
    let mut q = host.queue();
    let len = host.ctrl.max_transfer();
    let blocks = (len / host.block_size()) as u32;
    for round in 0..32u32 {
        // Larger than half the pool's chunk: a region, and a DMA_MAP, of its own.
        let buf = host.access.dma_alloc(DmaPool::DEFAULT_CHUNK).unwrap();
        let (out, mut back) = (
            buf.subrange(0, len).unwrap(),
            buf.subrange(len, len).unwrap(),
        );
        let data = pattern(len, round);
        out.write_bytes(0, &data).unwrap();
        q.write(NSID, 0, blocks, &out).unwrap();
        q.read(NSID, 0, blocks, &mut back).unwrap();
        assert!(back.to_vec() == data, "round {round}");
    }
    host.detach(q);
    server.stop(2 * 32);
}
