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
    round_or(access, q, blocks, r, write, &String::new);
}

/// As [`round`]; a timeout's panic also says what `server` returns (its
/// log: why a server stopped completing is there, not in the client).
pub fn round_or(
    access: &VfioUserAccess,
    q: &mut IoQueue,
    blocks: u64,
    r: u64,
    write: bool,
    server: &dyn Fn() -> String,
) {
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
        reap_or(q, blocks as usize, server);
    }
    let reads: Vec<_> = (0..blocks)
        .map(|_| access.dma_alloc(BLOCK).unwrap())
        .collect();
    for (lba, b) in reads.iter().enumerate() {
        q.enqueue_rw(NvmOpcode::READ, 1, lba as u64, 1, b).unwrap();
    }
    q.ring().unwrap();
    reap_or(q, blocks as usize, server);
    for (lba, b) in reads.iter().enumerate() {
        assert!(b.to_vec() == block(lba as u64, r), "LBA {lba}, round {r}");
    }
}

/// Reaps `n` completions: all successful, each command once.
pub fn reap(q: &mut IoQueue, n: usize) {
    reap_or(q, n, &String::new);
}

/// As [`reap`]; a timeout's panic also says what `server` returns.
pub fn reap_or(q: &mut IoQueue, n: usize, server: &dyn Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut done = Vec::new();
    while done.len() < n {
        if Instant::now() >= deadline {
            panic!(
                "{} of {n} completed; the server said:\n{}",
                done.len(),
                server()
            );
        }
        let want = n - done.len();
        let _ = q.wait(&mut done, want, Duration::from_secs(1));
    }
    assert!(done.iter().all(|c| c.status().is_success()), "{done:?}");
    let mut cids: Vec<u16> = done.iter().map(|c| c.cid()).collect();
    cids.sort_unstable();
    cids.dedup();
    assert_eq!(cids.len(), n, "each command completed once");
}
