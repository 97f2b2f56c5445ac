//! `vnvme bench upgrade`: how long a busy client's I/O stalls while `vnvme
//! serve` hands it over to a new process (`vnvme ctl upgrade`; issue 35
//! item 5). The bench starts one `vnvme serve` per doorbell mode, attaches
//! our driver to it (mapping the doorbell page where the mode offers it, as
//! QEMU does), and keeps `--qd` commands in flight on one queue: first a
//! round without an upgrade (the baseline), then `--upgrades` rounds of
//! `--interval` seconds, each asking for an upgrade halfway through.
//!
//! Per round it reports the handover's time by phase (what the old server
//! answers `ctl upgrade` with) and the longest I/O latency the client saw:
//! the stall, since a command submitted just before the drain completes
//! only once the new process serves. With `--verify` (a `file` namespace)
//! every read is checked against the last completed write of its block, so
//! a command lost or run twice across a handover shows as an error.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use serde_json::{json, Value};
use vnvme_controller::DoorbellMode;

use super::io::{self, Pattern, Submit, Summary};
use super::scale::{self, Client, ScratchDir};
use super::{BackendArg, List, Rw, BLOCK_SIZE};
use crate::control::client as ctl;
use crate::size::parse_size;

#[derive(Args, Debug, Clone)]
pub struct UpgradeBenchOptions {
    /// Doorbell modes to measure, comma separated (trap, shadow, adaptive, mmap-poll).
    #[arg(long, default_value = "adaptive")]
    pub modes: List<DoorbellMode>,
    /// Upgrades per mode.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub upgrades: u16,
    /// Seconds of I/O per round; the upgrade is asked halfway through (fractions allowed).
    #[arg(long, default_value = "1")]
    pub interval: f64,
    /// Commands kept in flight (1 to 1023).
    #[arg(long, default_value_t = 32)]
    pub qd: u16,
    /// Access pattern (4 KiB blocks).
    #[arg(long, value_enum, default_value = "randrw")]
    pub rw: Rw,
    /// Namespace backend: null, ram (its memfd handed over), or file (a temporary file,
    /// removed after).
    #[arg(long, value_enum, default_value = "null")]
    pub backend: BackendArg,
    /// Namespace size.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub size: u64,
    /// Check every read against the last completed write of its block (needs --backend file or
    /// ram).
    #[arg(long)]
    pub verify: bool,
    /// Write the rounds as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// One round: the baseline (`upgrade` 0) or one upgrade.
#[derive(Debug, Clone, Serialize)]
pub struct Round {
    pub mode: String,
    /// 0 for the round without an upgrade, then 1, 2, ...
    pub upgrade: u16,
    /// From the request to the new process ready, as the old one measured it.
    pub handover_ms: Option<f64>,
    /// drain, save, pass, restore.
    pub phases_ms: Option<Value>,
    /// The longest time a command took, submission to reaping: the stall.
    pub max_latency_ms: f64,
    pub p99_latency_ms: f64,
    pub iops: f64,
    pub ios: u64,
    pub errors: u64,
    pub verify_errors: u64,
}

pub fn main(opts: &UpgradeBenchOptions) -> Result<()> {
    let rounds = run(opts)?;
    print!("{}", table(&rounds));
    if let Some(path) = &opts.json {
        let doc = json!({ "bench": "upgrade", "qd": opts.qd, "rw": opts.rw, "rounds": rounds });
        super::write_json(path, &doc, "bench upgrade")?;
    }
    let errors: u64 = rounds.iter().map(|r| r.errors).sum();
    let verify_errors: u64 = rounds.iter().map(|r| r.verify_errors).sum();
    if errors + verify_errors > 0 {
        bail!(
            "{errors} commands failed and {verify_errors} reads did not verify across the upgrades"
        );
    }
    Ok(())
}

pub fn run(opts: &UpgradeBenchOptions) -> Result<Vec<Round>> {
    let interval = super::check_runtime(opts.interval)?;
    super::check_qd(&[opts.qd])?;
    if matches!(opts.backend, BackendArg::Null) && opts.verify {
        bail!(
            "--verify needs --backend file or ram: a null namespace drops writes and reads zeroes"
        );
    }
    eprintln!(
        "bench upgrade: {} modes x ({} upgrades + 1 baseline) rounds of {:.1} s, QD {}, {:?} on a {} namespace{} (about {:.0} s)",
        opts.modes.0.len(),
        opts.upgrades,
        opts.interval,
        opts.qd,
        opts.rw,
        opts.backend.name(),
        if opts.verify { ", verifying" } else { "" },
        opts.modes.0.len() as f64 * (f64::from(opts.upgrades) + 1.0) * (opts.interval + 0.1)
    );
    let mut rounds = Vec::new();
    for &mode in &opts.modes.0 {
        rounds.extend(one_mode(mode, opts, interval)?);
    }
    Ok(rounds)
}

/// Every round of one doorbell mode, on a server started for it.
fn one_mode(
    mode: DoorbellMode,
    opts: &UpgradeBenchOptions,
    interval: Duration,
) -> Result<Vec<Round>> {
    let dir = ScratchDir::new()?;
    let socket = dir.0.join("c.sock");
    let control = dir.0.join("control.sock");
    let backend = match opts.backend {
        BackendArg::File => format!("file={}", dir.0.join("ns.img").display()),
        BackendArg::Ram => "ram".to_string(),
        BackendArg::Null => "null".to_string(),
    };
    let args = [
        "--socket".to_string(),
        socket.display().to_string(),
        "--control".to_string(),
        control.display().to_string(),
        "--ns".to_string(),
        format!("{}:{backend}", opts.size),
        "--doorbells".to_string(),
        mode.to_string(),
        "--max-io-queues".to_string(),
        "1".to_string(),
    ];
    let mut server = Server {
        first: Some(scale::start(&args, &dir.0.join("serve.log"))?),
        pid: 0,
    };
    server.pid = server.first.as_ref().map_or(0, Child::id);
    let first = server
        .first
        .as_mut()
        .map_or(&mut [][..], std::slice::from_mut);
    scale::wait_for_sockets(&[socket.clone(), control.clone()], first)?;
    // As QEMU: the doorbell page mapped wherever the mode offers it.
    let map_page = mode.offers_page();
    let mut client = Client::connect(&socket, opts.qd, false, map_page)?;
    let mut stripes = if opts.verify {
        Some(super::ModeBench::stripes(
            std::slice::from_ref(&client.queue),
            BLOCK_SIZE,
        )?)
    } else {
        None
    };
    let pattern = Pattern {
        rw: opts.rw,
        qd: opts.qd,
        runtime: interval,
        block_size: BLOCK_SIZE,
        submit: Submit::PerIo,
    };
    let mut rounds = Vec::new();
    for upgrade in 0..=opts.upgrades {
        let mut reply = None;
        let mut ask = || {
            if upgrade > 0 && reply.is_none() {
                reply = Some(ctl::call(&control, "upgrade", json!({})));
            }
        };
        let summary = Summary::merge(io::run_threads_with(
            std::slice::from_mut(&mut client.queue),
            stripes.as_deref_mut(),
            &client.access,
            &pattern,
            interval / 2,
            &mut ask,
        )?);
        let report = match reply {
            None if upgrade > 0 => {
                bail!("{mode}: upgrade {upgrade} was never asked (the round ended first)")
            }
            None => None,
            Some(r) => Some(
                r.with_context(|| format!("{mode}: asking for upgrade {upgrade}"))?
                    .map_err(|e| {
                        anyhow::anyhow!("{mode}: upgrade {upgrade} refused: {}", e.message)
                    })?,
            ),
        };
        if let Some(pid) = report.as_ref().and_then(|r| r["pid"].as_u64()) {
            server.pid = u32::try_from(pid).context("the new server's pid")?;
        }
        let round = Round::new(mode, upgrade, report.as_ref(), &summary);
        eprintln!(
            "bench upgrade: {mode} {upgrade:>3}: handover {}, longest I/O {:.1} ms, {:.0} IOPS",
            round
                .handover_ms
                .map_or("-".to_string(), |t| format!("{t:.1} ms")),
            round.max_latency_ms,
            round.iops
        );
        rounds.push(round);
    }
    drop(client);
    server.stop()?;
    Ok(rounds)
}

impl Round {
    fn new(mode: DoorbellMode, upgrade: u16, report: Option<&Value>, s: &Summary) -> Self {
        Self {
            mode: mode.to_string(),
            upgrade,
            handover_ms: report.and_then(|r| r["total_ms"].as_f64()),
            phases_ms: report.map(|r| r["phases_ms"].clone()),
            max_latency_ms: s.percentile_us(100.0) / 1000.0,
            p99_latency_ms: s.percentile_us(99.0) / 1000.0,
            iops: s.ios as f64 / s.elapsed.as_secs_f64().max(1e-9),
            ios: s.ios,
            errors: s.errors,
            verify_errors: s.verify_errors,
        }
    }
}

/// The server of one mode: the process the bench started, then whichever
/// successor the last upgrade reported (not our child: its parent exited).
struct Server {
    first: Option<Child>,
    pid: u32,
}

impl Server {
    /// SIGTERM to the serving process, and wait until it is gone.
    fn stop(&mut self) -> Result<()> {
        scale::terminate(self.pid);
        if let Some(mut first) = self.first.take() {
            let status = first.wait()?;
            if !status.success() {
                bail!("the vnvme serve the bench started exited with {status}");
            }
        }
        // A successor is reaped by whoever adopted it: wait for its /proc entry.
        let proc = PathBuf::from(format!("/proc/{}", self.pid));
        for _ in 0..250 {
            if !is_running(&proc) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!(
            "vnvme serve (pid {}) did not stop within 5 s of SIGTERM",
            self.pid
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        scale::terminate(self.pid);
        if let Some(mut first) = self.first.take() {
            let _ = first.wait();
        }
    }
}

/// Whether the process at `/proc/PID` still runs (a zombie does not).
fn is_running(proc: &Path) -> bool {
    std::fs::read_to_string(proc.join("stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

/// One line per round, then per mode the spread of the upgrade rounds.
pub fn table(rounds: &[Round]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n{:<10} {:>7} {:>9} {:>7} {:>7} {:>7} {:>8} {:>10} {:>9} {:>10}",
        "mode",
        "upgrade",
        "handover",
        "drain",
        "save",
        "pass",
        "restore",
        "longest IO",
        "p99 IO",
        "IOPS"
    );
    let phase = |r: &Round, p: &str| {
        r.phases_ms
            .as_ref()
            .and_then(|v| v[p].as_f64())
            .map_or("-".to_string(), |t| format!("{t:.1}"))
    };
    for r in rounds {
        let _ = writeln!(
            s,
            "{:<10} {:>7} {:>9} {:>7} {:>7} {:>7} {:>8} {:>10.1} {:>9.2} {:>10.0}",
            r.mode,
            if r.upgrade == 0 {
                "none".to_string()
            } else {
                r.upgrade.to_string()
            },
            r.handover_ms.map_or("-".to_string(), |t| format!("{t:.1}")),
            phase(r, "drain"),
            phase(r, "save"),
            phase(r, "pass"),
            phase(r, "restore"),
            r.max_latency_ms,
            r.p99_latency_ms,
            r.iops
        );
    }
    let _ = writeln!(
        s,
        "(times in ms; the longest I/O of an upgrade round is the stall the client saw)"
    );
    let mut modes: Vec<&str> = rounds.iter().map(|r| r.mode.as_str()).collect();
    modes.dedup();
    for mode in modes {
        let of = |f: fn(&Round) -> Option<f64>| -> Vec<f64> {
            let mut v: Vec<f64> = rounds
                .iter()
                .filter(|r| r.mode == mode && r.upgrade > 0)
                .filter_map(f)
                .collect();
            v.sort_by(f64::total_cmp);
            v
        };
        let stalls = of(|r| Some(r.max_latency_ms));
        let handovers = of(|r| r.handover_ms);
        let base = rounds
            .iter()
            .find(|r| r.mode == mode && r.upgrade == 0)
            .map_or(0.0, |r| r.max_latency_ms);
        let _ = writeln!(
            s,
            "{mode}: stall {} ms (without an upgrade {base:.1} ms); handover {} ms (min / median / max)",
            spread(&stalls),
            spread(&handovers)
        );
    }
    s
}

/// "min / median / max" of sorted values.
fn spread(sorted: &[f64]) -> String {
    match sorted {
        [] => "-".to_string(),
        _ => format!(
            "{:.1} / {:.1} / {:.1}",
            sorted[0],
            sorted[sorted.len() / 2],
            sorted[sorted.len() - 1]
        ),
    }
}
