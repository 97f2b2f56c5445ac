//! `vnvme bench --controllers 1,4,16,64`: many controllers at once, each
//! with its own driver client, served by one `vnvme serve` process (a
//! configuration with one `[[controllers]]` table each), by one process per
//! controller (`--processes`), by one process serving one NVM subsystem
//! whose controllers share a namespace (`--subsystem`), or by a server
//! someone else started (`--attach`, e.g. SPDK's `nvmf_tgt`, with
//! `--server-pid` for its CPU).
//!
//! Each point reports the aggregate IOPS, the slowest and the fastest
//! controller (fairness), and the server's CPU (from `/proc/PID/stat`, all
//! its threads) while busy and while every client is attached and idle.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use vnvme_controller::DoorbellMode;
use vnvme_driver::{Controller, DeviceAccess, InitOptions, IoQueue, VfioUserAccess};

use super::io::{self, Pattern, Summary};
use super::BenchOptions;

/// How long a started server has to create its socket.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// One measured point. The field names are read by other tools: keep them.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleRun {
    /// "one-process", "processes", "subsystem" or "attached".
    pub server: String,
    pub mode: String,
    pub controllers: usize,
    pub qd: u16,
    pub rw: super::Rw,
    /// Aggregate over every controller.
    pub iops: f64,
    pub min_controller_iops: f64,
    pub max_controller_iops: f64,
    /// Server CPU (user + system, every thread) over the run, in cores.
    pub server_cpu_cores: f64,
    /// The same with every client attached and idle (`--idle-seconds`).
    pub idle_server_cpu_cores: f64,
    pub errors: u64,
}

/// Where the controllers come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Serving {
    OneProcess,
    Processes,
    Subsystem,
    Attached,
}

impl Serving {
    fn name(self) -> &'static str {
        match self {
            Serving::OneProcess => "one-process",
            Serving::Processes => "processes",
            Serving::Subsystem => "subsystem",
            Serving::Attached => "attached",
        }
    }
}

/// The scale sweep: every (mode, controllers, qd).
pub fn run(opts: &BenchOptions, counts: &[usize]) -> Result<Vec<ScaleRun>> {
    let runtime = super::check_runtime(opts.runtime)?;
    super::check_qd(&opts.qd.0)?;
    let serving = match (&opts.attach, opts.processes, opts.subsystem) {
        (Some(_), true, _) | (Some(_), _, true) => {
            bail!("--attach uses servers already running: leave out --processes and --subsystem")
        }
        (Some(_), false, false) => Serving::Attached,
        (None, true, _) => Serving::Processes,
        (None, false, true) => Serving::Subsystem,
        (None, false, false) => Serving::OneProcess,
    };
    if opts.backend != super::BackendArg::Null || opts.nbd.is_some() || opts.verify {
        bail!("--controllers measures null namespaces: leave out --backend, --nbd and --verify");
    }
    if let Some(&bad) = counts.iter().find(|&&n| n == 0 || n > MAX_CONTROLLERS) {
        bail!("--controllers {bad} is out of range: 1 to {MAX_CONTROLLERS}");
    }
    let attach: Vec<PathBuf> = opts.attach.as_ref().map_or_else(Vec::new, |l| l.0.clone());
    let most = counts.iter().copied().max().unwrap_or(1);
    if serving == Serving::Attached {
        if attach.len() < most {
            bail!(
                "--controllers {most} needs {most} sockets, --attach gave {}",
                attach.len()
            );
        }
        if opts.modes.0.len() != 1 {
            bail!("with --attach the server's doorbell mode is its own: give the one it uses with --modes (e.g. --modes mmap-poll)");
        }
    }
    let idle = Duration::from_secs_f64(opts.idle_seconds);
    let points = opts.modes.0.len() * counts.len() * opts.qd.0.len();
    eprintln!(
        "bench: {points} points ({} modes x {} controller counts x {} queue depths), {:.1} s each, served by {} (about {:.0} s)",
        opts.modes.0.len(),
        counts.len(),
        opts.qd.0.len(),
        opts.runtime,
        serving.name(),
        points as f64 * opts.runtime + (opts.modes.0.len() * counts.len()) as f64 * opts.idle_seconds
    );
    let max_qd = opts.qd.0.iter().copied().max().unwrap_or(1);
    let mut runs = Vec::new();
    for &mode in &opts.modes.0 {
        for &n in counts {
            let dir = ScratchDir::new()?;
            let servers = match serving {
                Serving::Attached => Servers::attached(&attach[..n], opts.server_pid)?,
                Serving::OneProcess => Servers::one_process(&dir.0, n, mode, opts)?,
                Serving::Processes => Servers::processes(&dir.0, n, mode, opts)?,
                Serving::Subsystem => Servers::subsystem(&dir.0, n, mode, opts)?,
            };
            let mut clients = servers
                .sockets
                .iter()
                .map(|s| Client::attach(s, mode, max_qd, opts.poll))
                .collect::<Result<Vec<_>>>()?;
            let idle_cpu = servers.cpu_over(idle, || {
                std::thread::sleep(idle);
                Ok(())
            })?;
            for &qd in &opts.qd.0 {
                let pattern = opts.pattern(qd, runtime);
                let mut per = Vec::new();
                let cpu = servers.cpu_over(runtime, || {
                    per = run_all(&mut clients, &pattern)?;
                    Ok(())
                })?;
                let run = point(serving, mode, n, &pattern, &per, cpu, idle_cpu);
                eprintln!(
                    "bench: [{:>2}/{points}] {:<9} {:>3} controllers qd {:>3}: {:>9.0} IOPS (per controller {:.0} to {:.0}), server {:.3} cores busy, {:.4} idle",
                    runs.len() + 1,
                    run.mode,
                    n,
                    qd,
                    run.iops,
                    run.min_controller_iops,
                    run.max_controller_iops,
                    run.server_cpu_cores,
                    run.idle_server_cpu_cores
                );
                runs.push(run);
            }
            // The clients detach before their servers stop.
            drop(clients);
            servers.stop()?;
        }
    }
    Ok(runs)
}

/// At most this many controllers per point (file descriptors: each client
/// holds a socket, eventfds and DMA memfds).
const MAX_CONTROLLERS: usize = 256;

fn point(
    serving: Serving,
    mode: DoorbellMode,
    n: usize,
    pattern: &Pattern,
    per: &[Summary],
    cpu: f64,
    idle_cpu: f64,
) -> ScaleRun {
    let iops: Vec<f64> = per
        .iter()
        .map(|s| s.ios as f64 / s.elapsed.as_secs_f64().max(1e-9))
        .collect();
    ScaleRun {
        server: serving.name().to_string(),
        mode: mode.to_string(),
        controllers: n,
        qd: pattern.qd,
        rw: pattern.rw,
        iops: iops.iter().sum(),
        min_controller_iops: iops.iter().copied().fold(f64::INFINITY, f64::min),
        max_controller_iops: iops.iter().copied().fold(0.0, f64::max),
        server_cpu_cores: cpu,
        idle_server_cpu_cores: idle_cpu,
        errors: per.iter().map(|s| s.errors).sum(),
    }
}

/// Runs `pattern` on every client at once, one thread each.
fn run_all(clients: &mut [Client], pattern: &Pattern) -> Result<Vec<Summary>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = clients
            .iter_mut()
            .enumerate()
            .map(|(i, c)| {
                s.spawn(move || {
                    io::run_one(&mut c.queue, None, &c.access, pattern, io::thread_seed(i))
                })
            })
            .collect();
        io::join_all(handles)
    })
}

/// One driver attached to one controller, with its I/O queue. Fields drop
/// in order: the queue and the driver before the connection.
pub(super) struct Client {
    pub(super) queue: IoQueue,
    _driver: Controller,
    pub(super) access: Arc<dyn DeviceAccess>,
}

impl Client {
    fn attach(socket: &Path, mode: DoorbellMode, max_qd: u16, poll: bool) -> Result<Self> {
        // As QEMU: the doorbell page mapped wherever the mode offers it, so
        // both columns are those of the client a guest has.
        Self::connect(socket, max_qd, poll, mode.offers_page())
    }

    /// Our driver on `socket` with one I/O queue for `max_qd` commands,
    /// reaping by polling or interrupts, mapping BAR0's doorbell page or not.
    pub(super) fn connect(
        socket: &Path,
        max_qd: u16,
        poll: bool,
        map_doorbells: bool,
    ) -> Result<Self> {
        let access: Arc<dyn DeviceAccess> = Arc::new(
            VfioUserAccess::connect(socket)
                .with_context(|| format!("connecting to {}", socket.display()))?,
        );
        let init = InitOptions {
            io_queues: 1,
            queue_depth: max_qd.saturating_add(1).max(2),
            interrupts: !poll,
            map_doorbells,
            ..InitOptions::default()
        };
        let driver = Controller::init(Arc::clone(&access), init)
            .with_context(|| format!("initialising the controller at {}", socket.display()))?;
        if driver.namespaces().is_empty() {
            bail!(
                "the controller at {} reported no usable namespace",
                socket.display()
            );
        }
        let queue = driver.take_io_queue(0)?;
        Ok(Self {
            queue,
            _driver: driver,
            access,
        })
    }
}

/// The server side of one point: processes started here (stopped by
/// [`Servers::stop`] or on drop) or a process given by `--server-pid`.
struct Servers {
    sockets: Vec<PathBuf>,
    children: Vec<Child>,
    /// Whose CPU is counted.
    pids: Vec<u32>,
}

impl Servers {
    fn attached(sockets: &[PathBuf], pid: Option<u32>) -> Result<Self> {
        Ok(Self {
            sockets: sockets.to_vec(),
            children: Vec::new(),
            pids: pid.into_iter().collect(),
        })
    }

    /// One `vnvme serve --config` with `n` controllers.
    fn one_process(dir: &Path, n: usize, mode: DoorbellMode, opts: &BenchOptions) -> Result<Self> {
        let sockets: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("c{i}.sock"))).collect();
        let config = dir.join("controllers.toml");
        std::fs::write(&config, config_text(&sockets, mode, opts))
            .with_context(|| format!("writing {}", config.display()))?;
        let mut args = vec!["--config".to_string(), config.display().to_string()];
        if let Some(w) = opts.server_workers {
            args.extend(["--workers".to_string(), w.to_string()]);
        }
        Self::one(dir, args, opts, sockets)
    }

    /// One `vnvme serve --socket ... --socket ...`: one NVM subsystem, a
    /// controller per socket, one shared namespace.
    fn subsystem(dir: &Path, n: usize, mode: DoorbellMode, opts: &BenchOptions) -> Result<Self> {
        let sockets: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("c{i}.sock"))).collect();
        let mut args = Vec::new();
        for socket in &sockets {
            args.extend(["--socket".to_string(), socket.display().to_string()]);
        }
        args.extend(one_controller_args(mode, opts));
        Self::one(dir, args, opts, sockets)
    }

    /// One `vnvme serve ARGS` (with the polling options) serving `sockets`.
    fn one(
        dir: &Path,
        mut args: Vec<String>,
        opts: &BenchOptions,
        sockets: Vec<PathBuf>,
    ) -> Result<Self> {
        args.extend(opts.polling.serve_args());
        let child = start(&args, &dir.join("serve.log"))?;
        let mut servers = Self {
            pids: vec![child.id()],
            children: vec![child],
            sockets,
        };
        servers.wait_for_sockets()?;
        Ok(servers)
    }

    /// `n` `vnvme serve` processes.
    fn processes(dir: &Path, n: usize, mode: DoorbellMode, opts: &BenchOptions) -> Result<Self> {
        let mut servers = Self {
            sockets: Vec::new(),
            children: Vec::new(),
            pids: Vec::new(),
        };
        for i in 0..n {
            let socket = dir.join(format!("c{i}.sock"));
            let mut args = vec!["--socket".to_string(), socket.display().to_string()];
            args.extend(one_controller_args(mode, opts));
            args.extend(opts.polling.serve_args());
            let child = start(&args, &dir.join(format!("serve-{i}.log")))?;
            servers.pids.push(child.id());
            servers.children.push(child);
            servers.sockets.push(socket);
        }
        servers.wait_for_sockets()?;
        Ok(servers)
    }

    fn wait_for_sockets(&mut self) -> Result<()> {
        wait_for_sockets(&self.sockets, &mut self.children)
    }

    /// The servers' CPU in cores while `work` runs (about `expected` long).
    fn cpu_over(&self, expected: Duration, work: impl FnOnce() -> Result<()>) -> Result<f64> {
        let before = self.cpu_seconds();
        let t0 = Instant::now();
        work()?;
        let elapsed = t0.elapsed().max(expected / 2).as_secs_f64();
        let after = self.cpu_seconds();
        Ok((after - before).max(0.0) / elapsed)
    }

    fn cpu_seconds(&self) -> f64 {
        self.pids.iter().filter_map(|&p| cpu_seconds(p)).sum()
    }

    /// SIGTERM to every server started here, then wait for it.
    fn stop(mut self) -> Result<()> {
        for child in &self.children {
            terminate(child.id());
        }
        for child in &mut self.children {
            let status = child.wait()?;
            if !status.success() {
                bail!("a vnvme serve the bench started exited with {status}");
            }
        }
        self.children.clear();
        Ok(())
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        for child in &mut self.children {
            terminate(child.id());
            let _ = child.wait();
        }
    }
}

/// Waits until every one of `sockets` exists, or one of `children` exited.
pub(super) fn wait_for_sockets(sockets: &[PathBuf], children: &mut [Child]) -> Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    for socket in sockets {
        while !socket.exists() {
            for child in &mut *children {
                if let Some(status) = child.try_wait()? {
                    bail!("a vnvme serve the bench started exited ({status}) before creating its socket: see its log beside {}", socket.display());
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not appear within {START_TIMEOUT:?}",
                    socket.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

pub(super) fn terminate(pid: u32) {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw);
    if let Some(pid) = pid {
        // Gone already is fine: the wait that follows says how it ended.
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
}

/// A served controller's namespace and settings on the command line: a
/// `null` namespace of `--size`, the doorbell mode, one I/O queue.
fn one_controller_args(mode: DoorbellMode, opts: &BenchOptions) -> [String; 6] {
    [
        "--ns".to_string(),
        format!("{}:null", opts.size),
        "--doorbells".to_string(),
        mode.to_string(),
        "--max-io-queues".to_string(),
        "1".to_string(),
    ]
}

/// Starts `vnvme serve ARGS`, its output in `log`.
pub(super) fn start(args: &[String], log: &Path) -> Result<Child> {
    let exe = std::env::current_exe().context("finding the vnvme executable")?;
    let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    Command::new(exe)
        .arg("serve")
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .context("starting vnvme serve")
}

/// The configuration of one server process with a controller per socket.
fn config_text(sockets: &[PathBuf], mode: DoorbellMode, opts: &BenchOptions) -> String {
    let mut s = String::from("# written by vnvme bench --controllers\n");
    for socket in sockets {
        s += &format!(
            "\n[[controllers]]\nsocket = {:?}\ndoorbells = \"{mode}\"\nmax_io_queues = 1\n\n[[controllers.namespaces]]\nsize = \"{}\"\nbackend = \"null\"\n",
            socket.display().to_string(),
            opts.size
        );
    }
    s
}

/// User plus system CPU seconds of process `pid` (every thread), from
/// `/proc/PID/stat`; `None` once it is gone.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields count from
    // the last ')'. utime and stime are fields 14 and 15 (1-based).
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let ticks = rustix::param::clock_ticks_per_second() as f64;
    Some((utime + stime) as f64 / ticks)
}

/// A folder for one point's sockets, configuration and logs, removed after.
pub(super) struct ScratchDir(pub(super) PathBuf);

impl ScratchDir {
    pub(super) fn new() -> Result<Self> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "vnvme-bench-scale-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The table printed after the sweep.
pub fn table(runs: &[ScaleRun]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n{:<12} {:<10} {:>5} {:>4} {:>10} {:>9} {:>9} {:>6} {:>7} {:>8}",
        "server",
        "mode",
        "ctrls",
        "qd",
        "IOPS",
        "min/ctrl",
        "max/ctrl",
        "min/max",
        "cpu",
        "idle cpu"
    );
    for r in runs {
        let _ = writeln!(
            s,
            "{:<12} {:<10} {:>5} {:>4} {:>10.0} {:>9.0} {:>9.0} {:>6.2} {:>7.3} {:>8.4}",
            r.server,
            r.mode,
            r.controllers,
            r.qd,
            r.iops,
            r.min_controller_iops,
            r.max_controller_iops,
            r.min_controller_iops / r.max_controller_iops.max(1e-9),
            r.server_cpu_cores,
            r.idle_server_cpu_cores
        );
    }
    s
}
