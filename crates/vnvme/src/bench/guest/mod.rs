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
//!   (`fio_json` in the guest's `guest-lib.sh`); latency percentiles are the
//!   means of the slices' own;
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
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use serde::Serialize;
use serde_json::Value;
use vnvme_controller::DoorbellMode;

mod cpu;
mod host;
pub mod passthru;

use super::report;
use super::report::kilo;
pub use cpu::{GroupCores, HostCores};
use host::{Server, Tail, TempDir};

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
        // Clap's text names the bad value only; this names the good ones.
        <Self as ValueEnum>::from_str(s, false)
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
    /// Seconds per fio point (after a 1 s ramp).
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
        let args = std::env::var("VNVME_BENCH_B_ARGS").ok();
        if exe.is_none() && args.is_none() {
            return None;
        }
        Some(Self {
            exe,
            args: args
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_string)
                .collect(),
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

/// `VNVME_BENCH_SERVE_ARGS`: extra `vnvme serve` arguments, split on whitespace.
fn serve_args_from_env() -> Vec<String> {
    std::env::var("VNVME_BENCH_SERVE_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
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
    /// fio's I/O including its 1 s ramp (`iops` × (runtime + 1 s)): the
    /// same count for QEMU's nvme, which has no counters of ours.
    pub guest_interrupts_per_io: Option<f64>,
    pub clat_p50_us: f64,
    pub clat_p99_us: f64,
    pub lat_mean_us: f64,
    /// I/O commands the server executed in the window (ramp included).
    pub server_ios: Option<u64>,
    /// The host's cores over the same window (from one marker to the
    /// next: fio's ramp and the quiet seconds before it included).
    pub host_cores: Option<HostCores>,
}

/// The counters read from one `--stats` file.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    traps: u64,
    interrupts: u64,
    io_commands: u64,
}

impl Counters {
    fn parse(v: &Value) -> Option<Self> {
        let n = |k: &str| v.get(k).and_then(Value::as_u64);
        let admin = v
            .get("queues")
            .and_then(Value::as_array)
            .and_then(|qs| {
                qs.iter()
                    .find(|q| q.get("qid").and_then(Value::as_u64) == Some(0))
            })
            .and_then(|q| q.get("commands").and_then(Value::as_u64))
            .unwrap_or(0);
        Some(Self {
            traps: n("sq_doorbell_traps")? + n("cq_doorbell_traps")?,
            interrupts: n("interrupts")?,
            io_commands: n("commands")?.saturating_sub(admin),
        })
    }

    /// Traps and interrupts per I/O command from `self` to `later`, and the
    /// I/O commands.
    fn per_io(&self, later: &Self) -> (f64, f64, u64) {
        let ios = later.io_commands.saturating_sub(self.io_commands);
        let d = ios.max(1) as f64;
        (
            later.traps.saturating_sub(self.traps) as f64 / d,
            later.interrupts.saturating_sub(self.interrupts) as f64 / d,
            ios,
        )
    }
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

/// Rounds per point: one slice on every device each, so that each device
/// gets `--runtime` seconds of measured fio in all.
fn rounds(runtime: f64) -> u32 {
    (runtime / SLICE).round().max(1.0) as u32
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

/// The guest side: the devices found by serial number, then per engine ×
/// depth a window bracketed by marker lines and quiet periods (for the host's
/// stats snapshots), in which each round runs one fio slice on every device,
/// in an order rotated by one each round. Slice marker lines let the host
/// split its CPU samples by device.
fn guest_script(opts: &GuestBenchOptions, devices: &[Device]) -> String {
    let engines: Vec<&str> = opts.engines.iter().map(|e| e.name()).collect();
    let qds: Vec<String> = opts.qd.iter().map(u16::to_string).collect();
    let serials: Vec<String> = devices.iter().map(|d| d.serial()).collect();
    format!(
        r#"# generated by vnvme bench --guest
. /guest-lib.sh
DEVS="{serials}"
N=$(echo $DEVS | wc -w)
# The namespace block device and the controller of a serial number.
bdev_of() {{
  for _b in /sys/block/nvme*; do
    [ "$(tr -d ' ' < "$_b/device/serial" 2>/dev/null)" = "$1" ] && {{ echo "/dev/${{_b##*/}}"; return 0; }}
  done; return 1
}}
ctrl_of() {{
  for _c in /sys/class/nvme/nvme*; do
    [ "$(tr -d ' ' < "$_c/serial" 2>/dev/null)" = "$1" ] && {{ echo "${{_c##*/}}"; return 0; }}
  done; return 1
}}
for d in $DEVS; do
  i=0
  until bdev_of "$d" > /dev/null && ctrl_of "$d" > /dev/null; do
    [ $i -ge 200 ] && die "no nvme namespace with serial $d"
    sleep 0.1; i=$((i + 1))
  done
  log "device $d: $(bdev_of "$d") on $(ctrl_of "$d")"
done
# Interrupts the guest took on the I/O queues' vectors of controller $1.
io_irqs() {{
  awk -v c="$1" '$NF ~ ("^" c "q[1-9][0-9]*$") {{ for (i = 2; i <= NF && $i ~ /^[0-9]+$/; i++) n += $i }}
       END {{ print n + 0 }}' /proc/interrupts
}}
rc=0
for e in {engines}; do
  for q in {qds}; do
    p=$e-qd$q
    echo "{BEGIN}$p"; sleep {QUIET}
    r=0
    while [ $r -lt {rounds} ]; do
      # rotate: round r starts at device r mod N
      order=$(echo $DEVS $DEVS | cut -d' ' -f$((r % N + 1))-$((r % N + N)))
      for d in $order; do
        b=$(bdev_of "$d"); c=$(ctrl_of "$d"); irqs=$(io_irqs "$c")
        echo "{SLICE_MARK}$p@$d"
        out=$(fio_json "$p@$d" --filename="$b" --rw=randread --bs=4k --ioengine="$e" --direct=1 \
          --iodepth="$q" --numjobs=1 --time_based --runtime={SLICE} --ramp_time={ramp_ms}ms) || rc=1
        echo "{SLICE_MARK}-"
        irqs=$(($(io_irqs "$c") - irqs))
        echo "$out" | sed "s/^RESULT {{/RESULT {{\"guest_irqs\":$irqs,/"
      done
      r=$((r + 1))
    done
    echo "{END}$p"; sleep {QUIET}
  done
done
check_no_nvme_errors || rc=1
exit $rc
"#,
        serials = serials.join(" "),
        engines = engines.join(" "),
        qds = qds.join(" "),
        rounds = rounds(opts.runtime),
        ramp_ms = (RAMP * 1000.0) as u32,
    )
}

/// The `run-test.sh` arguments that attach QEMU's nvme as `device`: a
/// null-co drive (reads no data, as vnvme's `null`) named by its serial.
fn qemu_nvme_args(device: Device) -> Vec<String> {
    let Device::QemuNvme { dbcs } = device else {
        return Vec::new();
    };
    let id = device.serial();
    [
        "-drive".to_string(),
        format!("id={id},if=none,file=null-co://,file.read-zeroes=off,format=raw"),
        "-device".to_string(),
        format!(
            "nvme,serial={id},drive={id},dbcs={}",
            if dbcs { "on" } else { "off" }
        ),
    ]
    .into_iter()
    .flat_map(|a| ["--qemu-arg".to_string(), a])
    .collect()
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
    // vnvme's servers, each in a folder of its own (socket, log, stats).
    let mut servers: Vec<(Device, Server, PathBuf)> = Vec::new();
    for &device in devices {
        match device {
            Device::Vnvme { mode, b } => {
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
                cmd.arg("--vfio-user").arg(&server.socket);
                servers.push((device, server, stats));
            }
            Device::QemuNvme { .. } => {
                cmd.args(qemu_nvme_args(device));
            }
        }
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
    let server_pids: Vec<u32> = servers.iter().map(|(_, s, _)| s.pid()).collect();
    let mut tail = Tail::default();
    // Per point, per vnvme serial: the stats at BEGIN and at END.
    let mut windows: BTreeMap<(String, String), (Option<Counters>, Option<Counters>)> =
        BTreeMap::new();
    // Per "point@serial": the host's cores over that device's slices.
    let mut cores: BTreeMap<String, cpu::Window> = BTreeMap::new();
    let mut open_slice: Option<(String, cpu::Sample)> = None;
    let status = loop {
        for line in tail.lines(&console) {
            if let Some(key) = line.strip_prefix(SLICE_MARK) {
                let qemu_pid = std::fs::read_to_string(&qemu_pidfile)
                    .ok()
                    .and_then(|t| t.trim().parse().ok());
                let sample = cpu::sample(qemu_pid, &server_pids);
                if let Some((key, start)) = open_slice.take() {
                    cores.entry(key).or_default().add(&start, &sample);
                }
                let key = key.trim();
                if key != "-" {
                    open_slice = Some((key.to_string(), sample));
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
            let paths: Vec<&Path> = servers.iter().map(|(_, _, p)| p.as_path()).collect();
            let snaps = fresh_stats(&paths);
            for ((device, _, _), snap) in servers.iter().zip(snaps) {
                let w = windows.entry((name.clone(), device.serial())).or_default();
                if begin {
                    w.0 = snap;
                } else {
                    w.1 = snap;
                }
            }
        }
        if let Some(status) = child.try_wait()? {
            break status;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    for (_, s, _) in &mut servers {
        s.stop();
    }
    let code = status.code().unwrap_or(-1);
    let text = std::fs::read_to_string(&results).unwrap_or_default();
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
    let mut runs = Vec::new();
    for &device in devices {
        let serial = device.serial();
        for &engine in &opts.engines {
            for &qd in &opts.qd {
                let point = format!("{}-qd{qd}", engine.name());
                let Some(measured) = slices.get(&(point.clone(), serial.clone())) else {
                    eprintln!("bench --guest:   {point} on {}: no result", device.label());
                    continue;
                };
                let Some(fio) = Slices::sum(measured) else {
                    continue;
                };
                let per_io = match windows.get(&(point.clone(), serial.clone())) {
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
                    device: match device {
                        Device::QemuNvme { .. } => "qemu-nvme",
                        Device::Vnvme { .. } => "vnvme",
                    },
                    mode: match device {
                        Device::Vnvme { mode, .. } => Some(mode.to_string()),
                        Device::QemuNvme { .. } => None,
                    },
                    dbcs: match device {
                        Device::QemuNvme { dbcs } => Some(dbcs),
                        Device::Vnvme { .. } => None,
                    },
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
                    clat_p50_us: fio.p50_us,
                    clat_p99_us: fio.p99_us,
                    lat_mean_us: fio.lat_mean_us,
                    server_ios: per_io.map(|p| p.2),
                    host_cores: cores
                        .get(&format!("{point}@{serial}"))
                        .and_then(cpu::Window::cores),
                };
                let per = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.3}"));
                eprintln!(
                    "bench --guest:   {:<19} {:<9} qd {:>3}: {:>8.0} IOPS, traps/IO {}, irq/IO {} (guest {}), p99 {:.0} us{}",
                    device.label(),
                    engine.name(),
                    qd,
                    run.iops,
                    per(run.traps_per_io),
                    per(run.interrupts_per_io),
                    per(run.guest_interrupts_per_io),
                    run.clat_p99_us,
                    run.host_cores.as_ref().map_or(String::new(), cores_line)
                );
                runs.push(run);
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

/// One device's fio slices at one point, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Slices {
    slices: u32,
    /// I/Os after the ramps, and the seconds they took.
    ios: f64,
    secs: f64,
    /// I/Os with each ramp counted at its slice's rate: what the guest's
    /// interrupt count spans.
    ios_with_ramp: f64,
    guest_irqs: Option<f64>,
    /// Means over the slices (a percentile of the union is not kept by fio's
    /// terse output; each slice has thousands of I/Os).
    p50_us: f64,
    p99_us: f64,
    /// Weighted by each slice's I/Os.
    lat_mean_us: f64,
}

impl Slices {
    /// `None` for no slice with I/O.
    fn sum(results: &[Value]) -> Option<Self> {
        let mut s = Self {
            guest_irqs: Some(0.0),
            ..Self::default()
        };
        for v in results {
            let f = |k: &str| v.get(k).and_then(Value::as_f64);
            let (Some(iops), Some(ms)) = (f("iops"), f("runtime_ms")) else {
                continue;
            };
            let ios = f("io_kib").map_or(iops * ms / 1000.0, |k| k / 4.0);
            s.slices += 1;
            s.ios += ios;
            s.secs += ms / 1000.0;
            s.ios_with_ramp += ios + iops * RAMP;
            s.guest_irqs = s.guest_irqs.zip(f("guest_irqs")).map(|(a, b)| a + b);
            s.p50_us += f("clat_p50_us").unwrap_or(0.0);
            s.p99_us += f("clat_p99_us").unwrap_or(0.0);
            s.lat_mean_us += f("lat_mean_us").unwrap_or(0.0) * ios;
        }
        if s.slices == 0 || s.ios <= 0.0 {
            return None;
        }
        s.p50_us /= f64::from(s.slices);
        s.p99_us /= f64::from(s.slices);
        s.lat_mean_us /= s.ios;
        Some(s)
    }

    fn iops(&self) -> f64 {
        self.ios / self.secs.max(1e-9)
    }

    fn guest_interrupts_per_io(&self) -> Option<f64> {
        self.guest_irqs.map(|n| n / self.ios_with_ramp.max(1.0))
    }
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

/// Waits (up to 1.8 s in all) for each server to rewrite its stats file
/// after now, then reads them. `None` for one that never did or does not
/// parse.
fn fresh_stats(paths: &[&Path]) -> Vec<Option<Counters>> {
    let (since, wall) = (Instant::now(), SystemTime::now());
    let mut snaps: Vec<Option<Option<Counters>>> = vec![None; paths.len()];
    while since.elapsed() < Duration::from_millis(1800) && snaps.iter().any(Option::is_none) {
        for (path, snap) in paths.iter().zip(&mut snaps) {
            let fresh = std::fs::metadata(path)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t > wall);
            if snap.is_none() && fresh {
                let v = std::fs::read(path)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
                *snap = Some(v.as_ref().and_then(Counters::parse));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    snaps.into_iter().map(Option::flatten).collect()
}

/// The reference of a point: QEMU's nvme with dbcs=on, same engine and
/// depth; without it (`VNVME_BENCH_NO_QEMU=1`) the point's first device.
fn reference(runs: &[GuestRun], engine: Engine, qd: u16) -> Option<f64> {
    let point = || runs.iter().filter(|r| r.engine == engine && r.qd == qd);
    point()
        .find(|r| r.device == "qemu-nvme" && r.dbcs == Some(true))
        .or_else(|| point().next())
        .map(|r| r.iops)
        .filter(|&i| i > 0.0)
}

/// "vnvme adaptive B", "qemu-nvme dbcs=on".
fn label(r: &GuestRun) -> String {
    match (&r.mode, r.dbcs) {
        (Some(m), _) if r.b.is_some() => format!("vnvme {m} B"),
        (Some(m), _) => format!("vnvme {m}"),
        (None, Some(d)) => format!("qemu-nvme dbcs={}", if d { "on" } else { "off" }),
        (None, None) => r.device.to_string(),
    }
}

/// One table: grouped by engine and depth, one row per device configuration.
pub fn table(runs: &[GuestRun]) -> String {
    let mut keys: Vec<(Engine, u16)> = Vec::new();
    for r in runs {
        if !keys.contains(&(r.engine, r.qd)) {
            keys.push((r.engine, r.qd));
        }
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n{:<9} {:>4}  {:<19} {:>8} {:>8} {:>9} {:>7} {:>9} {:>8}",
        "engine", "qd", "device", "IOPS", "vs qemu", "traps/IO", "irq/IO", "guest irq", "p99 us"
    );
    for (engine, qd) in keys {
        let base = reference(runs, engine, qd);
        for r in runs.iter().filter(|r| r.engine == engine && r.qd == qd) {
            let device = label(r);
            let ratio = base.map_or("-".to_string(), |b| format!("{:.2}x", r.iops / b));
            let per = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.3}"));
            let _ = writeln!(
                s,
                "{:<9} {:>4}  {:<19} {:>8} {:>8} {:>9} {:>7} {:>9} {:>8.0}",
                engine.name(),
                qd,
                device,
                kilo(r.iops),
                ratio,
                per(r.traps_per_io),
                per(r.interrupts_per_io),
                per(r.guest_interrupts_per_io),
                r.clat_p99_us
            );
        }
    }
    if !runs.iter().any(|r| r.device == "qemu-nvme") {
        if let Some(first) = runs.first() {
            let _ = writeln!(s, "(no QEMU nvme: \"vs qemu\" is to {})", label(first));
        }
    }
    if let Some(b) = runs.iter().find_map(|r| r.b.as_ref()) {
        let _ = writeln!(s, "B: {b}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(device: &'static str, mode: Option<&str>, dbcs: Option<bool>, iops: f64) -> GuestRun {
        GuestRun {
            device,
            mode: mode.map(str::to_string),
            dbcs,
            b: None,
            engine: Engine::IoUring,
            qd: 4,
            iops,
            slices: 8,
            traps_per_io: mode.map(|_| 0.05),
            interrupts_per_io: mode.map(|_| 1.0),
            guest_interrupts_per_io: Some(0.5),
            clat_p50_us: 100.0,
            clat_p99_us: 300.0,
            lat_mean_us: 110.0,
            server_ios: None,
            host_cores: None,
        }
    }

    #[test]
    fn slices_sum_to_ios_over_seconds_with_ramps_in_the_interrupt_count() {
        let slice = |iops: f64, p99: f64, irqs: u64| {
            serde_json::json!({"iops": iops, "io_kib": iops * 4.0, "runtime_ms": 1000,
                "clat_p50_us": 100, "clat_p99_us": p99, "lat_mean_us": 1e6 / iops,
                "guest_irqs": irqs})
        };
        let s = Slices::sum(&[slice(1000.0, 300.0, 750), slice(3000.0, 500.0, 2250)]).unwrap();
        assert_eq!(s.slices, 2);
        assert_eq!(s.iops(), 2000.0);
        assert_eq!(s.p99_us, 400.0);
        // 4000 I/Os measured, 2000 more in the two 0.5 s ramps.
        assert_eq!(s.guest_interrupts_per_io(), Some(0.5));
        // Means weighted by I/Os: (1000 × 1000 + 3000 × 333.3) / 4000.
        assert!((s.lat_mean_us - 500.0).abs() < 0.1, "{}", s.lat_mean_us);

        let no_count = serde_json::json!({"iops": 10, "runtime_ms": 1000});
        let s = Slices::sum(&[no_count]).unwrap();
        assert_eq!(s.guest_interrupts_per_io(), None);
        assert_eq!(Slices::sum(&[]), None);
    }

    #[test]
    fn the_guest_script_rotates_every_device_each_round() {
        let opts = GuestBenchOptions {
            modes: vec![DoorbellMode::Adaptive],
            qd: vec![1, 32],
            engines: vec![Engine::IoUring],
            runtime: 3.0,
            qemu_nvme: true,
            serve_args: Vec::new(),
            b: None,
            json: None,
            rig: GuestBenchOptions::default_rig(),
        };
        let devices = [
            Device::QemuNvme { dbcs: true },
            Device::Vnvme {
                mode: DoorbellMode::Adaptive,
                b: false,
            },
        ];
        let s = guest_script(&opts, &devices);
        assert!(s.contains(r#"DEVS="qemu-dbcs-on vnvme-adaptive""#), "{s}");
        assert!(s.contains("-lt 3 ]"), "{s}");
        assert!(s.contains("--runtime=1 --ramp_time=500ms"), "{s}");
        assert!(devices.iter().all(|d| d.serial().len() <= 20));
    }

    #[test]
    fn table_shows_ratio_to_qemu_nvme_with_dbcs_on() {
        let t = table(&[
            run("qemu-nvme", None, Some(true), 10_000.0),
            run("qemu-nvme", None, Some(false), 9_000.0),
            run("vnvme", Some("adaptive"), None, 15_000.0),
        ]);
        assert!(t.contains("1.50x"), "{t}");
        assert!(t.contains("0.90x"), "{t}");
        assert!(t.contains("vnvme adaptive"), "{t}");
    }

    #[test]
    fn json_keeps_the_documented_field_names() {
        let v = serde_json::to_value(run("vnvme", Some("trap"), None, 1.0)).unwrap();
        for k in [
            "device",
            "mode",
            "dbcs",
            "engine",
            "qd",
            "iops",
            "traps_per_io",
            "interrupts_per_io",
            "guest_interrupts_per_io",
        ] {
            assert!(v.get(k).is_some(), "{k}");
        }
        assert_eq!(v["engine"], "io_uring");
        assert_eq!(v["dbcs"], Value::Null);
    }

    #[test]
    fn counters_exclude_admin_commands() {
        let v = serde_json::json!({
            "sq_doorbell_traps": 5, "cq_doorbell_traps": 2, "interrupts": 9, "commands": 110,
            "queues": [{"qid": 0, "commands": 10}, {"qid": 1, "commands": 100}]
        });
        let c = Counters::parse(&v).unwrap();
        assert_eq!((c.traps, c.interrupts, c.io_commands), (7, 9, 100));
    }

    #[test]
    fn markers_are_found_after_kernel_output() {
        let dir = std::env::temp_dir().join(format!("vnvme-tail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("c.log");
        std::fs::write(
            &p,
            "boot\r\n[ 1.0] x VNVME-BENCH-BEGIN io_uring-qd1\r\nVNVME-BENCH-E",
        )
        .unwrap();
        let mut t = Tail::default();
        assert_eq!(t.lines(&p), vec!["VNVME-BENCH-BEGIN io_uring-qd1"]);
        std::fs::write(
            &p,
            "boot\r\n[ 1.0] x VNVME-BENCH-BEGIN io_uring-qd1\r\nVNVME-BENCH-END io_uring-qd1\r\n\
             VNVME-BENCH-SLICE io_uring-qd1@vnvme-trap\r\n",
        )
        .unwrap();
        assert_eq!(
            t.lines(&p),
            vec![
                "VNVME-BENCH-END io_uring-qd1",
                "VNVME-BENCH-SLICE io_uring-qd1@vnvme-trap"
            ]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
