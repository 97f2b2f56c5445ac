//! A `file` namespace moves data straight between the file and the
//! client's memory (the kernel reads and writes the DMA maps in place), and
//! a client that unmaps or shrinks that memory while reads into it are in
//! flight gets those reads completed, one way or the other, and a server
//! that lives on.
//!
//! A read whose memory shrank under it may still succeed: the kernel took
//! the pages when it started (O_DIRECT), and its data went with them. The
//! client lost its own memory; the server touched nothing it had not mapped.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use vnvme_spec::{Completion, NvmOpcode, Status};
use zerocopy::FromBytes;

use crate::guest::*;
use crate::peer::fds;

const BLOCK: usize = 4096;
/// Where the PRP lists of the reads in flight go, one page each.
const LISTS: u64 = RAM_IOVA + 0x40000;
/// Memory of the client's besides its RAM: what it unmaps or shrinks.
const EXTRA_IOVA: u64 = 0x2_0000_0000;
/// Reads in flight at once, of MDTS (128 KiB) each.
const READS: u16 = 32;
const READ_BLOCKS: u32 = 32;
const EXTRA_SIZE: u64 = READS as u64 * READ_BLOCKS as u64 * BLOCK as u64;

/// A namespace file of `blocks` blocks filled with a pattern that names
/// each block, in a directory of its own (removed on drop).
struct NsFile {
    dir: PathBuf,
    path: PathBuf,
}

impl NsFile {
    fn new(name: &str, blocks: u64) -> Self {
        let dir =
            std::env::temp_dir().join(format!("vnvme-hostile-file-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ns.img");
        let file = File::create(&path).unwrap();
        for lba in 0..blocks {
            file.write_all_at(&block(lba), lba * BLOCK as u64).unwrap();
        }
        // On the disk, so O_DIRECT reads wait for it rather than for a
        // write-back first.
        file.sync_all().unwrap();
        Self { dir, path }
    }

    /// `--ns` for it.
    fn spec(&self) -> String {
        let size = std::fs::metadata(&self.path).unwrap().len();
        format!("{size}:file={}", self.path.display())
    }

    fn read(&self, lba: u64, blocks: usize) -> Vec<u8> {
        let mut out = vec![0u8; blocks * BLOCK];
        File::open(&self.path)
            .unwrap()
            .read_exact_at(&mut out, lba * BLOCK as u64)
            .unwrap();
        out
    }
}

impl Drop for NsFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Block `lba`'s pattern as [`NsFile::new`] writes it.
fn block(lba: u64) -> Vec<u8> {
    (0..BLOCK as u64)
        .map(|i| (lba.wrapping_mul(131) ^ i.wrapping_mul(7)) as u8)
        .collect()
}

fn blocks(first: u64, n: u64) -> Vec<u8> {
    (first..first + n).flat_map(block).collect()
}

/// A read or write of `n` blocks at `lba` into client memory at `buf`
/// (page aligned or not): PRP2 is the next page, or a PRP list written at
/// `list` (in RAM).
fn transfer(
    g: &Guest,
    op: NvmOpcode,
    lba: u64,
    n: u32,
    buf: u64,
    list: u64,
) -> vnvme_spec::Command {
    let first_page = buf & !0xFFF;
    let pages = (buf + u64::from(n) * BLOCK as u64 - first_page).div_ceil(0x1000);
    let prp2 = match pages {
        1 => 0,
        2 => first_page + 0x1000,
        _ => {
            let entries: Vec<u8> = (1..pages)
                .flat_map(|p| (first_page + p * 0x1000).to_le_bytes())
                .collect();
            g.write_mem(list, &entries);
            list
        }
    };
    rw(op, lba, n, buf, prp2)
}

fn bounced(srv: &Served) -> u64 {
    srv.ctrl.stats().bounced_bytes
}

#[test]
fn file_namespace_reads_and_writes_move_in_place_in_every_prp_shape() {
    let ns = NsFile::new("in-place", 256);
    let srv = Served::with_namespace(&ns.spec());
    let mut g = ready(&srv);
    let before = bounced(&srv);
    // (blocks, offset of the buffer into its page): one page, two (PRP2),
    // a PRP list, and a buffer 512 bytes into its page, which O_DIRECT
    // may refuse: the page cache then moves it, still in place.
    let shapes = [(1u32, 0u64), (2, 0), (8, 0), (3, 0x200)];
    for (i, &(n, skew)) in shapes.iter().enumerate() {
        let lba = 16 * i as u64;
        let src = DATA + skew;
        let data = blocks(1000 + lba, u64::from(n));
        g.write_mem(src, &data);
        let c = g.submit(1, transfer(&g, NvmOpcode::WRITE, lba, n, src, LISTS));
        assert_eq!(c.status(), Status::SUCCESS, "write of {n} at +{skew:#x}");
        assert_eq!(ns.read(lba, n as usize), data, "the write is in the file");

        let dst = DATA + 0x10_0000 + skew;
        g.mem
            .fill((dst - RAM_IOVA) as usize, data.len(), 0xEE)
            .unwrap();
        let c = g.submit(1, transfer(&g, NvmOpcode::READ, lba, n, dst, LISTS));
        assert_eq!(c.status(), Status::SUCCESS, "read of {n} at +{skew:#x}");
        assert_eq!(
            g.read_mem(dst, data.len()),
            data,
            "read of {n} at +{skew:#x}"
        );
    }
    assert_eq!(bounced(&srv) - before, 0, "no byte went through a buffer");

    // Memory reached by messages (a map without an fd) cannot be handed
    // to the kernel: that read bounces, and still arrives.
    let remote = Arc::new(Mutex::new(vec![0u8; 0x10000]));
    g.client
        .dma_map_without_fd(EXTRA_IOVA, Arc::clone(&remote))
        .unwrap();
    let c = g.submit(1, transfer(&g, NvmOpcode::READ, 5, 2, EXTRA_IOVA, LISTS));
    assert_eq!(c.status(), Status::SUCCESS, "read into a map without an fd");
    assert_eq!(remote.lock()[..2 * BLOCK], blocks(5, 2)[..]);
    assert_eq!(bounced(&srv) - before, 2 * BLOCK as u64);
    g.finish(&srv);
}

/// The client's extra memory, a file it can shrink, mapped at EXTRA_IOVA.
fn map_extra(g: &Guest) -> File {
    let file = File::from(fds::shm_file(EXTRA_SIZE));
    g.client
        .dma_map(EXTRA_IOVA, EXTRA_SIZE, file.as_fd(), 0, true)
        .unwrap();
    file
}

/// Completions posted on `qid`'s CQ and not yet reaped, read without
/// consuming them.
fn posted(g: &Guest, qid: u16) -> usize {
    let r = g.rings[usize::from(qid)].expect("queue");
    let mut n = 0;
    let (mut head, mut phase) = (r.head, r.phase);
    while n < usize::from(r.cq_size) {
        let cqe =
            Completion::read_from_bytes(&g.read_mem(r.cq + u64::from(head) * 16, 16)).unwrap();
        if cqe.phase() != phase {
            break;
        }
        n += 1;
        head += 1;
        if head == r.cq_size {
            head = 0;
            phase = !phase;
        }
    }
    n
}

/// What the client does to its extra memory while reads into it are in
/// flight.
#[derive(Debug, Clone, Copy)]
enum PullAway {
    Unmap,
    Shrink,
}

/// [`READS`] reads of 128 KiB into the extra memory, then, once the server
/// has fetched them all and before they have all completed, `how`. Every
/// read completes, with success or a Data Transfer Error; after an unmap,
/// a read that succeeded put its data in the client's memory (the pages
/// stayed mapped for the kernel until it was done). The server serves on,
/// and reads into memory mapped again land. Tried a few times until a
/// round catches reads in flight (storage can be fast).
fn reads_in_flight_survive(how: PullAway) {
    let ns = NsFile::new(
        &format!("{how:?}"),
        u64::from(READS) * u64::from(READ_BLOCKS),
    );
    let srv = Served::with_namespace(&ns.spec());
    let mut g = ready(&srv);
    let mut caught = false;
    for round in 0..5 {
        let extra = map_extra(&g);
        let fetched = g.stats(&srv).queue(1).commands;
        let mut tail = 0;
        // The first block of each read, by command id.
        let mut lbas = std::collections::HashMap::new();
        for i in 0..u64::from(READS) {
            let lba = i * u64::from(READ_BLOCKS);
            let buf = EXTRA_IOVA + lba * BLOCK as u64;
            let c = transfer(
                &g,
                NvmOpcode::READ,
                lba,
                READ_BLOCKS,
                buf,
                LISTS + i * 0x1000,
            );
            tail = g.stage(1, c);
            lbas.insert(g.cid, lba);
        }
        g.ring(1, 0, tail);
        let deadline = Instant::now() + TIMEOUT;
        while g.stats(&srv).queue(1).commands < fetched + u64::from(READS) {
            assert!(Instant::now() < deadline, "the server fetches the reads");
            std::hint::spin_loop();
        }
        let done_before = posted(&g, 1);
        match how {
            PullAway::Unmap => g.client.dma_unmap(EXTRA_IOVA, EXTRA_SIZE).unwrap(),
            PullAway::Shrink => extra.set_len(0).unwrap(),
        }
        caught |= done_before < usize::from(READS);
        let mut statuses = Vec::new();
        for _ in 0..READS {
            let c = g
                .reap_within(1, TIMEOUT)
                .expect("every read completes after the memory was pulled away");
            statuses.push((c.cid(), c.status()));
        }
        for &(_, s) in &statuses {
            assert!(s == Status::SUCCESS || s == dte(), "round {round}: {s:?}");
        }
        if let PullAway::Unmap = how {
            for (cid, s) in statuses {
                if s != Status::SUCCESS {
                    continue;
                }
                let lba = lbas[&cid];
                let mut got = vec![0u8; READ_BLOCKS as usize * BLOCK];
                extra.read_exact_at(&mut got, lba * BLOCK as u64).unwrap();
                assert!(
                    got == blocks(lba, u64::from(READ_BLOCKS)),
                    "round {round}: the read at {lba} succeeded, so its data is there"
                );
            }
        } else {
            g.client.dma_unmap(EXTRA_IOVA, EXTRA_SIZE).unwrap();
        }
        g.assert_serving();
        if caught {
            break;
        }
        eprintln!("round {round}: every read completed before the {how:?}; again");
    }
    assert!(
        caught,
        "no round caught reads in flight: storage too fast for this test"
    );
    // Memory mapped again takes reads.
    let extra = map_extra(&g);
    let c = g.submit(1, transfer(&g, NvmOpcode::READ, 7, 4, EXTRA_IOVA, LISTS));
    assert_eq!(c.status(), Status::SUCCESS);
    let mut got = vec![0u8; 4 * BLOCK];
    extra.read_exact_at(&mut got, 0).unwrap();
    assert!(got == blocks(7, 4), "read into memory mapped again");
    g.finish(&srv);
}

#[test]
fn dma_unmap_under_file_reads_in_flight_waits_for_them_and_the_server_lives() {
    reads_in_flight_survive(PullAway::Unmap);
}

#[test]
fn shrinking_memory_under_file_reads_in_flight_fails_or_completes_them_and_the_server_lives() {
    reads_in_flight_survive(PullAway::Shrink);
}
