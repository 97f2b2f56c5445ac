//! `vnvme bench --guest`: the same Linux guest (the `tests/guest` rig: QEMU
//! 11.1, TCG, Debian's kernel and fio) booted once per device configuration —
//! QEMU's built-in `nvme` (null-co, reads zeroes) with shadow doorbells on and
//! off, then `vnvme serve --ns 1G:null` in each doorbell mode — each boot
//! running fio 4 KiB randread for every engine × queue depth.
//!
//! What is measured, per point:
//! * IOPS: fio's (`fio_json` in the guest's `guest-lib.sh`), after its 1 s
//!   ramp;
//! * traps and interrupts per I/O (vnvme only): deltas of the server's
//!   `--stats` counters (SQ + CQ doorbell traps, interrupts raised) divided by
//!   the delta of I/O commands the controller executed, between two
//!   snapshots the guest brackets the fio job with. The guest prints a marker
//!   line and sleeps `QUIET` (2 s) before and after the job; the host takes the
//!   first stats file written after it saw the marker (the server rewrites it
//!   every second), so the window holds exactly that job's I/O (ramp and
//!   fio's own open/close included) and nothing else.
//! * guest interrupts per I/O (every device): the interrupts the guest took
//!   on its nvme I/O queue vectors (`/proc/interrupts`) around the fio job,
//!   over fio's I/Os with its 1 s ramp counted at the measured rate: how
//!   QEMU's nvme, which has no counters of ours, batches its completions.

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
    /// vnvme doorbell modes, one guest boot each.
    pub modes: Vec<DoorbellMode>,
    /// fio iodepths.
    pub qd: Vec<u16>,
    pub engines: Vec<Engine>,
    /// Seconds per fio point (after a 1 s ramp).
    pub runtime: f64,
    /// Also boot QEMU's built-in nvme (dbcs on and off) as the reference.
    pub qemu_nvme: bool,
    /// Extra `vnvme serve` arguments (e.g. `--idle-poll-us 20`).
    pub serve_args: Vec<String>,
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
    /// whitespace) and `VNVME_BENCH_NO_QEMU=1` (skip the reference boots).
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

/// `VNVME_BENCH_SERVE_ARGS`: extra `vnvme serve` arguments, split on whitespace.
fn serve_args_from_env() -> Vec<String> {
    std::env::var("VNVME_BENCH_SERVE_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// One device configuration: one guest boot.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Config {
    QemuNvme { dbcs: bool },
    Vnvme(DoorbellMode),
}

impl Config {
    fn label(self) -> String {
        match self {
            Config::QemuNvme { dbcs } => {
                format!("qemu-nvme dbcs={}", if dbcs { "on" } else { "off" })
            }
            Config::Vnvme(m) => format!("vnvme {m}"),
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
    pub engine: Engine,
    pub qd: u16,
    pub iops: f64,
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
}

pub fn main(opts: &GuestBenchOptions) -> Result<()> {
    check(opts)?;
    let rig = opts
        .rig
        .canonicalize()
        .with_context(|| format!("guest rig {}", opts.rig.display()))?;
    ensure_rig(&rig)?;
    let tmp = TempDir::new()?;
    let script = tmp.path().join("bench.sh");
    std::fs::write(&script, guest_script(opts))
        .with_context(|| format!("writing {}", script.display()))?;

    let mut configs = Vec::new();
    if opts.qemu_nvme {
        configs.push(Config::QemuNvme { dbcs: true });
        configs.push(Config::QemuNvme { dbcs: false });
    }
    configs.extend(opts.modes.iter().map(|&m| Config::Vnvme(m)));
    let points = opts.engines.len() * opts.qd.len();
    let per_boot = 15.0 + points as f64 * (opts.runtime + 2.0 + 2.0 * f64::from(QUIET));
    eprintln!(
        "bench --guest: {} boots x {} fio points ({} s each): about {:.0} min; logs in {}",
        configs.len(),
        points,
        opts.runtime,
        per_boot * configs.len() as f64 / 60.0,
        tmp.path().display()
    );
    let t0 = Instant::now();
    let mut runs = Vec::new();
    let mut failures = Vec::new();
    for (i, &config) in configs.iter().enumerate() {
        eprintln!(
            "bench --guest: [{}/{}] {} (at {:.0} s)",
            i + 1,
            configs.len(),
            config.label(),
            t0.elapsed().as_secs_f64()
        );
        let dir = tmp.path().join(format!("{i}"));
        std::fs::create_dir_all(&dir)?;
        match boot(opts, &rig, &script, &dir, config, per_boot) {
            Ok(mut r) => runs.append(&mut r),
            Err(e) => {
                eprintln!("bench --guest:   {}: FAILED: {e:#}", config.label());
                failures.push(format!("{}: {e:#}", config.label()));
            }
        }
    }
    print!("{}", table(&runs));
    if let Some(path) = &opts.json {
        let doc = serde_json::json!({
            "runs": runs,
            "runtime_s": opts.runtime,
            "guest": "tests/guest rig: QEMU 11.1 -accel tcg, Debian trixie kernel, fio 4 KiB randread direct",
            "machine": report::machine(),
        });
        super::write_json(path, &doc, "bench --guest")?;
    }
    if !failures.is_empty() {
        tmp.keep();
        bail!(
            "{} of {} boots failed ({}); logs kept in {}",
            failures.len(),
            configs.len(),
            failures.join("; "),
            tmp.path().display()
        );
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

/// The guest side: every engine × depth, each bracketed by marker lines and
/// quiet periods for the host's stats snapshots.
fn guest_script(opts: &GuestBenchOptions) -> String {
    let engines: Vec<&str> = opts.engines.iter().map(|e| e.name()).collect();
    let qds: Vec<String> = opts.qd.iter().map(u16::to_string).collect();
    let runtime = opts.runtime.round().max(1.0) as u32;
    format!(
        r#"# generated by vnvme bench --guest
. /guest-lib.sh
wait_nvme 20 || die "no /dev/nvme0n1"
rc=0
# Interrupts the guest took on its nvme I/O queues' vectors (any device's).
io_irqs() {{
  awk '/nvme[0-9]+q[1-9]/ {{ for (i = 2; i <= NF && $i ~ /^[0-9]+$/; i++) n += $i }}
       END {{ print n + 0 }}' /proc/interrupts
}}
for e in {engines}; do
  for q in {qds}; do
    echo "{BEGIN}$e-qd$q"; sleep {QUIET}
    irqs=$(io_irqs)
    out=$(fio_randread "$e-qd$q" "$e" "$q" {runtime}) || rc=1
    irqs=$(($(io_irqs) - irqs))
    echo "$out" | sed "s/^RESULT {{/RESULT {{\"guest_irqs\":$irqs,/"
    echo "{END}$e-qd$q"; sleep {QUIET}
  done
done
check_no_nvme_errors || rc=1
exit $rc
"#,
        engines = engines.join(" "),
        qds = qds.join(" "),
    )
}

/// One guest boot on `config`: its points, in the order they ran.
fn boot(
    opts: &GuestBenchOptions,
    rig: &Path,
    script: &Path,
    dir: &Path,
    config: Config,
    expected: f64,
) -> Result<Vec<GuestRun>> {
    let console = dir.join("console.log");
    let results = dir.join("results.jsonl");
    let harness = dir.join("harness.log");
    let stats_path = dir.join("stats.json");
    let qemu_pidfile = dir.join("qemu.pid");
    let mut server = match config {
        Config::Vnvme(mode) => {
            let mut args = vec![
                "--ns".to_string(),
                "1G:null".to_string(),
                "--doorbells".to_string(),
                mode.to_string(),
            ];
            args.extend(opts.serve_args.iter().cloned());
            Some(Server::start(dir, &stats_path, &args)?)
        }
        Config::QemuNvme { .. } => None,
    };
    let mut cmd = Command::new(rig.join("run-test.sh"));
    match (config, &server) {
        (Config::QemuNvme { dbcs }, _) => {
            cmd.args(["--qemu-nvme", "--dbcs", if dbcs { "on" } else { "off" }]);
        }
        (Config::Vnvme(_), Some(s)) => {
            cmd.arg("--vfio-user").arg(&s.socket);
        }
        (Config::Vnvme(_), None) => unreachable!("a vnvme boot has a server"),
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
    let mut tail = Tail::default();
    let mut windows: BTreeMap<String, (Option<Counters>, Option<Counters>)> = BTreeMap::new();
    let mut cpu_windows: BTreeMap<String, (Option<cpu::Sample>, Option<cpu::Sample>)> =
        BTreeMap::new();
    let server_pid = server.as_ref().map(Server::pid);
    let status = loop {
        for line in tail.lines(&console) {
            let (name, begin) = if let Some(n) = line.strip_prefix(BEGIN) {
                (n, true)
            } else if let Some(n) = line.strip_prefix(END) {
                (n, false)
            } else {
                continue;
            };
            let name = name.trim().to_string();
            if !begin {
                eprintln!("bench --guest:   {name} done");
            }
            // Before the stats wait below: the sample marks the window's edge.
            let qemu_pid = std::fs::read_to_string(&qemu_pidfile)
                .ok()
                .and_then(|t| t.trim().parse().ok());
            let sample = cpu::sample(qemu_pid, server_pid);
            let c = cpu_windows.entry(name.clone()).or_default();
            if begin {
                c.0 = Some(sample);
            } else {
                c.1 = Some(sample);
            }
            if server.is_some() {
                let snap = fresh_stats(&stats_path, Instant::now());
                let w = windows.entry(name).or_default();
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
        std::thread::sleep(Duration::from_millis(100));
    };
    if let Some(s) = server.as_mut() {
        s.stop();
    }
    let code = status.code().unwrap_or(-1);
    let text = std::fs::read_to_string(&results).unwrap_or_default();
    let mut runs = Vec::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let name = v.get("name").and_then(Value::as_str).unwrap_or_default();
        let Some((engine, qd)) = parse_point(name) else {
            continue;
        };
        if let Some(err) = v.get("err").filter(|e| e.is_string()) {
            eprintln!("bench --guest:   {name}: fio failed: {err}");
            continue;
        }
        let f = |k: &str| v.get(k).and_then(Value::as_f64).unwrap_or(0.0);
        let window = windows.get(name).copied().unwrap_or_default();
        let per_io = match window {
            (Some(a), Some(b)) => {
                let ios = b.io_commands.saturating_sub(a.io_commands);
                let d = ios.max(1) as f64;
                Some((
                    b.traps.saturating_sub(a.traps) as f64 / d,
                    b.interrupts.saturating_sub(a.interrupts) as f64 / d,
                    ios,
                ))
            }
            _ => None,
        };
        if server.is_some() && per_io.is_none() {
            eprintln!("bench --guest:   {name}: no stats window (markers or stats file missing)");
        }
        let run = GuestRun {
            device: match config {
                Config::QemuNvme { .. } => "qemu-nvme",
                Config::Vnvme(_) => "vnvme",
            },
            mode: match config {
                Config::Vnvme(m) => Some(m.to_string()),
                Config::QemuNvme { .. } => None,
            },
            dbcs: match config {
                Config::QemuNvme { dbcs } => Some(dbcs),
                Config::Vnvme(_) => None,
            },
            engine,
            qd,
            iops: f("iops"),
            traps_per_io: per_io.map(|p| p.0),
            interrupts_per_io: per_io.map(|p| p.1),
            guest_interrupts_per_io: guest_interrupts_per_io(&v),
            clat_p50_us: f("clat_p50_us"),
            clat_p99_us: f("clat_p99_us"),
            lat_mean_us: f("lat_mean_us"),
            server_ios: per_io.map(|p| p.2),
            host_cores: match cpu_windows.get(name) {
                Some((Some(a), Some(b))) => Some(cpu::between(a, b)),
                _ => None,
            },
        };
        let per = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.3}"));
        eprintln!(
            "bench --guest:   {:<9} qd {:>3}: {:>8.0} IOPS, traps/IO {}, irq/IO {} (guest {}), p99 {:.0} us{}",
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

/// "io_uring-qd32" -> (IoUring, 32).
fn parse_point(name: &str) -> Option<(Engine, u16)> {
    let (engine, qd) = name.rsplit_once("-qd")?;
    let engine = engine.parse::<Engine>().ok()?;
    Some((engine, qd.parse().ok()?))
}

/// Waits (up to 1.8 s) for the server to rewrite its stats file after
/// `since`, then reads it. `None` if it never did or does not parse.
fn fresh_stats(path: &Path, since: Instant) -> Option<Counters> {
    let wall = SystemTime::now();
    while since.elapsed() < Duration::from_millis(1800) {
        let fresh = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t > wall);
        if fresh {
            let v: Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
            return Counters::parse(&v);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// A point's guest interrupts per I/O: fio's I/Os with the ramp's second
/// counted at the measured rate, as the interrupt count spans it.
fn guest_interrupts_per_io(v: &Value) -> Option<f64> {
    let irqs = v.get("guest_irqs")?.as_f64()?;
    let iops = v.get("iops")?.as_f64()?;
    let secs = v.get("runtime_ms")?.as_f64()? / 1000.0 + 1.0;
    (iops > 0.0).then(|| irqs / (iops * secs))
}

/// The reference of a point: QEMU's nvme with dbcs=on, same engine and depth.
fn reference(runs: &[GuestRun], engine: Engine, qd: u16) -> Option<f64> {
    runs.iter()
        .find(|r| {
            r.device == "qemu-nvme" && r.dbcs == Some(true) && r.engine == engine && r.qd == qd
        })
        .map(|r| r.iops)
        .filter(|&i| i > 0.0)
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
            let device = match (&r.mode, r.dbcs) {
                (Some(m), _) => format!("vnvme {m}"),
                (None, Some(d)) => format!("qemu-nvme dbcs={}", if d { "on" } else { "off" }),
                (None, None) => r.device.to_string(),
            };
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
            engine: Engine::IoUring,
            qd: 4,
            iops,
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
    fn guest_interrupts_count_the_ramp_second_at_the_measured_rate() {
        let v = serde_json::json!({"guest_irqs": 3000, "iops": 1000, "runtime_ms": 5000});
        assert_eq!(guest_interrupts_per_io(&v), Some(0.5));
        let no_count = serde_json::json!({"iops": 1000, "runtime_ms": 5000});
        assert_eq!(guest_interrupts_per_io(&no_count), None);
    }

    #[test]
    fn point_names_parse_back() {
        assert_eq!(parse_point("io_uring-qd32"), Some((Engine::IoUring, 32)));
        assert_eq!(parse_point("libaio-qd1"), Some((Engine::Libaio, 1)));
        assert_eq!(parse_point("sync-qd1"), None);
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
            "boot\r\n[ 1.0] x VNVME-BENCH-BEGIN io_uring-qd1\r\nVNVME-BENCH-END io_uring-qd1\r\n",
        )
        .unwrap();
        assert_eq!(t.lines(&p), vec!["VNVME-BENCH-END io_uring-qd1"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
