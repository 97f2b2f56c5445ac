//! `vnvme bench`: IOPS, traps per I/O and interrupts per I/O against queue
//! depth, for each doorbell mode, with the controller and the driver in one
//! process over a real vfio-user socketpair. With `--guest`, the same
//! against QEMU's built-in nvme in a real Linux guest (see [`guest`]).

pub mod guest;
pub mod init;
mod io;
pub mod passthru;
mod plot;
mod report;
pub mod rng;
pub mod scale;
mod thread_use;
pub mod upgrade;
mod verify;
pub mod zns;

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;
use vnvme_controller::DoorbellMode;
use vnvme_driver::{Controller, DeviceAccess, InitOptions, IoQueue};

use crate::device::{DeviceOptions, PollingOptions};
use crate::identity::Origin;
use crate::inproc::InProcess;
use crate::namespace::{Backend, NamespaceSpec};
use crate::size::parse_size;

pub use io::{Pattern, Submit};

/// The access pattern, as fio names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Rw {
    Randread,
    Randwrite,
    Randrw,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    Null,
    Ram,
    /// A file on io_uring (--file, or a temporary file deleted afterwards).
    File,
}

impl BackendArg {
    /// The backend; `file` is where a `file` backend lives.
    pub fn backend(self, file: &Path) -> Backend {
        match self {
            BackendArg::Null => Backend::Null,
            BackendArg::Ram => Backend::Ram,
            BackendArg::File => Backend::File(file.to_path_buf()),
        }
    }

    fn name(self) -> &'static str {
        match self {
            BackendArg::Null => "null",
            BackendArg::Ram => "ram",
            BackendArg::File => "file",
        }
    }
}

/// The file behind `--backend file`: the one given, or a temporary one
/// removed when this is dropped.
#[derive(Debug)]
pub struct BenchFile {
    path: PathBuf,
    temporary: bool,
}

impl BenchFile {
    pub fn new(given: Option<&Path>) -> Self {
        match given {
            Some(p) => Self {
                path: p.to_path_buf(),
                temporary: false,
            },
            None => Self {
                path: std::env::temp_dir().join(format!("vnvme-bench-{}.img", std::process::id())),
                temporary: true,
            },
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Starts a temporary file over (empty, so it reads as zeroes), for a
    /// new namespace.
    fn start_over(&self) -> Result<()> {
        if !self.temporary {
            return Ok(());
        }
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("removing {}", self.path.display()))
            }
            _ => Ok(()),
        }
    }
}

impl Drop for BenchFile {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A comma-separated list on the command line (`--qd 1,4,32`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct List<T>(pub Vec<T>);

impl<T: FromStr> FromStr for List<T>
where
    T::Err: std::fmt::Display,
{
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let items = s
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(|t| t.parse::<T>().map_err(|e| format!("'{t}': {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        if items.is_empty() {
            return Err("the list is empty".into());
        }
        Ok(Self(items))
    }
}

#[derive(Args, Debug, Clone)]
pub struct BenchOptions {
    /// Doorbell modes to measure, comma separated (trap, shadow, adaptive, mmap-poll).
    #[arg(long, default_value = "trap,shadow,adaptive,mmap-poll")]
    pub modes: List<DoorbellMode>,
    /// Queue depths per queue, comma separated (1 to 1023).
    #[arg(long, default_value = "1,2,4,8,16,32,64,128")]
    pub qd: List<u16>,
    /// Namespace backend.
    #[arg(long, value_enum, default_value = "null")]
    pub backend: BackendArg,
    /// With --backend file: the regular file or block device to use (its first --size bytes;
    /// a missing file is created). Default: a temporary file, deleted afterwards.
    #[arg(long, value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// Serve the namespace from this NBD export instead of --backend
    /// (nbd://HOST[:PORT]/EXPORT or nbd+unix:///EXPORT?socket=PATH; its first --size bytes).
    // The brackets are the help text's optional parts, not links.
    #[allow(rustdoc::broken_intra_doc_links)]
    #[arg(long, value_name = "URI")]
    pub nbd: Option<String>,
    /// Access pattern (4 KiB blocks).
    #[arg(long, value_enum, default_value = "randread")]
    pub rw: Rw,
    /// Seconds per measured point (fractions allowed; with --guest the default is 8).
    #[arg(long, default_value = "1.5")]
    pub runtime: f64,
    /// Driver threads, one I/O queue pair each.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub queues: u16,
    /// Namespace size.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub size: u64,
    /// LBA format index of the namespace (a 4096-byte one: 3 4096+0, 4 4096+8, 5 4096+64, 6
    /// 4096+16 and 7 4096+64 with a 64-bit guard; a format with metadata needs --pi).
    #[arg(long, default_value_t = vnvme_controller::DEFAULT_FORMAT_INDEX)]
    pub format: u8,
    /// Protection information type (1, 2 or 3) of the namespace: the driver sets PRACT and every
    /// check of the type, so the controller generates, checks and strips the PI of each I/O.
    #[arg(long, value_parser = crate::namespace::parse_pi_type)]
    pub pi: Option<vnvme_controller::PiType>,
    /// When the driver rings the SQ doorbell: per-io (like a guest kernel; what the seeds measured) or batch.
    #[arg(long, value_enum, default_value = "per-io")]
    pub submit: Submit,
    /// Reap completions by busy polling instead of waiting for interrupts.
    #[arg(long)]
    pub poll: bool,
    /// Check every read against the last completed write of its block (needs --backend ram or file):
    /// writes carry a pattern naming sector, generation and thread; each queue keeps to its own
    /// stripe of the namespace.
    #[arg(long)]
    pub verify: bool,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw IOPS and traps per I/O against queue depth (SVG).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Boot the tests/guest Linux guest (QEMU, TCG) once with every device: QEMU's built-in nvme
    /// (dbcs on, off) and `vnvme serve` in each of --modes; fio randread at each --qd and --engines
    /// runs 1 s slices on each device in turn until each has had --runtime seconds.
    #[arg(long)]
    pub guest: bool,
    /// With --guest: fio engines, comma separated (io_uring, libaio).
    #[arg(long, default_value = "io_uring,libaio")]
    pub engines: List<guest::Engine>,
    /// With --guest: the guest's RAM in this file (QEMU's memory-backend-file, share=on) instead of
    /// a memfd: a file on a hugetlbfs mount for huge pages (mount it and reserve the pages first:
    /// `mount -t hugetlbfs nodev DIR; echo 600 > /proc/sys/vm/nr_hugepages`), or on /dev/shm. Made
    /// and removed by the bench unless it exists.
    #[arg(long, value_name = "PATH")]
    pub guest_mem_file: Option<PathBuf>,
    /// Limits on namespace 1, set after the bench's first fill (KEY=VALUE, comma separated:
    /// iops=20000, read_bps=100M, iops_burst=64...; see docs/qos.md): IOPS then shows how well
    /// the controller holds them.
    #[arg(long, value_name = "LIMITS")]
    pub qos: Option<crate::qos::QosSpec>,
    /// Scale: for each N in the list, N controllers at once, each with its own driver client (one
    /// I/O queue at each --qd), served by one `vnvme serve` process (a config with N
    /// [[controllers]]); prints aggregate IOPS, the slowest and fastest controller, and the
    /// server's CPU busy and idle. E.g. `--controllers 1,4,16,64 --modes adaptive --qd 32`.
    // The brackets are the config's table name, not links.
    #[allow(rustdoc::broken_intra_doc_links)]
    #[arg(long, value_name = "N,...")]
    pub controllers: Option<List<usize>>,
    /// With --controllers: one `vnvme serve` process per controller instead of one for all.
    #[arg(long, requires = "controllers")]
    pub processes: bool,
    /// With --controllers: one `vnvme serve` process serving one NVM subsystem, a controller per
    /// socket (`--socket` N times), every controller sharing the one namespace; e.g.
    /// `--controllers 1,2 --subsystem --qd 32,64 --rw randwrite` compares two controllers writing one
    /// namespace at QD 32 each with one controller at QD 64.
    #[arg(long, requires = "controllers", conflicts_with = "processes")]
    pub subsystem: bool,
    /// With --controllers: attach to these vfio-user sockets (comma separated) instead of starting
    /// servers, the first N for each N; e.g. SPDK's nvmf_tgt (bench/peers/spdk.sh --controllers).
    #[arg(long, value_name = "SOCKET,...", requires = "controllers")]
    pub attach: Option<List<PathBuf>>,
    /// With --attach: the server's process id, whose CPU is reported (0 without it).
    #[arg(long, value_name = "PID", requires = "attach")]
    pub server_pid: Option<u32>,
    /// With --controllers (one process): the server's --workers (default: its own).
    #[arg(long, value_name = "N", requires = "controllers")]
    pub server_workers: Option<u16>,
    /// With --controllers: seconds every client stays attached and idle before the first point,
    /// while the server's idle CPU is measured.
    #[arg(
        long,
        value_name = "S",
        default_value_t = 2.0,
        requires = "controllers"
    )]
    pub idle_seconds: f64,
    /// The controller's polling, as `vnvme serve` takes it (with --guest,
    /// passed to the `vnvme serve` the bench starts).
    #[command(flatten)]
    pub polling: PollingOptions,
}

impl BenchOptions {
    /// What each benchmark thread does at depth `qd` for `runtime`.
    fn pattern(&self, qd: u16, runtime: Duration) -> Pattern {
        Pattern {
            rw: self.rw,
            qd,
            runtime,
            block_size: BLOCK_SIZE,
            submit: self.submit,
        }
    }
}

/// One measured point. The field names are read by other tools: keep them.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub mode: String,
    pub qd: u16,
    pub rw: Rw,
    pub queues: u16,
    pub submit: Submit,
    pub iops: f64,
    pub traps_per_io: f64,
    pub sq_traps_per_io: f64,
    pub cq_traps_per_io: f64,
    pub interrupts_per_io: f64,
    /// Bytes copied through a buffer between the driver's memory and the
    /// backend, per I/O: 0 where the `file` backend moves data in place.
    pub bounced_bytes_per_io: f64,
    pub lat_p50_us: f64,
    pub lat_p99_us: f64,
    pub ios: u64,
    pub errors: u64,
    /// What the driver used: "mmio", "shadow" or "mapped".
    pub driver_doorbells: String,
    /// Whether reads were checked (`--verify`).
    pub verify: bool,
    /// Reads checked against the expected pattern.
    pub verified_reads: u64,
    /// Checked reads that did not hold the last completed write (or zeroes).
    pub verify_errors: u64,
    /// Resident set size of the whole process (controller and driver) when
    /// the point started and ended, and the largest sample in between (taken
    /// every 10 s), in MiB; 0 if /proc is not readable.
    pub rss_start_mib: f64,
    pub rss_end_mib: f64,
    pub rss_max_mib: f64,
}

/// How often a point samples the RSS while it runs.
const RSS_EVERY: Duration = Duration::from_secs(10);

/// The resident set size of this process in MiB (`VmRSS`, which, unlike
/// `statm`, needs no page size), or 0 without /proc.
fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// Checks `--runtime` (seconds per point) for the in-process benchmarks.
fn check_runtime(runtime: f64) -> Result<Duration> {
    if !(runtime > 0.0 && runtime <= 3600.0) {
        bail!("--runtime must be between 0 and 3600 seconds (got {runtime})");
    }
    Ok(Duration::from_secs_f64(runtime))
}

/// Checks `--qd`: a ring of at most 1024 entries holds 1023 commands.
fn check_qd(qds: &[u16]) -> Result<()> {
    if let Some(bad) = qds.iter().find(|&&q| q == 0 || q > 1023) {
        bail!("--qd {bad} is out of range: queue depths go from 1 to 1023");
    }
    Ok(())
}

/// Writes a result file (`--json`, `--plot`) and says so on stderr.
fn write_output(path: &Path, text: String, who: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("{who}: wrote {}", path.display());
    Ok(())
}

/// `--json`: the document, pretty printed.
fn write_json(path: &Path, doc: &serde_json::Value, who: &str) -> Result<()> {
    write_output(path, serde_json::to_string_pretty(doc)? + "\n", who)
}

pub fn run(opts: &BenchOptions) -> Result<Vec<Run>> {
    let runtime = check_runtime(opts.runtime)?;
    check_qd(&opts.qd.0)?;
    if opts.nbd.is_some() && opts.backend != BackendArg::Null {
        bail!("--nbd replaces --backend: give one of them");
    }
    if opts.verify && opts.backend == BackendArg::Null && opts.nbd.is_none() {
        bail!("--verify needs --backend ram or file: a null namespace drops writes and reads zeroes, so there is nothing to check");
    }
    if opts.file.is_some() && opts.backend != BackendArg::File {
        bail!("--file is for --backend file");
    }
    if opts.file.is_some() && opts.verify {
        bail!("--verify needs a namespace that starts out zeroed: leave out --file (a temporary file is used)");
    }
    let file = BenchFile::new(opts.file.as_deref());
    let max_qd = opts.qd.0.iter().copied().max().unwrap_or(1);
    let total = opts.modes.0.len() * opts.qd.0.len();
    eprintln!(
        "bench: {} modes x {} queue depths, {:.1} s each, {} thread(s), {:?} on a {} namespace (format {}{}){} (about {:.0} s)",
        opts.modes.0.len(),
        opts.qd.0.len(),
        opts.runtime,
        opts.queues,
        opts.rw,
        if opts.nbd.is_some() { "nbd" } else { opts.backend.name() },
        opts.format,
        opts.pi.map_or(String::new(), |t| format!(", PI type {}", t.pit())),
        if opts.verify { ", verifying" } else { "" },
        opts.runtime * total as f64 + 0.2 * opts.modes.0.len() as f64
    );
    let mut runs = Vec::new();
    for &mode in &opts.modes.0 {
        file.start_over()?;
        let mut bench = ModeBench::start(mode, opts, max_qd, file.path())?;
        for &qd in &opts.qd.0 {
            let run = bench.measure(qd, opts, runtime)?;
            eprintln!(
                "bench: [{:>2}/{total}] {:<9} qd {:>3}: {:>9.0} IOPS, {:.3} traps/IO, {:.3} irq/IO, {:.0} bytes bounced/IO",
                runs.len() + 1,
                run.mode,
                qd,
                run.iops,
                run.traps_per_io,
                run.interrupts_per_io,
                run.bounced_bytes_per_io
            );
            eprintln!(
                "bench:         RSS {:.1} MiB at start, {:.1} MiB at end, {:.1} MiB at most{}",
                run.rss_start_mib,
                run.rss_end_mib,
                run.rss_max_mib,
                if run.verify {
                    format!(
                        "; {} verify errors in {} checked reads",
                        run.verify_errors, run.verified_reads
                    )
                } else {
                    String::new()
                }
            );
            runs.push(run);
        }
    }
    Ok(runs)
}

/// Runs the benchmark and writes what was asked for.
pub fn main(opts: &BenchOptions) -> Result<()> {
    if opts.guest && opts.qos.is_some() {
        bail!("--qos is for the in-process bench, not --guest");
    }
    if opts.guest && opts.controllers.is_some() {
        bail!("--controllers is for the in-process bench's servers, not --guest");
    }
    if opts.guest && opts.verify {
        bail!("--verify is for the in-process bench, not --guest");
    }
    if opts.guest && (opts.pi.is_some() || opts.format != vnvme_controller::DEFAULT_FORMAT_INDEX) {
        bail!("--format and --pi are for the in-process bench, not --guest");
    }
    if opts.guest {
        return guest::main(&guest::GuestBenchOptions::from_bench(opts));
    }
    if let Some(counts) = &opts.controllers {
        return scale_main(opts, &counts.0);
    }
    let runs = run(opts)?;
    print!("{}", report::table(&runs));
    if let Some(path) = &opts.json {
        write_json(
            path,
            &serde_json::json!({ "runs": runs, "machine": report::machine() }),
            "bench",
        )?;
    }
    if let Some(path) = &opts.plot {
        write_output(path, plot::svg(&runs), "bench")?;
    }
    Ok(())
}

/// `--controllers`: the scale sweep, its table and its JSON.
fn scale_main(opts: &BenchOptions, counts: &[usize]) -> Result<()> {
    if opts.plot.is_some() || opts.qos.is_some() {
        bail!("--plot and --qos are for the single-controller sweep: leave them out with --controllers");
    }
    if !(opts.idle_seconds > 0.0 && opts.idle_seconds <= 3600.0) {
        bail!(
            "--idle-seconds must be between 0 and 3600 (got {})",
            opts.idle_seconds
        );
    }
    let runs = scale::run(opts, counts)?;
    print!("{}", scale::table(&runs));
    if let Some(path) = &opts.json {
        write_json(
            path,
            &serde_json::json!({ "scale": runs, "machine": report::machine() }),
            "bench",
        )?;
    }
    Ok(())
}

/// The size of every I/O.
const BLOCK_SIZE: u32 = 4096;

/// One controller in one doorbell mode, with the driver attached.
/// Fields drop in order: the driver's queues and the driver first (their
/// DMA unmaps still reach the server), the server last.
struct ModeBench {
    mode: DoorbellMode,
    queues: Vec<IoQueue>,
    driver: Controller,
    access: Arc<dyn DeviceAccess>,
    inproc: InProcess,
    /// With `--verify`, one per queue: kept across points, since the
    /// namespace keeps what earlier points wrote.
    stripes: Option<Vec<verify::Stripe>>,
}

/// The device an in-process point of `mode` measures: its queues and the
/// controller's polling as `opts` give them.
pub fn device_options(mode: DoorbellMode, opts: &BenchOptions) -> DeviceOptions {
    DeviceOptions {
        doorbells: mode,
        max_io_queues: opts.queues,
        polling: opts.polling.clone(),
        ..DeviceOptions::default()
    }
}

impl ModeBench {
    fn start(mode: DoorbellMode, opts: &BenchOptions, max_qd: u16, file: &Path) -> Result<Self> {
        let backend = match &opts.nbd {
            Some(uri) => Backend::Nbd(uri.clone()),
            None => opts.backend.backend(file),
        };
        let mut spec = NamespaceSpec::new(opts.size, backend);
        spec.format = Some(opts.format);
        spec.protection = opts.pi.map(|pi_type| vnvme_controller::Protection {
            pi_type,
            first: false,
        });
        spec.validate().map_err(anyhow::Error::msg)?;
        let format = vnvme_controller::LBA_FORMATS.get(usize::from(opts.format));
        if format.map(|f| f.data_size) != Some(BLOCK_SIZE) {
            bail!(
                "--format {}: the bench does 4 KiB I/O, so it needs a 4096-byte format (3, 4, 5, 6, 7)",
                opts.format
            );
        }
        let device = device_options(mode, opts).build(&[spec], &Origin::embedded())?;
        let init = InitOptions {
            io_queues: opts.queues,
            // A ring of N entries holds N - 1 commands.
            queue_depth: max_qd.saturating_add(1).max(2),
            interrupts: !opts.poll,
            // Adaptive offers the doorbell page too; the bench's adaptive
            // figures are those of a client that does not map it, so they
            // measure shadow doorbells and the traps EventIdx asks for.
            map_doorbells: mode == DoorbellMode::MmapPoll,
            ..InitOptions::default()
        };
        let (inproc, access, driver) = InProcess::start_driver(device, init)?;
        if driver.io_queue_count() < opts.queues {
            bail!(
                "the controller granted {} I/O queues, {} asked",
                driver.io_queue_count(),
                opts.queues
            );
        }
        if driver.namespaces().is_empty() {
            bail!(
                "the controller reported no usable namespace (the driver moves metadata only with \
                 protection information: a format with metadata needs --pi)"
            );
        }
        let mut queues = (0..usize::from(opts.queues))
            .map(|i| driver.take_io_queue(i))
            .collect::<Result<Vec<_>, _>>()?;
        // Reads of blocks never written cost less than reads of data: a
        // `ram` chunk never written is a fill of zeroes from cache, and a PI
        // tuple of zeroes turns every check off. So a namespace the bench
        // starts empty is written once first, with PI or without, and the
        // two figures compare like with like. Not with --verify, whose
        // reads expect zeroes where nothing was written.
        let empty = opts.backend == BackendArg::Ram;
        let with_pi = opts.pi.is_some() && opts.backend != BackendArg::Null;
        if (empty || with_pi) && !opts.verify {
            Self::prefill(&mut queues, &access)?;
        }
        if let Some(q) = &opts.qos {
            let target = vnvme_controller::QosTarget::Namespace(1);
            inproc.controller().qos_set(target, q.limits)?;
        }
        let stripes = if opts.verify {
            Some(Self::stripes(&queues, BLOCK_SIZE)?)
        } else {
            None
        };
        Ok(Self {
            mode,
            inproc,
            access,
            driver,
            queues,
            stripes,
        })
    }

    /// Writes every block of namespace 1 once (with PRACT: the controller
    /// makes its PI), so reads move and check real data.
    fn prefill(queues: &mut [IoQueue], access: &Arc<dyn DeviceAccess>) -> Result<()> {
        const PER_WRITE: u32 = 32;
        let Some(q) = queues.first_mut() else {
            return Ok(());
        };
        let blocks = q.namespace(1).context("namespace 1")?.blocks;
        let buf = access.dma_alloc(PER_WRITE as usize * BLOCK_SIZE as usize)?;
        buf.write_bytes(0, &vec![0x5A; buf.len()])?;
        let mut lba = 0;
        while lba < blocks {
            let n = (blocks - lba).min(u64::from(PER_WRITE)) as u32;
            q.write(1, lba, n, &buf)?;
            lba += u64::from(n);
        }
        Ok(())
    }

    /// Splits namespace 1 into one stripe of whole blocks per queue, so no
    /// two threads ever touch the same block.
    fn stripes(queues: &[IoQueue], block_size: u32) -> Result<Vec<verify::Stripe>> {
        /// 1 GiB of generation table per thread at most.
        const MAX_STRIPE_BLOCKS: u64 = 1 << 28;
        let Some(q) = queues.first() else {
            return Ok(Vec::new());
        };
        let ns = q.namespace(1).context("namespace 1")?;
        let blocks = ns.blocks * u64::from(ns.lba_size) / u64::from(block_size);
        let per = blocks / queues.len() as u64;
        if per > MAX_STRIPE_BLOCKS {
            bail!("--verify keeps 4 bytes per block: {per} blocks per queue is too many");
        }
        Ok((0..queues.len())
            .map(|i| verify::Stripe::new(i as u32, i as u64 * per, per as usize))
            .collect())
    }

    fn measure(&mut self, qd: u16, opts: &BenchOptions, runtime: Duration) -> Result<Run> {
        let rss_start_mib = rss_mib();
        let mut rss_max_mib = rss_start_mib;
        let started = std::time::Instant::now();
        let before = self.inproc.controller().stats();
        let pattern = opts.pattern(qd, runtime);
        let results = io::run_threads_with(
            &mut self.queues,
            self.stripes.as_deref_mut(),
            &self.access,
            &pattern,
            RSS_EVERY,
            &mut || {
                let rss = rss_mib();
                rss_max_mib = rss_max_mib.max(rss);
                eprintln!(
                    "bench:         {:>4.0} s: RSS {rss:.1} MiB",
                    started.elapsed().as_secs_f64()
                );
            },
        )?;
        let after = self.inproc.controller().stats();
        let rss_end_mib = rss_mib();
        let summary = io::Summary::merge(results);
        let ios = summary.ios.max(1) as f64;
        let sq = after
            .sq_doorbell_traps
            .saturating_sub(before.sq_doorbell_traps) as f64;
        let cq = after
            .cq_doorbell_traps
            .saturating_sub(before.cq_doorbell_traps) as f64;
        let irq = after.interrupts.saturating_sub(before.interrupts) as f64;
        let bounced = after.bounced_bytes.saturating_sub(before.bounced_bytes) as f64;
        Ok(Run {
            mode: self.mode.to_string(),
            qd,
            rw: opts.rw,
            queues: opts.queues,
            submit: opts.submit,
            iops: summary.ios as f64 / summary.elapsed.as_secs_f64().max(1e-9),
            traps_per_io: (sq + cq) / ios,
            sq_traps_per_io: sq / ios,
            cq_traps_per_io: cq / ios,
            interrupts_per_io: irq / ios,
            bounced_bytes_per_io: bounced / ios,
            lat_p50_us: summary.percentile_us(50.0),
            lat_p99_us: summary.percentile_us(99.0),
            ios: summary.ios,
            errors: summary.errors,
            driver_doorbells: self.driver.doorbell_kind().to_string(),
            verify: self.stripes.is_some(),
            verified_reads: summary.verified_reads,
            verify_errors: summary.verify_errors,
            rss_start_mib,
            rss_end_mib,
            rss_max_mib: rss_max_mib.max(rss_end_mib),
        })
    }
}
