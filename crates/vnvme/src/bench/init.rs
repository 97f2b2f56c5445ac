//! `vnvme bench init`: what driver initialisation costs, fast against the
//! old learning dance (the nvmewin fast-init seed: 224 -> 64 admin commands
//! for 32 queues). For each number of I/O queues and init mode, a fresh
//! controller (with a mix of namespaces: ready, ready late, detached, with
//! metadata) and the driver in one process over a vfio-user socketpair:
//! admin commands by opcode, and the time until every namespace is usable.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use vnvme_device::MAX_MSIX_VECTORS;
use vnvme_driver::{Controller, DeviceAccess, InitMode, InitOptions, NsState};

use super::List;
use crate::device::{DeviceOptions, MAX_IO_QUEUES};
use crate::identity::Origin;
use crate::inproc::InProcess;
use crate::namespace::NamespaceSpec;
use crate::ns_syntax;

/// The default namespace mix: ready, ready after 300 ms, detached, and a
/// format with 8 bytes of metadata per block (which the driver skips).
pub const DEFAULT_NAMESPACES: &[&str] = &[
    "64M:null",
    "64M:null,ready=300ms",
    "64M:null,detached",
    "64M:null,format=4",
];

/// `fast` or `learning` on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode(pub InitMode);

impl FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fast" => Ok(Self(InitMode::Fast)),
            "learning" => Ok(Self(InitMode::Learning)),
            other => Err(format!("unknown init mode '{other}': use fast or learning")),
        }
    }
}

fn mode_name(mode: InitMode) -> &'static str {
    match mode {
        InitMode::Fast => "fast",
        InitMode::Learning => "learning",
    }
}

#[derive(Args, Debug, Clone)]
pub struct InitBenchOptions {
    /// I/O queue pairs to ask for, comma separated (1 to 255).
    #[arg(long, default_value = "8,32,120")]
    pub io_queues: List<u16>,
    /// Init modes, comma separated: fast (queues created once), learning
    /// (create, one read per queue, delete, create again).
    #[arg(long, default_value = "fast,learning")]
    pub init_mode: List<Mode>,
    // Help from crate::ns_syntax, as `vnvme serve --ns`'s.
    #[arg(
        long = "ns",
        value_name = "STORAGE[,OPTION]...",
        help = ns_syntax::short_help(&DEFAULT_NAMESPACES.join(", ")),
        long_help = ns_syntax::long_help(&DEFAULT_NAMESPACES.join(", "))
    )]
    pub namespaces: Vec<NamespaceSpec>,
    /// MSI-X vectors of the controller (default: one per queue plus one);
    /// fewer than queues means vectors are shared.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=i64::from(MAX_MSIX_VECTORS)))]
    pub msix_vectors: Option<u16>,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// One namespace as the run ended. Field names are read by other tools.
#[derive(Debug, Clone, Serialize)]
pub struct NsResult {
    pub nsid: u32,
    /// "ready", "not-ready" or "skipped".
    pub state: String,
    pub reason: Option<String>,
}

/// One measured initialisation. Field names are read by other tools.
#[derive(Debug, Clone, Serialize)]
pub struct InitRun {
    pub init_mode: String,
    pub io_queues: u16,
    /// I/O queues the controller granted.
    pub io_queues_granted: u16,
    pub msix_vectors: u16,
    pub admin_commands: u64,
    /// I/O commands sent at initialisation (learning reads).
    pub io_commands: u64,
    pub by_opcode: BTreeMap<String, u64>,
    /// From the start of initialisation until every namespace is ready or
    /// skipped (namespaces ready late are waited for through the
    /// asynchronous event).
    pub ready_ms: f64,
    /// `Controller::init` alone.
    pub init_ms: f64,
    pub namespaces: Vec<NsResult>,
}

/// Runs every (mode, queues) pair.
pub fn run(opts: &InitBenchOptions) -> Result<Vec<InitRun>> {
    if let Some(bad) = opts
        .io_queues
        .0
        .iter()
        .find(|&&q| q == 0 || q > MAX_IO_QUEUES)
    {
        bail!("--io-queues {bad} is out of range: 1 to {MAX_IO_QUEUES}");
    }
    let specs: Vec<NamespaceSpec> = if opts.namespaces.is_empty() {
        DEFAULT_NAMESPACES
            .iter()
            .map(|s| s.parse().map_err(anyhow::Error::msg))
            .collect::<Result<_>>()?
    } else {
        opts.namespaces.clone()
    };
    let mut runs = Vec::new();
    for &io_queues in &opts.io_queues.0 {
        for &Mode(mode) in &opts.init_mode.0 {
            let run = measure(io_queues, mode, &specs, opts.msix_vectors)
                .with_context(|| format!("{} init with {io_queues} queues", mode_name(mode)))?;
            eprintln!(
                "bench init: {:<8} {:>3} queues: {} admin + {} I/O commands, usable after {:.1} ms",
                run.init_mode, run.io_queues, run.admin_commands, run.io_commands, run.ready_ms
            );
            runs.push(run);
        }
    }
    Ok(runs)
}

fn measure(
    io_queues: u16,
    mode: InitMode,
    specs: &[NamespaceSpec],
    msix_vectors: Option<u16>,
) -> Result<InitRun> {
    let device_opts = DeviceOptions {
        max_io_queues: io_queues,
        msix_vectors,
        ..DeviceOptions::default()
    };
    let device = device_opts.build(specs, &Origin::embedded())?;
    let mut inproc = InProcess::start(device)?;
    let access: Arc<dyn DeviceAccess> = Arc::new(inproc.access()?);
    let init = InitOptions {
        io_queues,
        init_mode: mode,
        // Small rings: 120 queues of 255 slots with PRP list pages would
        // allocate far more than initialisation is about.
        queue_depth: 32,
        ..InitOptions::default()
    };
    let started = Instant::now();
    let driver = Controller::init(Arc::clone(&access), init).context("driver initialisation")?;
    let init_ms = started.elapsed().as_secs_f64() * 1e3;
    // Namespaces not ready when init gave up waiting come back through the
    // asynchronous event; give them as long again.
    let deadline = started + driver.ready_timeout() * 2;
    while pending(&driver) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        driver.wait_events(left.min(Duration::from_millis(100)))?;
    }
    let ready_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut namespaces: Vec<NsResult> = driver
        .namespace_report()
        .into_iter()
        .map(|n| NsResult {
            nsid: n.nsid,
            state: n.state.to_string(),
            reason: n.reason,
        })
        .collect();
    // NSIDs are given in order from 1. A detached namespace is not in the
    // active list: the driver sends nothing for it, and it is listed here.
    for nsid in (1u32..).take(specs.len()) {
        if !namespaces.iter().any(|n| n.nsid == nsid) {
            namespaces.push(NsResult {
                nsid,
                state: NsState::Skipped.to_string(),
                reason: Some("not in the active namespace list (detached): no command sent".into()),
            });
        }
    }
    namespaces.sort_by_key(|n| n.nsid);
    // A clean shutdown before the memory goes, so the controller's workers
    // stop looking at the queues.
    if let Err(e) = driver.shutdown() {
        tracing::debug!(error = %e, "shutdown after the measurement failed");
    }
    Ok(InitRun {
        init_mode: mode_name(mode).into(),
        io_queues,
        io_queues_granted: driver.io_queue_count(),
        msix_vectors: driver.interrupt_vectors(),
        admin_commands: driver.init_admin_commands(),
        io_commands: driver.init_io_commands(),
        by_opcode: driver.init_admin_by_opcode(),
        ready_ms,
        init_ms,
        namespaces,
    })
}

fn pending(driver: &Controller) -> bool {
    driver
        .namespace_report()
        .iter()
        .any(|n| n.state == NsState::NotReady)
}

/// The table printed on stdout.
pub fn table(runs: &[InitRun]) -> String {
    let mut out = String::new();
    out.push_str(
        "mode      queues  admin   io  total  init ms  ready ms  create-cq  create-sq  delete-sq  delete-cq  identify  other\n",
    );
    for r in runs {
        let get = |k: &str| r.by_opcode.get(k).copied().unwrap_or(0);
        let named = [
            "create-io-cq",
            "create-io-sq",
            "delete-io-sq",
            "delete-io-cq",
            "identify",
        ];
        let other: Vec<String> = r
            .by_opcode
            .iter()
            .filter(|(k, _)| !named.contains(&k.as_str()))
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        out.push_str(&format!(
            "{:<8}  {:>6}  {:>5}  {:>3}  {:>5}  {:>7.1}  {:>8.1}  {:>9}  {:>9}  {:>9}  {:>9}  {:>8}  {}\n",
            r.init_mode,
            r.io_queues,
            r.admin_commands,
            r.io_commands,
            r.admin_commands + r.io_commands,
            r.init_ms,
            r.ready_ms,
            get("create-io-cq"),
            get("create-io-sq"),
            get("delete-io-sq"),
            get("delete-io-cq"),
            get("identify"),
            other.join(", "),
        ));
    }
    if let Some(r) = runs.first() {
        out.push_str("\nnamespaces:\n");
        for n in &r.namespaces {
            out.push_str(&format!(
                "  {:>3}  {:<9}  {}\n",
                n.nsid,
                n.state,
                n.reason.as_deref().unwrap_or("")
            ));
        }
    }
    out
}

/// Runs the benchmark, prints the table, writes the JSON if asked.
pub fn main(opts: &InitBenchOptions) -> Result<()> {
    let runs = run(opts)?;
    print!("{}", table(&runs));
    if let Some(path) = &opts.json {
        let doc = serde_json::json!({ "runs": runs });
        super::write_json(path, &doc, "bench init")?;
    }
    Ok(())
}
