//! `vnvme bench passthru`: the seed's table (nvme-async-passthrough.txt) —
//! 4 KiB random reads at queue depths 1 to 128 through synchronous
//! passthrough, asynchronous passthrough and the driver's block read API,
//! with the controller and the driver in one process over a real vfio-user
//! socketpair.
//!
//! Synchronous passthrough has one command in flight by construction: one
//! caller thread submits a command and waits for it before the next, as
//! fio's sync engines ignore `iodepth`. Its rows therefore all measure
//! depth 1; the column is repeated so the table reads like the seed's.
//!
//! With `--guest`, the same table through a Linux kernel, as the seed
//! measured it (see [`super::guest::passthru`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;
use vnvme_driver::{
    AsyncCompletion, AsyncQueue, BufferSlice, DeviceAccess, DmaBuffer, InitOptions, IoQueue,
    PassthruData,
};
use vnvme_spec::cdw::Cdw12ReadWrite;
use vnvme_spec::{Command, NvmOpcode};

use super::io::{self as block, Pattern, Submit};
use super::rng::Rng;
use super::{BackendArg, List, Rw};
use crate::device::DeviceOptions;
use crate::identity::Origin;
use crate::inproc::InProcess;
use crate::namespace::NamespaceSpec;
use crate::size::parse_size;

use super::thread_use::ThreadUse;

const NSID: u32 = 1;
const BLOCK: usize = 4096;
pub(super) const SYNC_NOTE: &str =
    "sync passthrough keeps one command in flight by construction (one caller, \
     submit then wait, like fio's sync engine ignoring iodepth): its QD column is always 1";

/// The API a run goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// `IoQueue::passthru`: submit, wait, one at a time.
    Sync,
    /// `AsyncQueue`: tokens, registered buffers, batched doorbells and reaping.
    Async,
    /// `IoQueue::enqueue_rw` + `ring` + `wait`, as `vnvme bench` does.
    Block,
}

impl std::str::FromStr for Api {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        <Self as ValueEnum>::from_str(s, true)
    }
}

#[derive(Args, Debug, Clone)]
pub struct PassthruOptions {
    /// Queue depths, comma separated (1 to 1023).
    #[arg(long, default_value = "1,2,4,8,16,32,64,128")]
    pub qd: List<u16>,
    /// APIs to measure, comma separated (sync, async, block).
    #[arg(long, default_value = "sync,async,block")]
    pub apis: List<Api>,
    /// Seconds per measured point (fractions allowed; default 1, with --guest 5 whole seconds).
    #[arg(long)]
    pub runtime: Option<f64>,
    /// Namespace backend (with --guest: of the `vnvme serve` namespace; `file` is a temporary file).
    #[arg(long, value_enum, default_value = "null")]
    pub backend: BackendArg,
    /// Namespace size.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub size: u64,
    /// When async and block ring the SQ doorbell: once for all the commands
    /// a reaped batch frees (batch, io_uring style) or after every command
    /// (per-io, like a kernel's queue_rq). Sync rings once per command.
    #[arg(long, value_enum, default_value = "batch", conflicts_with = "guest")]
    pub submit: Submit,
    /// Reap completions by busy polling instead of waiting for interrupts.
    #[arg(long, conflicts_with = "guest")]
    pub poll: bool,
    /// Measure inside the tests/guest Linux guest (QEMU, TCG; as root) on a `vnvme serve`
    /// namespace: sync = our static nvme-sync-read (one NVME_IOCTL_IO64_CMD at a time) on
    /// /dev/ng0n1, async = fio io_uring_cmd on /dev/ng0n1, block = fio io_uring on /dev/nvme0n1.
    #[arg(long)]
    pub guest: bool,
    /// Measure every point this many times, all depths and APIs in turn each time, and report
    /// each point's median, and async/block compared within each pass (figures swing with the
    /// host's load; interleaving spreads it over the APIs alike).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=100))]
    pub reps: u16,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// One measured point. The field names are read by other tools: keep them.
#[derive(Debug, Clone, Serialize)]
pub struct PassthruRun {
    pub api: Api,
    pub qd: u16,
    pub iops: f64,
    pub lat_p50_us: f64,
    pub lat_p99_us: f64,
    pub ios: u64,
    pub errors: u64,
    /// What the server's counters say, per I/O (in process only).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerCounts>,
    /// What the thread that drove the API used, per I/O (in process only).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub driver: Option<DriverThread>,
}

/// The submitting thread's use per I/O: its CPU time, and how often it
/// slept for a completion (1 at QD 1 means every command's completion woke
/// it: an interrupt's eventfd, not a reap in passing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct DriverThread {
    pub cpu_us_per_io: f64,
    pub sleeps_per_io: f64,
}

/// The controller's counters over one point, per I/O: what a QD 1 command
/// costs besides the driver's own work.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ServerCounts {
    /// SQ and CQ doorbell writes that trapped to the server.
    pub traps_per_io: f64,
    /// MSI-X interrupts the controller sent.
    pub interrupts_per_io: f64,
    /// Times the server's queue worker woke from sleep.
    pub wakeups_per_io: f64,
}

/// Runs the benchmark, prints the table, writes the JSON if asked.
pub fn main(opts: &PassthruOptions) -> Result<()> {
    let samples = run(opts)?;
    let runs = medians(&samples);
    if opts.reps > 1 {
        println!("(each figure the median of its {} passes)", opts.reps);
    }
    print!("{}", table(&runs));
    print!("{}", paired(&samples, opts.apis.0.len() * opts.qd.0.len()));
    print!("{}", shape(&runs));
    if let Some(path) = &opts.json {
        let doc = serde_json::json!({
            "runs": runs,
            "samples": samples,
            "reps": opts.reps,
            "note": SYNC_NOTE,
            "machine": super::report::machine(),
        });
        super::write_json(path, &doc, "bench passthru")?;
    }
    Ok(())
}

/// Every point's sample of every pass, in the order measured.
pub fn run(opts: &PassthruOptions) -> Result<Vec<PassthruRun>> {
    let runtime = super::check_runtime(opts.runtime.unwrap_or(1.0))?;
    super::check_qd(&opts.qd.0)?;
    let max_qd = opts.qd.0.iter().copied().max().unwrap_or(1);
    let file = super::BenchFile::new(None);
    let spec = NamespaceSpec::new(opts.size, opts.backend.backend(file.path()));
    let device_opts = DeviceOptions {
        max_io_queues: 1,
        ..DeviceOptions::default()
    };
    let device = device_opts.build(&[spec], &Origin::embedded())?;
    let init = InitOptions {
        io_queues: 1,
        // A ring of N entries holds N - 1 commands.
        queue_depth: max_qd.saturating_add(1).max(2),
        interrupts: !opts.poll,
        ..InitOptions::default()
    };
    // The server lives as long as `inproc`: the driver talks to it below.
    let (inproc, access, driver) = InProcess::start_driver(device, init)?;
    let blocks = driver
        .namespaces()
        .iter()
        .find(|n| n.nsid == NSID)
        .filter(|n| n.lba_size as usize == BLOCK)
        .map(|n| n.blocks)
        .context("namespace 1 with 4096-byte blocks")?;
    let mut q = Some(driver.take_io_queue(0)?);
    let total = opts.apis.0.len() * opts.qd.0.len() * usize::from(opts.reps);
    eprintln!(
        "bench passthru: {total} points ({} passes) of {:.1} s, 4 KiB random reads, {} doorbells, {:?} submission, {}",
        opts.reps,
        runtime.as_secs_f64(),
        device_opts.doorbells,
        opts.submit,
        if opts.poll { "polling" } else { "interrupts" }
    );
    eprintln!("bench passthru: {SYNC_NOTE}");
    let mut runs = Vec::new();
    let passes = (0..opts.reps).flat_map(|_| &opts.qd.0);
    for &qd in passes {
        for &api in &opts.apis.0 {
            let queue = q.take().context("the I/O queue was lost")?;
            let before = inproc.controller().stats();
            let (queue, mut run) = measure(api, qd, queue, &access, blocks, runtime, opts.submit)?;
            let after = inproc.controller().stats();
            let per_io = |a: u64, b: u64| a.saturating_sub(b) as f64 / run.ios.max(1) as f64;
            let server = ServerCounts {
                traps_per_io: per_io(
                    after.sq_doorbell_traps + after.cq_doorbell_traps,
                    before.sq_doorbell_traps + before.cq_doorbell_traps,
                ),
                interrupts_per_io: per_io(after.interrupts, before.interrupts),
                wakeups_per_io: per_io(after.worker_wakeups, before.worker_wakeups),
            };
            run.server = Some(server);
            q = Some(queue);
            eprintln!(
                "bench passthru: [{:>2}/{total}] {:<5} qd {:>3}: {:>9.0} IOPS, p50 {:.1} us, p99 {:.1} us; \
                 per I/O: {:.2} traps, {:.2} interrupts, {:.2} worker wake-ups, driver {} us CPU, {} sleeps",
                runs.len() + 1,
                format!("{api:?}").to_lowercase(),
                qd,
                run.iops,
                run.lat_p50_us,
                run.lat_p99_us,
                server.traps_per_io,
                server.interrupts_per_io,
                server.wakeups_per_io,
                run.driver
                    .map_or("-".to_string(), |d| format!("{:.2}", d.cpu_us_per_io)),
                run.driver
                    .map_or("-".to_string(), |d| format!("{:.2}", d.sleeps_per_io)),
            );
            runs.push(run);
        }
    }
    Ok(runs)
}

/// Per (API, QD), in order of first appearance, the sample of median IOPS
/// (the upper middle one for an even count).
pub(crate) fn medians(samples: &[PassthruRun]) -> Vec<PassthruRun> {
    let mut keys: Vec<(Api, u16)> = Vec::new();
    for s in samples {
        if !keys.contains(&(s.api, s.qd)) {
            keys.push((s.api, s.qd));
        }
    }
    keys.into_iter()
        .filter_map(|(api, qd)| {
            let mut of: Vec<&PassthruRun> = samples
                .iter()
                .filter(|s| (s.api, s.qd) == (api, qd))
                .collect();
            of.sort_by(|a, b| a.iops.total_cmp(&b.iops));
            of.get(of.len() / 2).map(|&s| s.clone())
        })
        .collect()
}

/// Async over block within each pass, per queue depth: the median and
/// the range, with `per_pass` samples in each pass (empty for one pass).
/// Both APIs of a pass ran seconds apart, so the host's load moves them
/// together far more than it moves two medians taken minutes apart.
fn paired(samples: &[PassthruRun], per_pass: usize) -> String {
    use std::fmt::Write as _;
    let passes: Vec<&[PassthruRun]> = samples.chunks(per_pass.max(1)).collect();
    if passes.len() < 2 {
        return String::new();
    }
    let mut qds: Vec<u16> = passes[0].iter().map(|r| r.qd).collect();
    qds.dedup();
    let mut out = String::new();
    for qd in qds {
        let mut ratios: Vec<f64> = passes
            .iter()
            .filter_map(|pass| {
                let iops = |api| {
                    pass.iter()
                        .find(|r| r.api == api && r.qd == qd)
                        .map(|r| r.iops)
                };
                match (iops(Api::Async), iops(Api::Block)) {
                    (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                    _ => None,
                }
            })
            .collect();
        ratios.sort_by(f64::total_cmp);
        let (Some(lo), Some(hi)) = (ratios.first(), ratios.last()) else {
            continue;
        };
        let _ = writeln!(
            out,
            "QD {qd}: async/block within a pass, median {:.2}x, {lo:.2}-{hi:.2}x over {} passes",
            ratios[ratios.len() / 2],
            ratios.len()
        );
    }
    out
}

/// A 4 KiB Read (one 4096-byte block) of a random LBA.
fn read_command(rng: &mut Rng, blocks: u64) -> Command {
    let lba = rng.next_u64() % blocks.max(1);
    let mut cmd = Command::new(NvmOpcode::READ.0, 0);
    cmd.nsid = NSID.into();
    cmd.set_slba(lba);
    // NLB, 0's based: one block.
    cmd.cdw12 = Cdw12ReadWrite::new().with_nlb_z(0).into();
    cmd
}

/// A measured point from what its thread counted.
fn point(api: Api, qd: u16, summary: &block::Summary) -> PassthruRun {
    PassthruRun {
        api,
        qd,
        iops: summary.ios as f64 / summary.elapsed.as_secs_f64().max(1e-9),
        lat_p50_us: summary.percentile_us(50.0),
        lat_p99_us: summary.percentile_us(99.0),
        ios: summary.ios,
        errors: summary.errors,
        // Filled in by the caller, which sees the controller's counters.
        server: None,
        driver: None,
    }
}

/// Runs `f` on a thread of its own, as [`block::run_threads_with`] runs
/// `vnvme bench`'s queues: every API is measured from the same kind of thread, counted
/// the same way (one latency histogram), so the table compares the APIs and
/// not the harness (the caller's main thread, a per-I/O latency vector).
/// Also returns what the thread used meanwhile (CPU time, sleeps).
fn on_own_thread(
    f: impl FnOnce() -> Result<(IoQueue, block::Summary)> + Send,
) -> Result<(IoQueue, block::Summary, Option<ThreadUse>)> {
    std::thread::scope(|s| {
        s.spawn(|| {
            let before = ThreadUse::now();
            let (q, summary) = f()?;
            let used = ThreadUse::now().zip(before).map(|(a, b)| a.since(b));
            Ok((q, summary, used))
        })
        .join()
        .unwrap_or_else(|_| bail!("a benchmark thread panicked"))
    })
}

fn measure(
    api: Api,
    qd: u16,
    q: IoQueue,
    access: &Arc<dyn DeviceAccess>,
    blocks: u64,
    runtime: Duration,
    submit: Submit,
) -> Result<(IoQueue, PassthruRun)> {
    let seed = 0x9E37_79B9_7F4A_7C15 ^ u64::from(qd);
    let (q, summary, used) = match api {
        Api::Sync => on_own_thread(|| sync(q, access, blocks, runtime, seed))?,
        Api::Async => on_own_thread(|| asynchronous(q, qd, access, blocks, runtime, seed, submit))?,
        Api::Block => {
            let pattern = Pattern {
                rw: Rw::Randread,
                qd,
                runtime,
                block_size: BLOCK as u32,
                submit,
            };
            // `vnvme bench`'s own loop, as its threads run it.
            on_own_thread(|| {
                let mut q = q;
                let summary =
                    block::run_one(&mut q, None, access, &pattern, block::thread_seed(0))?;
                Ok((q, summary))
            })?
        }
    };
    let mut run = point(api, qd, &summary);
    if let Some(used) = used {
        let ios = summary.ios.max(1) as f64;
        run.driver = Some(DriverThread {
            cpu_us_per_io: used.cpu_ns as f64 / 1e3 / ios,
            sleeps_per_io: used.sleeps as f64 / ios,
        });
    }
    Ok((q, run))
}

/// One caller, one command at a time, whatever `qd` says.
fn sync(
    mut q: IoQueue,
    access: &Arc<dyn DeviceAccess>,
    blocks: u64,
    runtime: Duration,
    seed: u64,
) -> Result<(IoQueue, block::Summary)> {
    let buf = access.dma_alloc(BLOCK)?;
    let mut rng = Rng::new(seed);
    let mut tally = block::Summary::default();
    let start = Instant::now();
    let deadline = start + runtime;
    loop {
        let t0 = Instant::now();
        if t0 >= deadline {
            break;
        }
        let done = q.passthru(
            read_command(&mut rng, blocks),
            Some(PassthruData::read(&buf, BLOCK)),
        )?;
        tally.record(t0.elapsed(), done.is_success());
    }
    tally.elapsed = start.elapsed();
    Ok((q, tally))
}

/// `qd` commands in flight through the asynchronous passthrough: one
/// registered buffer per slot, the slot as token, one doorbell per batch
/// of resubmissions (or one per command with [`Submit::PerIo`]).
fn asynchronous(
    q: IoQueue,
    qd: u16,
    access: &Arc<dyn DeviceAccess>,
    blocks: u64,
    runtime: Duration,
    seed: u64,
    submit: Submit,
) -> Result<(IoQueue, block::Summary)> {
    let slots = usize::from(qd);
    let mut aq = AsyncQueue::new(q);
    if slots > aq.capacity() {
        bail!(
            "queue depth {qd} does not fit a queue of {} commands",
            aq.capacity()
        );
    }
    let bufs: Vec<DmaBuffer> = (0..slots)
        .map(|_| access.dma_alloc(BLOCK))
        .collect::<Result<_, _>>()?;
    let first = aq.register_buffers(bufs);
    let mut rng = Rng::new(seed);
    let mut started = vec![Instant::now(); slots];
    let mut tally = block::Summary::default();
    let mut done: Vec<AsyncCompletion> = Vec::with_capacity(256);
    let start = Instant::now();
    let deadline = start + runtime;
    for (slot, t0) in started.iter_mut().enumerate() {
        *t0 = Instant::now();
        let data = BufferSlice::read(first + slot, BLOCK);
        aq.prepare(read_command(&mut rng, blocks), Some(data), slot as u64)?;
    }
    aq.submit()?;
    while aq.in_flight() > 0 {
        done.clear();
        aq.wait(&mut done, 1, Duration::from_secs(10))
            .context("waiting for completions")?;
        let now = Instant::now();
        for c in &done {
            let slot = usize::try_from(c.token).unwrap_or(usize::MAX);
            let Some(t0) = started.get_mut(slot) else {
                continue;
            };
            tally.record(now.duration_since(*t0), c.completion.is_success());
            if now < deadline {
                *t0 = Instant::now();
                let data = BufferSlice::read(first + slot, BLOCK);
                aq.prepare(read_command(&mut rng, blocks), Some(data), c.token)?;
                if submit == Submit::PerIo {
                    aq.submit()?;
                }
            }
        }
        aq.submit()?;
    }
    tally.elapsed = start.elapsed();
    let (q, _bufs) = aq.into_inner();
    Ok((q, tally))
}

/// The seed's table: a row per queue depth, IOPS (thousands) per API, the
/// async/sync and async/block ratios, then latency percentiles.
pub fn table(runs: &[PassthruRun]) -> String {
    use std::fmt::Write as _;
    let get = |api: Api, qd: u16| runs.iter().find(|r| r.api == api && r.qd == qd);
    let mut qds: Vec<u16> = runs.iter().map(|r| r.qd).collect();
    qds.dedup();
    let kiops =
        |r: Option<&PassthruRun>| r.map_or("-".to_string(), |r| format!("{:.1}", r.iops / 1e3));
    let lat = |r: Option<&PassthruRun>| {
        r.map_or("-".to_string(), |r| {
            format!("{:.1}/{:.1}", r.lat_p50_us, r.lat_p99_us)
        })
    };
    let ratio = |a: Option<&PassthruRun>, b: Option<&PassthruRun>| match (a, b) {
        (Some(a), Some(b)) if b.iops > 0.0 => format!("{:.2}x", a.iops / b.iops),
        _ => "-".to_string(),
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "fio-like randread, 4k bs, 1 thread; Kiops with varying QD"
    );
    let _ = writeln!(out, "(* {SYNC_NOTE})");
    let _ = writeln!(
        out,
        "{:>4} {:>9} {:>9} {:>9} {:>10} {:>11} {:>14} {:>14} {:>14}",
        "QD",
        "Sync-PT*",
        "Async-PT",
        "Block",
        "async/sync",
        "async/block",
        "sync p50/p99",
        "async p50/p99",
        "block p50/p99"
    );
    for qd in qds {
        let (s, a, b) = (get(Api::Sync, qd), get(Api::Async, qd), get(Api::Block, qd));
        let _ = writeln!(
            out,
            "{:>4} {:>9} {:>9} {:>9} {:>10} {:>11} {:>14} {:>14} {:>14}",
            qd,
            kiops(s),
            kiops(a),
            kiops(b),
            ratio(a, s),
            ratio(a, b),
            lat(s),
            lat(a),
            lat(b)
        );
    }
    let _ = writeln!(out, "(latencies in microseconds, submission to reaping)");
    out
}

/// The seed's table, Kiops: QD, Sync-PT, io_uring (block), Async-PT.
const SEED: [(u16, f64, f64, f64); 8] = [
    (1, 10.8, 10.6, 10.6),
    (2, 10.9, 24.5, 24.0),
    (4, 10.6, 45.0, 46.0),
    (8, 10.9, 90.0, 89.0),
    (16, 11.0, 169.0, 170.0),
    (32, 10.6, 308.0, 307.0),
    (64, 10.8, 503.0, 506.0),
    (128, 10.9, 592.0, 596.0),
];

/// What makes the seed's table: async over block across the depths, sync's
/// highest over its lowest IOPS (flat), async's scaling from the lowest
/// depth to the highest.
#[derive(Debug, Default, PartialEq)]
struct Shape {
    async_block: Option<(f64, f64)>,
    sync_spread: Option<f64>,
    async_scaling: Option<(u16, u16, f64)>,
}

impl Shape {
    /// From (api, qd, iops) points.
    fn of(points: &[(Api, u16, f64)]) -> Self {
        let iops = |api: Api| -> Vec<(u16, f64)> {
            points
                .iter()
                .filter(|p| p.0 == api && p.2 > 0.0)
                .map(|p| (p.1, p.2))
                .collect()
        };
        let (sync, asynchronous, block) = (iops(Api::Sync), iops(Api::Async), iops(Api::Block));
        let ratios: Vec<f64> = asynchronous
            .iter()
            .filter_map(|&(qd, a)| block.iter().find(|b| b.0 == qd).map(|b| a / b.1))
            .collect();
        let sync: Vec<f64> = sync.iter().map(|s| s.1).collect();
        let first = asynchronous.iter().min_by_key(|a| a.0);
        let last = asynchronous.iter().max_by_key(|a| a.0);
        Self {
            async_block: min_max(&ratios),
            sync_spread: min_max(&sync)
                .filter(|_| sync.len() > 1)
                .map(|(lo, hi)| hi / lo),
            async_scaling: match (first, last) {
                (Some(&(q0, a0)), Some(&(q1, a1))) if q1 > q0 => Some((q0, q1, a1 / a0)),
                _ => None,
            },
        }
    }
}

fn min_max(values: &[f64]) -> Option<(f64, f64)> {
    let lo = values.iter().copied().reduce(f64::min)?;
    let hi = values.iter().copied().reduce(f64::max)?;
    Some((lo, hi))
}

/// One line: the measured table's shape, each figure next to the seed's
/// at the same depths.
pub fn shape(runs: &[PassthruRun]) -> String {
    let ours = Shape::of(
        &runs
            .iter()
            .map(|r| (r.api, r.qd, r.iops))
            .collect::<Vec<_>>(),
    );
    let seed_points: Vec<(Api, u16, f64)> = SEED
        .iter()
        .filter(|s| runs.iter().any(|r| r.qd == s.0))
        .flat_map(|&(qd, sync, block, asy)| {
            [
                (Api::Sync, qd, sync),
                (Api::Block, qd, block),
                (Api::Async, qd, asy),
            ]
        })
        .collect();
    let seed = Shape::of(&seed_points);
    let mut parts = Vec::new();
    if let Some((lo, hi)) = ours.async_block {
        let theirs = seed
            .async_block
            .map_or(String::new(), |(l, h)| format!(" (seed {l:.2}-{h:.2}x)"));
        parts.push(format!("async/block {lo:.2}-{hi:.2}x{theirs}"));
    }
    if let Some(spread) = ours.sync_spread {
        let theirs = seed
            .sync_spread
            .map_or(String::new(), |s| format!(" (seed {s:.2}x)"));
        parts.push(format!("sync highest/lowest {spread:.2}x{theirs}"));
    }
    if let Some((q0, q1, x)) = ours.async_scaling {
        let theirs = seed
            .async_scaling
            .filter(|s| (s.0, s.1) == (q0, q1))
            .map_or(String::new(), |s| format!(" (seed {:.1}x)", s.2));
        parts.push(format!("async QD {q1}/QD {q0} {x:.1}x{theirs}"));
    }
    if parts.is_empty() {
        return String::new();
    }
    format!("shape: {}\n", parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(api: Api, qd: u16, iops: f64) -> PassthruRun {
        PassthruRun {
            api,
            qd,
            iops,
            lat_p50_us: 0.0,
            lat_p99_us: 0.0,
            ios: 0,
            errors: 0,
            server: None,
            driver: None,
        }
    }

    #[test]
    fn shape_of_the_seed_table_is_flat_sync_and_async_like_block() {
        let points: Vec<_> = SEED
            .iter()
            .flat_map(|&(q, s, b, a)| [(Api::Sync, q, s), (Api::Block, q, b), (Api::Async, q, a)])
            .collect();
        let s = Shape::of(&points);
        let (lo, hi) = s.async_block.unwrap();
        assert!(
            (0.97..0.99).contains(&lo) && (1.02..1.03).contains(&hi),
            "{lo} {hi}"
        );
        assert!((s.sync_spread.unwrap() - 11.0 / 10.6).abs() < 1e-9);
        let (q0, q1, x) = s.async_scaling.unwrap();
        assert_eq!((q0, q1), (1, 128));
        assert!((x - 596.0 / 10.6).abs() < 1e-9);
    }

    #[test]
    fn shape_line_compares_with_the_seed_at_the_measured_depths() {
        let line = shape(&[
            run(Api::Sync, 1, 5000.0),
            run(Api::Sync, 8, 5500.0),
            run(Api::Async, 1, 4000.0),
            run(Api::Async, 8, 12000.0),
            run(Api::Block, 1, 4000.0),
            run(Api::Block, 8, 10000.0),
        ]);
        assert_eq!(
            line,
            "shape: async/block 1.00-1.20x (seed 0.99-1.00x); sync highest/lowest 1.10x \
             (seed 1.01x); async QD 8/QD 1 3.0x (seed 8.4x)\n"
        );
    }

    #[test]
    fn paired_ratios_are_taken_within_each_pass() {
        let pass = |a1: f64, b1: f64, a8: f64, b8: f64| {
            vec![
                run(Api::Async, 1, a1),
                run(Api::Block, 1, b1),
                run(Api::Async, 8, a8),
                run(Api::Block, 8, b8),
            ]
        };
        // The host halves everything in the second pass: the ratios hold.
        let samples = [
            pass(100.0, 100.0, 800.0, 1000.0),
            pass(50.0, 40.0, 400.0, 500.0),
            pass(90.0, 100.0, 900.0, 1000.0),
        ]
        .concat();
        assert_eq!(
            paired(&samples, 4),
            "QD 1: async/block within a pass, median 1.00x, 0.90-1.25x over 3 passes\n\
             QD 8: async/block within a pass, median 0.80x, 0.80-0.90x over 3 passes\n"
        );
        assert_eq!(paired(&samples[..4], 4), "", "one pass");
    }

    #[test]
    fn shape_is_empty_without_pairs() {
        assert_eq!(shape(&[run(Api::Block, 1, 1.0)]), "");
    }
}
