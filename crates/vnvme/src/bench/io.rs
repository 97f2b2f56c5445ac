//! The I/O loop of one benchmark thread: keep `qd` commands in flight on
//! one queue pair for the runtime, like fio's `iodepth`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use vnvme_driver::{DeviceAccess, DmaBuffer, IoQueue};
use vnvme_spec::NvmOpcode;

use super::Rw;

/// What each thread does.
#[derive(Debug, Clone, Copy)]
pub struct Pattern {
    pub rw: Rw,
    pub qd: u16,
    pub runtime: Duration,
    pub block_size: u32,
    pub submit: Submit,
}

/// When the driver writes the SQ tail doorbell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Submit {
    /// After every command, as a guest kernel's queue_rq does (what the seed measured).
    PerIo,
    /// Once for all the commands a reaped batch frees.
    Batch,
}

/// What one or more threads measured.
#[derive(Debug, Default)]
pub struct Summary {
    pub ios: u64,
    pub errors: u64,
    pub elapsed: Duration,
    /// Per-I/O latencies in nanoseconds (submission to reaping), sorted after merge.
    latencies_ns: Vec<u32>,
}

impl Summary {
    pub fn merge(parts: Vec<Summary>) -> Summary {
        let mut all = Summary::default();
        for p in parts {
            all.ios += p.ios;
            all.errors += p.errors;
            all.elapsed = all.elapsed.max(p.elapsed);
            all.latencies_ns.extend(p.latencies_ns);
        }
        all.latencies_ns.sort_unstable();
        all
    }

    /// The `p`th percentile latency in microseconds (0 with no samples).
    pub fn percentile_us(&self, p: f64) -> f64 {
        let n = self.latencies_ns.len();
        if n == 0 {
            return 0.0;
        }
        let rank = ((p / 100.0) * (n - 1) as f64).round() as usize;
        f64::from(self.latencies_ns[rank.min(n - 1)]) / 1000.0
    }
}

/// Runs `pattern` on every queue at once, one thread each.
pub fn run_threads(
    queues: &mut [IoQueue],
    access: &Arc<dyn DeviceAccess>,
    pattern: &Pattern,
) -> Result<Vec<Summary>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = queues
            .iter_mut()
            .enumerate()
            .map(|(i, q)| {
                let access = Arc::clone(access);
                s.spawn(move || {
                    run_one(q, &access, pattern, 0x9E37_79B9_7F4A_7C15 ^ (i as u64 + 1))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| bail!("a benchmark thread panicked"))
            })
            .collect()
    })
}

/// xorshift64*: cheap, good enough to spread LBAs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

fn run_one(
    q: &mut IoQueue,
    access: &Arc<dyn DeviceAccess>,
    pattern: &Pattern,
    seed: u64,
) -> Result<Summary> {
    const NSID: u32 = 1;
    let ns = q.namespace(NSID).context("namespace 1")?;
    let (lba_size, blocks) = (ns.lba_size, ns.blocks);
    if lba_size == 0 || !pattern.block_size.is_multiple_of(lba_size) {
        bail!(
            "block size {} is not a multiple of the LBA size {lba_size}",
            pattern.block_size
        );
    }
    let nlb = pattern.block_size / lba_size;
    let slots_in_ns = blocks / u64::from(nlb);
    if slots_in_ns == 0 {
        bail!(
            "the namespace is smaller than one {}-byte block",
            pattern.block_size
        );
    }
    let qd = usize::from(pattern.qd);
    if qd >= usize::from(q.size()) {
        bail!(
            "queue depth {qd} does not fit a queue of {} entries",
            q.size()
        );
    }
    let bufs: Vec<DmaBuffer> = (0..qd)
        .map(|_| access.dma_alloc(pattern.block_size as usize))
        .collect::<Result<_, _>>()?;
    // In flight, indexed by command identifier: (buffer, submission time).
    let mut inflight: Vec<Option<(usize, Instant)>> = vec![None; usize::from(u16::MAX) + 1];
    let mut rng = Rng(seed);
    let mut out = Summary {
        latencies_ns: Vec::with_capacity(1 << 20),
        ..Summary::default()
    };

    let submit = |q: &mut IoQueue,
                  inflight: &mut [Option<(usize, Instant)>],
                  slot: usize,
                  rng: &mut Rng|
     -> Result<()> {
        let lba = (rng.next() % slots_in_ns) * u64::from(nlb);
        let write = match pattern.rw {
            Rw::Randread => false,
            Rw::Randwrite => true,
            Rw::Randrw => rng.next() & 1 == 1,
        };
        let op = if write {
            NvmOpcode::WRITE
        } else {
            NvmOpcode::READ
        };
        let cid = q.enqueue_rw(op, NSID, lba, nlb, &bufs[slot])?;
        inflight[usize::from(cid)] = Some((slot, Instant::now()));
        Ok(())
    };

    let start = Instant::now();
    let deadline = start + pattern.runtime;
    let per_io = pattern.submit == Submit::PerIo;
    for slot in 0..qd {
        submit(q, &mut inflight, slot, &mut rng)?;
        if per_io {
            q.ring()?;
        }
    }
    q.ring()?;
    let mut done = Vec::with_capacity(256);
    let mut free_slots = Vec::with_capacity(qd);
    while q.outstanding() > 0 {
        done.clear();
        q.wait(&mut done, 256, Duration::from_secs(10))
            .context("waiting for completions")?;
        let now = Instant::now();
        // Account for the whole batch before submitting again: the driver has
        // already released these CIDs, so a new command may reuse one of them.
        for c in &done {
            let Some((slot, t0)) = inflight
                .get_mut(usize::from(c.cid()))
                .and_then(Option::take)
            else {
                continue;
            };
            out.ios += 1;
            if !c.status().is_success() {
                out.errors += 1;
            }
            out.latencies_ns
                .push(u32::try_from(now.duration_since(t0).as_nanos()).unwrap_or(u32::MAX));
            free_slots.push(slot);
        }
        if now < deadline && !free_slots.is_empty() {
            for slot in free_slots.drain(..) {
                submit(q, &mut inflight, slot, &mut rng)?;
                if per_io {
                    q.ring()?;
                }
            }
            if !per_io {
                q.ring()?;
            }
        }
        free_slots.clear();
    }
    out.elapsed = start.elapsed();
    Ok(out)
}
