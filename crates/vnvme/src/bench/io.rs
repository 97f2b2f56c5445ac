//! The I/O loop of one benchmark thread: keep `qd` commands in flight on
//! one queue pair for the runtime, like fio's `iodepth`. With `--verify`,
//! each thread stays in its own stripe and checks what it reads (see
//! [`super::verify`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use vnvme_driver::{DeviceAccess, DmaBuffer, IoQueue};
use vnvme_spec::NvmOpcode;

use super::rng::Rng;
use super::verify::{self, Stripe};
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

/// Latencies in nanoseconds as a log-linear histogram: values below 128 are
/// exact, larger ones land in one of 64 buckets per power of two (under 1%
/// apart). A fixed 14 KiB however long the run, so a soak's RSS stays flat.
#[derive(Debug, Clone)]
struct Histogram {
    counts: Vec<u64>,
    total: u64,
}

impl Histogram {
    const SUB_BITS: u32 = 6;
    /// Up to `index(u32::MAX)`: shift 31 - SUB_BITS, plus two ranges of 64.
    const BUCKETS: usize = (33 - Self::SUB_BITS as usize) << Self::SUB_BITS;

    fn new() -> Self {
        Self {
            counts: vec![0; Self::BUCKETS],
            total: 0,
        }
    }

    fn index(v: u32) -> usize {
        let msb = 31u32.saturating_sub(v.leading_zeros());
        if msb <= Self::SUB_BITS {
            return v as usize;
        }
        // Keep the top SUB_BITS + 1 bits: (v >> shift) is in [64, 128).
        let shift = msb - Self::SUB_BITS;
        ((shift as usize) << Self::SUB_BITS) + (v >> shift) as usize
    }

    /// The middle of bucket `i`'s value range.
    fn value(i: usize) -> f64 {
        let sub = 1usize << Self::SUB_BITS;
        if i < 2 * sub {
            return i as f64;
        }
        let shift = (i >> Self::SUB_BITS) - 1;
        let low = ((i & (sub - 1)) + sub) << shift;
        low as f64 + ((1usize << shift) - 1) as f64 / 2.0
    }

    fn record(&mut self, v: u32) {
        self.counts[Self::index(v)] += 1;
        self.total += 1;
    }

    fn add(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
    }

    /// The value of the sample at `rank` (0-based) in sorted order.
    fn at_rank(&self, rank: u64) -> f64 {
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen > rank {
                return Self::value(i);
            }
        }
        0.0
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

/// What one or more threads measured.
#[derive(Debug, Default)]
pub struct Summary {
    pub ios: u64,
    pub errors: u64,
    /// Reads checked against the expected pattern (`--verify`).
    pub verified_reads: u64,
    /// Reads that did not hold what the last completed write put there.
    pub verify_errors: u64,
    pub elapsed: Duration,
    /// Per-I/O latencies (submission to reaping).
    latencies: Histogram,
}

impl Summary {
    pub fn merge(parts: Vec<Summary>) -> Summary {
        let mut all = Summary::default();
        for p in parts {
            all.ios += p.ios;
            all.errors += p.errors;
            all.verified_reads += p.verified_reads;
            all.verify_errors += p.verify_errors;
            all.elapsed = all.elapsed.max(p.elapsed);
            all.latencies.add(&p.latencies);
        }
        all
    }

    /// One completed I/O of `latency` (submission to reaping).
    pub fn record(&mut self, latency: Duration, ok: bool) {
        self.ios += 1;
        self.errors += u64::from(!ok);
        self.latencies
            .record(u32::try_from(latency.as_nanos()).unwrap_or(u32::MAX));
    }

    /// The `p`th percentile latency in microseconds (0 with no samples).
    pub fn percentile_us(&self, p: f64) -> f64 {
        let n = self.latencies.total;
        if n == 0 {
            return 0.0;
        }
        let rank = ((p / 100.0) * (n - 1) as f64).round() as u64;
        self.latencies.at_rank(rank.min(n - 1)) / 1000.0
    }
}

/// Runs `pattern` on every queue at once, one thread each, verifying with
/// `stripes` (one per queue) if given, and
/// calling `tick` about every `tick_every` while the threads run.
pub fn run_threads_with(
    queues: &mut [IoQueue],
    stripes: Option<&mut [Stripe]>,
    access: &Arc<dyn DeviceAccess>,
    pattern: &Pattern,
    tick_every: Duration,
    tick: &mut dyn FnMut(),
) -> Result<Vec<Summary>> {
    let mut stripes: Vec<Option<&mut Stripe>> = match stripes {
        Some(s) if s.len() == queues.len() => s.iter_mut().map(Some).collect(),
        Some(s) => bail!("{} stripes for {} queues", s.len(), queues.len()),
        None => queues.iter().map(|_| None).collect(),
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = queues
            .iter_mut()
            .zip(stripes.iter_mut().map(Option::take))
            .enumerate()
            .map(|(i, (q, stripe))| {
                let access = Arc::clone(access);
                s.spawn(move || run_one(q, stripe, &access, pattern, thread_seed(i)))
            })
            .collect();
        let mut next_tick = Instant::now().checked_add(tick_every);
        while !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(50));
            if let Some(at) = next_tick.filter(|&at| Instant::now() >= at) {
                tick();
                next_tick = at.checked_add(tick_every);
            }
        }
        join_all(handles)
    })
}

/// The random seed of benchmark thread `i`: distinct per thread, the same
/// in every run.
pub fn thread_seed(i: usize) -> u64 {
    0x9E37_79B9_7F4A_7C15 ^ (i as u64 + 1)
}

/// Waits for every benchmark thread; one that panicked is an error.
pub fn join_all<T>(handles: Vec<std::thread::ScopedJoinHandle<'_, Result<T>>>) -> Result<Vec<T>> {
    handles
        .into_iter()
        .map(|h| {
            h.join()
                .unwrap_or_else(|_| bail!("a benchmark thread panicked"))
        })
        .collect()
}

/// One command in flight.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    slot: usize,
    t0: Instant,
    /// Block within the thread's range.
    block: u64,
    /// The generation a write carries (`--verify`); `None` for a read.
    write_gen: Option<u32>,
}

/// Runs `pattern` on `q` in this thread, checking what it reads against
/// `stripe` if given.
pub fn run_one(
    q: &mut IoQueue,
    mut stripe: Option<&mut Stripe>,
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
    // Where this thread's blocks are: the whole namespace, or its stripe.
    let (first_block, span) = match &stripe {
        Some(st) => {
            // Every command needs a block with nothing else in flight.
            if st.blocks() <= qd as u64 {
                bail!(
                    "--verify needs more than {qd} blocks per queue; the stripe has {}",
                    st.blocks()
                );
            }
            (st.first_block, st.blocks())
        }
        None => (0, slots_in_ns),
    };
    let block_bytes = pattern.block_size as usize;
    let sectors_per_block = (block_bytes / verify::SECTOR) as u64;
    if stripe.is_some() && !block_bytes.is_multiple_of(verify::SECTOR) {
        bail!("--verify needs a block size that is a multiple of 512");
    }
    let bufs: Vec<DmaBuffer> = (0..qd)
        .map(|_| access.dma_alloc(block_bytes))
        .collect::<Result<_, _>>()?;
    let mut inflight: Vec<Option<InFlight>> = vec![None; usize::from(u16::MAX) + 1];
    let mut rng = Rng::new(seed);
    let mut scratch = vec![0u8; block_bytes];
    let mut out = Summary::default();

    let mut submit = |q: &mut IoQueue,
                      inflight: &mut [Option<InFlight>],
                      stripe: &mut Option<&mut Stripe>,
                      slot: usize,
                      rng: &mut Rng|
     -> Result<()> {
        let mut block = rng.next_u64() % span;
        if let Some(st) = stripe.as_deref() {
            // Redraw a block that has a command in flight; the stripe has
            // more blocks than the queue depth, so a scan always ends.
            let mut tries = 0;
            while st.is_busy(block) {
                tries += 1;
                block = if tries < 16 {
                    rng.next_u64() % span
                } else {
                    (block + 1) % span
                };
            }
        }
        let lba = (first_block + block) * u64::from(nlb);
        let write = match pattern.rw {
            Rw::Randread => false,
            Rw::Randwrite => true,
            Rw::Randrw => rng.next_u64() & 1 == 1,
        };
        let mut write_gen = None;
        if let Some(st) = stripe.as_deref_mut() {
            if write {
                let gen = st.start_write(block);
                let sector = (first_block + block) * sectors_per_block;
                verify::fill(&mut scratch, sector, gen, st.thread());
                bufs[slot].write_bytes(0, &scratch)?;
                write_gen = Some(gen);
            } else {
                st.start_read(block);
                // A read that moves no data must not pass on what the
                // buffer held before.
                bufs[slot].fill(0, block_bytes, 0xA5)?;
            }
        }
        let op = if write {
            NvmOpcode::WRITE
        } else {
            NvmOpcode::READ
        };
        let cid = q.enqueue_rw(op, NSID, lba, nlb, &bufs[slot])?;
        inflight[usize::from(cid)] = Some(InFlight {
            slot,
            t0: Instant::now(),
            block,
            write_gen,
        });
        Ok(())
    };

    let start = Instant::now();
    let deadline = start + pattern.runtime;
    let per_io = pattern.submit == Submit::PerIo;
    for slot in 0..qd {
        submit(q, &mut inflight, &mut stripe, slot, &mut rng)?;
        if per_io {
            q.ring()?;
        }
    }
    q.ring()?;
    let mut done = Vec::with_capacity(256);
    let mut free_slots = Vec::with_capacity(qd);
    let mut readback = vec![0u8; block_bytes];
    while q.outstanding() > 0 {
        done.clear();
        q.wait(&mut done, 256, Duration::from_secs(10))
            .context("waiting for completions")?;
        let now = Instant::now();
        // Account for the whole batch before submitting again: the driver has
        // already released these CIDs, so a new command may reuse one of them.
        for c in &done {
            let Some(io) = inflight
                .get_mut(usize::from(c.cid()))
                .and_then(Option::take)
            else {
                continue;
            };
            let ok = c.status().is_success();
            out.record(now.duration_since(io.t0), ok);
            if let Some(st) = stripe.as_deref_mut() {
                match io.write_gen {
                    Some(gen) => st.end_write(io.block, gen, ok),
                    None => {
                        let expect = st.end_read(io.block);
                        if let (Some(expect), true) = (expect, ok) {
                            bufs[io.slot].read_bytes(0, &mut readback)?;
                            let sector = (first_block + io.block) * sectors_per_block;
                            out.verified_reads += 1;
                            if let Err(m) = verify::check(&readback, sector, expect) {
                                out.verify_errors += 1;
                                st.report(&m);
                            }
                        }
                    }
                }
            }
            free_slots.push(io.slot);
        }
        if now < deadline && !free_slots.is_empty() {
            for slot in free_slots.drain(..) {
                submit(q, &mut inflight, &mut stripe, slot, &mut rng)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_contiguous_and_within_one_percent() {
        let mut last = 0;
        for v in (0..1_000_000u32).chain([u32::MAX - 1, u32::MAX]) {
            let i = Histogram::index(v);
            assert!(
                i == last || i == last + 1 || v >= u32::MAX - 1,
                "{v}: {i} after {last}"
            );
            assert!(i < Histogram::BUCKETS, "{v}: {i}");
            let mid = Histogram::value(i);
            assert!(
                (mid - f64::from(v)).abs() <= f64::from(v) / 100.0,
                "{v}: {mid}"
            );
            last = i;
        }
    }

    #[test]
    fn percentiles_come_from_the_merged_histograms() {
        let mut a = Summary::default();
        let mut b = Summary::default();
        for ns in 1..=99u32 {
            a.latencies.record(ns * 1000);
        }
        b.latencies.record(1_000_000);

        let all = Summary::merge(vec![a, b]);

        let p50 = all.percentile_us(50.0);
        assert!((p50 - 50.5).abs() < 0.5, "{p50}");
        let p100 = all.percentile_us(100.0);
        assert!((p100 - 1000.0).abs() < 10.0, "{p100}");
    }
}
