//! `vnvme bench --guest`: one boot of the Linux guest of the `tests/guest`
//! rig (QEMU 11.1, TCG, Debian's kernel and fio) with every device attached —
//! QEMU's built-in `nvme` (null-co, reads no data) with shadow doorbells on
//! and off, and one `vnvme serve --ns 1G:null` per doorbell mode — told apart
//! in the guest by their serial numbers. Per engine × queue depth, fio 4 KiB
//! randread runs in rounds: one slice (1 s after a 0.5 s ramp)
//! on each device in turn, the order rotated by one every round, until each
//! device has had `--runtime` seconds. So the devices are compared over the
//! same seconds of a host whose speed drifts 2x in minutes, which separate
//! boots (the method before) could not do.
//!
//! What is measured, per point:
//! * IOPS: fio's I/Os over its measured seconds, summed over the slices
//!   (`fio_json` in the guest's `guest-lib.sh`); latency percentiles are
//!   those of all the slices' I/Os together, of the total latency
//!   (submission and completion), from each slice's fio percentiles
//!   (`PERCENTILES`, dense in the tail);
//! * traps and interrupts per I/O (vnvme only): deltas of the server's
//!   `--stats` counters (SQ + CQ doorbell traps, interrupts raised) divided by
//!   the delta of I/O commands the controller executed, between two
//!   snapshots the guest brackets the point's rounds with (each server counts
//!   only in its own slices). The guest prints a marker
//!   line and sleeps `QUIET` (2 s) before and after the point; the host takes the
//!   first stats file written after it saw the marker (the server rewrites it
//!   every second), so the window holds exactly that point's I/O (ramps and
//!   fio's own open/close included) and nothing else.
//! * guest interrupts per I/O (every device): the interrupts the guest took
//!   on that controller's I/O queue vectors (`/proc/interrupts`) around each
//!   slice, over fio's I/Os with each ramp counted at its slice's rate: how
//!   QEMU's nvme, which has no counters of ours, batches its completions;
//! * the host's cores (QEMU's vCPUs, its other threads, the servers) between
//!   the marker lines around each slice, summed per device.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use serde::Serialize;
use serde_json::Value;
use vnvme_controller::DoorbellMode;

mod cpu;
mod figures;
mod host;
pub mod passthru;
mod script;
mod table;

use super::report;
pub use cpu::{GroupCores, HostCores};
use figures::{fresh_stats, Counters, Slices};
use host::{Server, Tail, TempDir};
use script::{guest_script, qemu_nvme_args, rounds};
pub use table::table;

/// Seconds the guest stays idle after each marker line, so a stats snapshot
/// (written every second by the server) falls between the marker and fio.
const QUIET: u32 = 2;
/// Guest marker lines.
const BEGIN: &str = "VNVME-BENCH-BEGIN ";
const END: &str = "VNVME-BENCH-END ";
/// Before each fio slice ("SLICE point@serial") and after it ("SLICE -").
const SLICE_MARK: &str = "VNVME-BENCH-SLICE ";
/// Measured seconds of one fio slice, and the ramp before it (long enough for
/// a worker that dozed while the other devices ran to be back at speed).
const SLICE: f64 = 1.0;
const RAMP: f64 = 0.5;
/// The latency percentiles each slice reports (fio's `--percentile_list`,
/// at most 20): the points between which a slice's distribution is taken
/// as linear when the union's p50 and p99 are found. They are of the total
/// latency, submission and completion (`--lat_percentiles=1`), not fio's
/// default completion latency (clat): QEMU's nvme does a read's work in
/// the doorbell write's trap, inside the submission, where clat does not
/// see it (10-50% of its QD 1 reads showed a clat of 4-9 µs), while
/// vnvme's doorbell is a store to memory and its work all lands in clat.
const PERCENTILES: &str = "10:25:50:75:90:95:97:98:98.5:99:99.25:99.5:99.75:99.9:99.95:99.99";

/// A fio I/O engine the guest has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
pub enum Engine {
    #[value(name = "io_uring")]
    #[serde(rename = "io_uring")]
    IoUring,
    #[value(name = "libaio")]
    #[serde(rename = "libaio")]
    Libaio,
}

impl std::str::FromStr for Engine {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        <Self as ValueEnum>::from_str(s, false)
            // Clap's text names the bad value only; this names the good ones.
            .map_err(|_| "expected io_uring or libaio".to_string())
    }
}

impl Engine {
    fn name(self) -> &'static str {
        match self {
            Engine::IoUring => "io_uring",
            Engine::Libaio => "libaio",
        }
    }
}

/// What `vnvme bench --guest` measures.
#[derive(Debug, Clone)]
pub struct GuestBenchOptions {
    /// vnvme doorbell modes, one server (and guest device) each.
    pub modes: Vec<DoorbellMode>,
    /// fio iodepths.
    pub qd: Vec<u16>,
    pub engines: Vec<Engine>,
    /// Seconds of fio per device and point, in 1 s slices (each after a
    /// 0.5 s ramp).
    pub runtime: f64,
    /// Also attach QEMU's built-in nvme (dbcs on and off) as the reference.
    pub qemu_nvme: bool,
    /// Extra `vnvme serve` arguments (e.g. `--idle-poll-us 20`).
    pub serve_args: Vec<String>,
    /// An A/B experiment in one boot: a second server per mode.
    pub b: Option<BServer>,
    pub json: Option<PathBuf>,
    /// The guest rig (`tests/guest`).
    pub rig: PathBuf,
    /// The guest's RAM in this file instead of a memfd (`run-test.sh --mem-file`).
    pub mem_file: Option<PathBuf>,
}

/// `vnvme bench`'s in-process defaults, replaced by the guest's when not given.
const INPROC_QDS: [u16; 8] = [1, 2, 4, 8, 16, 32, 64, 128];
const INPROC_RUNTIME: f64 = 1.5;

impl GuestBenchOptions {
    /// From `vnvme bench --guest ...`: the in-process defaults of `--qd` and
    /// `--runtime` become 1,4,16,32 and 8 s (a guest point costs seconds of
    /// boot-free but slow TCG time). Experiment knobs from the environment:
    /// `VNVME_BENCH_SERVE_ARGS` (extra `vnvme serve` arguments, split on
    /// whitespace), `VNVME_BENCH_NO_QEMU=1` (no reference devices), and
    /// `VNVME_BENCH_B_EXE` and/or `VNVME_BENCH_B_ARGS`: a second server per
    /// mode, run from another vnvme executable and/or with more arguments,
    /// for an A/B comparison over the same seconds.
    pub fn from_bench(opts: &super::BenchOptions) -> Self {
        let qd = if opts.qd.0 == INPROC_QDS {
            vec![1, 4, 16, 32]
        } else {
            opts.qd.0.clone()
        };
        #[allow(clippy::float_cmp)]
        let runtime = if opts.runtime == INPROC_RUNTIME {
            8.0
        } else {
            opts.runtime
        };
        Self {
            modes: opts.modes.0.clone(),
            qd,
            engines: opts.engines.0.clone(),
            runtime,
            qemu_nvme: std::env::var_os("VNVME_BENCH_NO_QEMU").is_none_or(|v| v != "1"),
            serve_args: serve_args_from_env()
                .into_iter()
                .chain(opts.polling.serve_args())
                .collect(),
            b: BServer::from_env(),
            json: opts.json.clone(),
            rig: Self::default_rig(),
            mem_file: opts.guest_mem_file.clone(),
        }
    }

    /// The rig folder of this source tree, unless `VNVME_GUEST_RIG` names another.
    pub fn default_rig() -> PathBuf {
        std::env::var_os("VNVME_GUEST_RIG").map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/guest"),
            PathBuf::from,
        )
    }
}

/// The B server of an A/B experiment: another executable (a build of other
/// code), more arguments, or both.
#[derive(Debug, Clone, PartialEq)]
pub struct BServer {
    pub exe: Option<PathBuf>,
    pub args: Vec<String>,
}

impl BServer {
    /// From `VNVME_BENCH_B_EXE` and `VNVME_BENCH_B_ARGS`; `None` without
    /// either.
    fn from_env() -> Option<Self> {
        let exe = std::env::var_os("VNVME_BENCH_B_EXE").map(PathBuf::from);
        let args = env_args("VNVME_BENCH_B_ARGS");
        if exe.is_none() && args.is_none() {
            return None;
        }
        Some(Self {
            exe,
            args: args.unwrap_or_default(),
        })
    }

    /// "/tmp/old/vnvme --no-idle-class".
    fn describe(&self) -> String {
        let exe = self
            .exe
            .as_ref()
            .map_or("this vnvme".to_string(), |e| e.display().to_string());
        format!("{exe} {}", self.args.join(" ")).trim().to_string()
    }
}

/// `VNVME_BENCH_SERVE_ARGS`: extra `vnvme serve` arguments.
fn serve_args_from_env() -> Vec<String> {
    env_args("VNVME_BENCH_SERVE_ARGS").unwrap_or_default()
}

/// The arguments in environment variable `var`, split on whitespace;
/// `None` where it is not set.
fn env_args(var: &str) -> Option<Vec<String>> {
    let text = std::env::var(var).ok()?;
    Some(text.split_whitespace().map(str::to_string).collect())
}

/// One device of the guest, told apart there by its serial number.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Device {
    QemuNvme {
        dbcs: bool,
    },
    /// `b`: the second server of this mode, `GuestBenchOptions::b`.
    Vnvme {
        mode: DoorbellMode,
        b: bool,
    },
}

impl Device {
    fn label(self) -> String {
        match self {
            Device::QemuNvme { dbcs } => {
                format!("qemu-nvme dbcs={}", if dbcs { "on" } else { "off" })
            }
            Device::Vnvme { mode, b } => format!("vnvme {mode}{}", if b { " B" } else { "" }),
        }
    }

    /// [`GuestRun::device`].
    fn kind(self) -> &'static str {
        match self {
            Device::QemuNvme { .. } => "qemu-nvme",
            Device::Vnvme { .. } => "vnvme",
        }
    }

    /// [`GuestRun::mode`].
    fn mode(self) -> Option<String> {
        match self {
            Device::Vnvme { mode, .. } => Some(mode.to_string()),
            Device::QemuNvme { .. } => None,
        }
    }

    /// [`GuestRun::dbcs`].
    fn dbcs(self) -> Option<bool> {
        match self {
            Device::QemuNvme { dbcs } => Some(dbcs),
            Device::Vnvme { .. } => None,
        }
    }

    /// Its Identify Controller serial number (at most 20 characters; no
    /// spaces: the guest script splits on them).
    fn serial(self) -> String {
        match self {
            Device::QemuNvme { dbcs } => format!("qemu-dbcs-{}", if dbcs { "on" } else { "off" }),
            Device::Vnvme { mode, b } => format!("vnvme-{mode}{}", if b { "-b" } else { "" }),
        }
    }
}

/// One measured point. The field names are read by other tools: keep them.
#[derive(Debug, Clone, Serialize)]
pub struct GuestRun {
    /// "qemu-nvme" or "vnvme".
    pub device: &'static str,
    /// vnvme's doorbell mode; null for QEMU's nvme.
    pub mode: Option<String>,
    /// QEMU's nvme `dbcs` property; null for vnvme.
    pub dbcs: Option<bool>,
    /// The B server of an A/B experiment (`VNVME_BENCH_B_EXE`,
    /// `VNVME_BENCH_B_ARGS`): its executable and extra arguments; null
    /// otherwise.
    pub b: Option<String>,
    pub engine: Engine,
    pub qd: u16,
    /// fio's I/Os over its measured seconds, all slices.
    pub iops: f64,
    /// fio slices the point's figures sum (1 s each).
    pub slices: u32,
    /// (SQ + CQ doorbell traps) / I/O commands, from the server's counters;
    /// null for QEMU's nvme.
    pub traps_per_io: Option<f64>,
    pub interrupts_per_io: Option<f64>,
    /// Interrupts the guest took on its nvme I/O queues' vectors, over
    /// fio's I/O including its ramps: the same count for QEMU's nvme,
    /// which has no counters of ours.
    pub guest_interrupts_per_io: Option<f64>,
    /// Percentiles of the total latency (submission and completion) of all
    /// the slices' I/Os together.
    pub lat_p50_us: f64,
    pub lat_p99_us: f64,
    pub lat_mean_us: f64,
    /// I/O commands the server executed between the point's BEGIN and END
    /// markers (its slices' ramps included).
    pub server_ios: Option<u64>,
    /// The host's cores over this device's slices, each from its slice
    /// marker to the next (fio's start and ramp included).
    pub host_cores: Option<HostCores>,
}

pub fn main(opts: &GuestBenchOptions) -> Result<()> {
    check(opts)?;
    let rig = opts
        .rig
        .canonicalize()
        .with_context(|| format!("guest rig {}", opts.rig.display()))?;
    ensure_rig(&rig)?;
    let tmp = TempDir::new()?;
    let mut devices = Vec::new();
    if opts.qemu_nvme {
        devices.push(Device::QemuNvme { dbcs: true });
        devices.push(Device::QemuNvme { dbcs: false });
    }
    for &mode in &opts.modes {
        devices.push(Device::Vnvme { mode, b: false });
        if let Some(b) = &opts.b {
            devices.push(Device::Vnvme { mode, b: true });
            eprintln!("bench --guest: vnvme {mode} B: {}", b.describe());
        }
    }
    let script = tmp.path().join("bench.sh");
    std::fs::write(&script, guest_script(opts, &devices))
        .with_context(|| format!("writing {}", script.display()))?;

    let points = opts.engines.len() * opts.qd.len();
    let slices = points * devices.len() * rounds(opts.runtime) as usize;
    let expected =
        25.0 + slices as f64 * (SLICE + RAMP + 0.5) + points as f64 * 2.0 * f64::from(QUIET);
    eprintln!(
        "bench --guest: one boot, {} devices x {} fio points x {} rounds of {SLICE} s slices \
         (after a {RAMP} s ramp each): about {:.0} min; logs in {}",
        devices.len(),
        points,
        rounds(opts.runtime),
        expected / 60.0,
        tmp.path().display()
    );
    let runs = match boot(opts, &rig, &script, tmp.path(), &devices, expected) {
        Ok(r) => r,
        Err(e) => {
            tmp.keep();
            return Err(e.context(format!("logs kept in {}", tmp.path().display())));
        }
    };
    print!("{}", table(&runs));
    if let Some(path) = &opts.json {
        let doc = serde_json::json!({
            "runs": runs,
            "runtime_s": opts.runtime,
            "slice_s": SLICE,
            "ramp_s": RAMP,
            "method": "one guest boot with every device attached; per point, fio runs one slice on each device in turn, the order rotated every round",
            "guest": "tests/guest rig: QEMU 11.1 -accel tcg, Debian trixie kernel, fio 4 KiB randread direct",
            "machine": report::machine(),
        });
        super::write_json(path, &doc, "bench --guest")?;
    }
    Ok(())
}

fn check(opts: &GuestBenchOptions) -> Result<()> {
    if !(opts.runtime >= 1.0 && opts.runtime <= 3600.0) {
        bail!(
            "--runtime must be between 1 and 3600 seconds with --guest (got {})",
            opts.runtime
        );
    }
    super::check_qd(&opts.qd)?;
    if opts.engines.is_empty() {
        bail!("--engines is empty");
    }
    if !rustix::process::geteuid().is_root() {
        bail!("--guest boots QEMU in the rig's chroot: run as root");
    }
    Ok(())
}

/// The rig's QEMU and guest must exist; if not, run `setup.sh` (about a
/// minute, cold). Not run when they exist: a rebuild would replace the guest
/// under concurrent runs.
fn ensure_rig(rig: &Path) -> Result<()> {
    let cache = std::env::var_os("VNVME_RIG_CACHE").map_or_else(
        || {
            let base = std::env::var_os("XDG_CACHE_HOME").map_or_else(
                || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache"),
                PathBuf::from,
            );
            base.join("vnvme-rig")
        },
        PathBuf::from,
    );
    let chroot = std::env::var_os("RIG_CHROOT").map_or_else(|| cache.join("trixie"), PathBuf::from);
    let out = std::env::var_os("RIG_OUT").map_or_else(|| cache.join("guest"), PathBuf::from);
    let ready = chroot.join("usr/bin/qemu-system-x86_64").exists()
        && out.join("vmlinuz").exists()
        && out.join("initramfs.cpio.gz").exists();
    if ready {
        return Ok(());
    }
    let setup = rig.join("setup.sh");
    eprintln!(
        "bench --guest: the guest rig is not set up: running {} (about a minute)",
        setup.display()
    );
    let status = Command::new(&setup)
        .status()
        .with_context(|| format!("running {}", setup.display()))?;
    if !status.success() {
        bail!(
            "{} failed ({status}); see its log lines above",
            setup.display()
        );
    }
    Ok(())
}

/// The one guest boot with every device: the points, in device order.
fn boot(
    opts: &GuestBenchOptions,
    rig: &Path,
    script: &Path,
    dir: &Path,
    devices: &[Device],
    expected: f64,
) -> Result<Vec<GuestRun>> {
    let console = dir.join("console.log");
    let results = dir.join("results.jsonl");
    let harness = dir.join("harness.log");
    let qemu_pidfile = dir.join("qemu.pid");
    let mut cmd = Command::new(rig.join("run-test.sh"));
    let mut servers = start_servers(opts, dir, devices)?;
    for served in &servers {
        cmd.arg("--vfio-user").arg(&served.server.socket);
    }
    for &device in devices {
        cmd.args(qemu_nvme_args(device));
    }
    if let Some(file) = &opts.mem_file {
        cmd.arg("--mem-file").arg(file);
    }
    let timeout = (expected * 2.0 + 120.0) as u64;
    cmd.args(["--timeout", &timeout.to_string()])
        .arg("--log")
        .arg(&console)
        .arg("--results")
        .arg(&results)
        .arg("--pidfile")
        .arg(&qemu_pidfile)
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&harness)?);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", rig.join("run-test.sh").display()))?;
    let mut watch = Watch::new(&dir.join("markers.txt"));
    let status = loop {
        watch.follow(&console, &qemu_pidfile, &servers);
        if let Some(status) = child.try_wait()? {
            break status;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    for served in &mut servers {
        served.server.stop();
    }
    let code = status.code().unwrap_or(-1);
    let slices = read_slices(&results);
    let mut runs = Vec::new();
    for &device in devices {
        for &engine in &opts.engines {
            for &qd in &opts.qd {
                runs.extend(point_run(opts, device, engine, qd, &slices, &watch));
            }
        }
    }
    if code != 0 {
        let last = std::fs::read_to_string(&harness).unwrap_or_default();
        let last = last.lines().last().unwrap_or_default().to_string();
        let why = host::run_test_failure(code);
        if runs.is_empty() {
            bail!(
                "run-test.sh exit {code}: {why}: {last} (console {})",
                console.display()
            );
        }
        eprintln!(
            "bench --guest:   warning: run-test.sh exit {code}: {why}; console {}",
            console.display()
        );
    }
    Ok(runs)
}

/// A vnvme server of the boot and its stats file.
struct Served {
    device: Device,
    server: Server,
    stats: PathBuf,
}

/// One `vnvme serve` per vnvme device, each in a folder of its own (socket,
/// log, stats) named by its serial number.
fn start_servers(opts: &GuestBenchOptions, dir: &Path, devices: &[Device]) -> Result<Vec<Served>> {
    let mut servers = Vec::new();
    for &device in devices {
        let Device::Vnvme { mode, b } = device else {
            continue;
        };
        let sdir = dir.join(device.serial());
        std::fs::create_dir_all(&sdir)?;
        let stats = sdir.join("stats.json");
        let mut args = vec![
            "--ns".to_string(),
            "1G:null".to_string(),
            "--doorbells".to_string(),
            mode.to_string(),
            "--serial".to_string(),
            device.serial(),
        ];
        args.extend(opts.serve_args.iter().cloned());
        let exe = match (b, &opts.b) {
            (true, Some(spec)) => {
                args.extend(spec.args.iter().cloned());
                spec.exe.clone()
            }
            _ => None,
        };
        let server = Server::start(exe.as_deref(), &sdir, &stats, &args)
            .with_context(|| format!("starting {}", device.label()))?;
        servers.push(Served {
            device,
            server,
            stats,
        });
    }
    Ok(servers)
}

/// What the host gathers from the console's marker lines as the guest
/// runs.
#[derive(Default)]
struct Watch {
    tail: Tail,
    /// Every marker line with the host's CLOCK_MONOTONIC time (seconds) at
    /// which the host saw it, within the 20 ms it polls the console: the
    /// slices' times for `bench/sched-waits.sh` and other host traces.
    markers: Option<std::fs::File>,
    /// Per point and vnvme serial: the server's stats at BEGIN and at END.
    windows: BTreeMap<(String, String), (Option<Counters>, Option<Counters>)>,
    /// Per "point@serial": the host's cores over that device's slices.
    cores: BTreeMap<String, cpu::Window>,
    /// The slice under way and the host's CPU sample at its start.
    open_slice: Option<(String, cpu::Sample)>,
}

impl Watch {
    fn new(markers: &Path) -> Self {
        let markers = std::fs::File::create(markers)
            .inspect_err(|e| eprintln!("bench --guest:   warning: {}: {e}", markers.display()))
            .ok();
        Self {
            markers,
            ..Self::default()
        }
    }

    /// Acts on the console's new marker lines: a slice marker samples the
    /// host's CPU, BEGIN and END snapshot every server's stats.
    fn follow(&mut self, console: &Path, qemu_pidfile: &Path, servers: &[Served]) {
        for line in self.tail.lines(console) {
            if let Some(f) = &mut self.markers {
                let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
                // Losing the file loses only the times, not the run.
                let _ = writeln!(f, "{}.{:06} {line}", t.tv_sec, t.tv_nsec / 1000);
            }
            if let Some(key) = line.strip_prefix(SLICE_MARK) {
                let qemu_pid = std::fs::read_to_string(qemu_pidfile)
                    .ok()
                    .and_then(|t| t.trim().parse().ok());
                let pids: Vec<u32> = servers.iter().map(|s| s.server.pid()).collect();
                let sample = cpu::sample(qemu_pid, &pids);
                if let Some((key, start)) = self.open_slice.take() {
                    self.cores.entry(key).or_default().add(&start, &sample);
                }
                let key = key.trim();
                if key != "-" {
                    self.open_slice = Some((key.to_string(), sample));
                }
                continue;
            }
            let (name, begin) = if let Some(n) = line.strip_prefix(BEGIN) {
                (n.trim().to_string(), true)
            } else if let Some(n) = line.strip_prefix(END) {
                (n.trim().to_string(), false)
            } else {
                continue;
            };
            if !begin {
                eprintln!("bench --guest:   {name} done");
            }
            let paths: Vec<&Path> = servers.iter().map(|s| s.stats.as_path()).collect();
            let snaps = fresh_stats(&paths);
            for (served, snap) in servers.iter().zip(snaps) {
                let w = self
                    .windows
                    .entry((name.clone(), served.device.serial()))
                    .or_default();
                if begin {
                    w.0 = snap;
                } else {
                    w.1 = snap;
                }
            }
        }
    }
}

/// The guest's fio results by (point, serial); a failed slice is reported
/// and left out.
fn read_slices(results: &Path) -> BTreeMap<(String, String), Vec<Value>> {
    let text = std::fs::read_to_string(results).unwrap_or_default();
    let mut slices: BTreeMap<(String, String), Vec<Value>> = BTreeMap::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let name = v.get("name").and_then(Value::as_str).unwrap_or_default();
        let Some((point, serial)) = name.split_once('@') else {
            continue;
        };
        if let Some(err) = v.get("err").filter(|e| e.is_string()) {
            eprintln!("bench --guest:   {name}: fio failed: {err}");
            continue;
        }
        slices
            .entry((point.to_string(), serial.to_string()))
            .or_default()
            .push(v);
    }
    slices
}

/// One device's figures at one point, printed as they are found; `None`
/// (said why) without fio results.
fn point_run(
    opts: &GuestBenchOptions,
    device: Device,
    engine: Engine,
    qd: u16,
    slices: &BTreeMap<(String, String), Vec<Value>>,
    watch: &Watch,
) -> Option<GuestRun> {
    let serial = device.serial();
    let point = format!("{}-qd{qd}", engine.name());
    let key = (point.clone(), serial.clone());
    let Some(measured) = slices.get(&key) else {
        eprintln!("bench --guest:   {point} on {}: no result", device.label());
        return None;
    };
    let fio = Slices::sum(measured)?;
    let per_io = match watch.windows.get(&key) {
        Some((Some(a), Some(b))) => Some(a.per_io(b)),
        _ if matches!(device, Device::Vnvme { .. }) => {
            eprintln!(
                "bench --guest:   {point} on {}: no stats window (markers or stats file missing)",
                device.label()
            );
            None
        }
        _ => None,
    };
    let run = GuestRun {
        device: device.kind(),
        mode: device.mode(),
        dbcs: device.dbcs(),
        b: match device {
            Device::Vnvme { b: true, .. } => opts.b.as_ref().map(BServer::describe),
            _ => None,
        },
        engine,
        qd,
        iops: fio.iops(),
        slices: fio.slices,
        traps_per_io: per_io.map(|p| p.0),
        interrupts_per_io: per_io.map(|p| p.1),
        guest_interrupts_per_io: fio.guest_interrupts_per_io(),
        lat_p50_us: fio.p50_us,
        lat_p99_us: fio.p99_us,
        lat_mean_us: fio.lat_mean_us,
        server_ios: per_io.map(|p| p.2),
        host_cores: watch
            .cores
            .get(&format!("{point}@{serial}"))
            .and_then(cpu::Window::cores),
    };
    let per = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.3}"));
    eprintln!(
        "bench --guest:   {:<19} {:<9} qd {:>3}: {:>8.0} IOPS, traps/IO {}, irq/IO {} (guest {}), latency p50 {:.0} us p99 {:.0} us{}",
        device.label(),
        engine.name(),
        qd,
        run.iops,
        per(run.traps_per_io),
        per(run.interrupts_per_io),
        per(run.guest_interrupts_per_io),
        run.lat_p50_us,
        run.lat_p99_us,
        run.host_cores.as_ref().map_or(String::new(), cores_line)
    );
    Some(run)
}

/// ", cores: vCPUs 1.62 (+0.21 waiting), QEMU 0.10, server 0.85".
fn cores_line(c: &HostCores) -> String {
    let g = |x: &GroupCores| format!("{:.2} (+{:.2} waiting)", x.ran, x.waited);
    let server = c
        .server
        .as_ref()
        .map_or(String::new(), |s| format!(", server {}", g(s)));
    format!(
        ", cores: vCPUs {}, QEMU {}{server}",
        g(&c.vcpus),
        g(&c.qemu_other)
    )
}
