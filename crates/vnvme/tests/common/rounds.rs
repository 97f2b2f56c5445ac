//! Verified rounds of I/O through our driver: every block written with a
//! round's own pattern, read back and compared, each command completed
//! exactly once (what the upgrade and crash tests check across a
//! handover or a kill).

use std::time::{Duration, Instant};

use vnvme_driver::{DeviceAccess, IoQueue, VfioUserAccess};
use vnvme_spec::NvmOpcode;

use super::pattern::pattern;

pub const BLOCK: usize = 4096;

/// Block `lba`'s contents in round `round`.
pub fn block(lba: u64, round: u64) -> Vec<u8> {
    pattern(BLOCK, (lba as u32) ^ ((round as u32) << 12))
}

/// One round over blocks `0..blocks`: writes each with round `r`'s pattern
/// (unless `write` is false: a check of what an earlier round wrote), reads
/// each back and compares. Panics on any error.
pub fn round(access: &VfioUserAccess, q: &mut IoQueue, blocks: u64, r: u64, write: bool) {
    if write {
        let bufs: Vec<_> = (0..blocks)
            .map(|lba| {
                let b = access.dma_alloc(BLOCK).unwrap();
                b.write_bytes(0, &block(lba, r)).unwrap();
                b
            })
            .collect();
        for (lba, b) in bufs.iter().enumerate() {
            q.enqueue_rw(NvmOpcode::WRITE, 1, lba as u64, 1, b).unwrap();
        }
        q.ring().unwrap();
        reap(q, blocks as usize);
    }
    let reads: Vec<_> = (0..blocks)
        .map(|_| access.dma_alloc(BLOCK).unwrap())
        .collect();
    for (lba, b) in reads.iter().enumerate() {
        q.enqueue_rw(NvmOpcode::READ, 1, lba as u64, 1, b).unwrap();
    }
    q.ring().unwrap();
    reap(q, blocks as usize);
    for (lba, b) in reads.iter().enumerate() {
        assert!(b.to_vec() == block(lba as u64, r), "LBA {lba}, round {r}");
    }
}

/// Reaps `n` completions: all successful, each command once.
pub fn reap(q: &mut IoQueue, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut done = Vec::new();
    while done.len() < n {
        assert!(Instant::now() < deadline, "{} of {n} completed", done.len());
        let want = n - done.len();
        let _ = q.wait(&mut done, want, Duration::from_secs(1));
    }
    assert!(done.iter().all(|c| c.status().is_success()), "{done:?}");
    let mut cids: Vec<u16> = done.iter().map(|c| c.cid()).collect();
    cids.sort_unstable();
    cids.dedup();
    assert_eq!(cids.len(), n, "each command completed once");
}
