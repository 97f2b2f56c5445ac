//! The benchmark's table (in the seed documents' form) and machine facts.

use std::fmt::Write;

use serde_json::{json, Value};

use super::Run;

pub(super) fn kilo(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}K", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// IOPS of the `trap` run at the same depth, for the gain column.
fn trap_iops(runs: &[Run], qd: u16) -> Option<f64> {
    runs.iter()
        .find(|r| r.mode == "trap" && r.qd == qd)
        .map(|r| r.iops)
}

/// Modes and depths in the order they were measured.
fn axes(runs: &[Run]) -> (Vec<String>, Vec<u16>) {
    let mut modes: Vec<String> = Vec::new();
    let mut qds: Vec<u16> = Vec::new();
    for r in runs {
        if !modes.contains(&r.mode) {
            modes.push(r.mode.clone());
        }
        if !qds.contains(&r.qd) {
            qds.push(r.qd);
        }
    }
    (modes, qds)
}

/// The per-run table, then IOPS and traps per I/O as mode × depth matrices.
pub fn table(runs: &[Run]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n{:<10} {:>4} {:>9} {:>9} {:>7} {:>7} {:>7} {:>8} {:>8} {:>7} {:>7} {:>7}",
        "mode",
        "qd",
        "IOPS",
        "traps/IO",
        "SQ",
        "CQ",
        "irq/IO",
        "p50 us",
        "p99 us",
        "gain",
        "errors",
        "verify"
    );
    for r in runs {
        let gain = trap_iops(runs, r.qd)
            .filter(|t| *t > 0.0)
            .map_or("-".to_string(), |t| format!("{:.2}x", r.iops / t));
        let _ = writeln!(
            s,
            "{:<10} {:>4} {:>9} {:>9.3} {:>7.3} {:>7.3} {:>7.3} {:>8.1} {:>8.1} {:>7} {:>7} {:>7}",
            r.mode,
            r.qd,
            kilo(r.iops),
            r.traps_per_io,
            r.sq_traps_per_io,
            r.cq_traps_per_io,
            r.interrupts_per_io,
            r.lat_p50_us,
            r.lat_p99_us,
            gain,
            r.errors,
            // Verify errors, or "-" for a run that did not check its reads.
            if r.verify {
                r.verify_errors.to_string()
            } else {
                "-".to_string()
            }
        );
    }
    let (modes, qds) = axes(runs);
    for (title, cell) in [
        ("IOPS", &(|r: &Run| kilo(r.iops)) as &dyn Fn(&Run) -> String),
        ("doorbell traps per I/O", &|r: &Run| {
            format!("{:.2}", r.traps_per_io)
        }),
    ] {
        let _ = write!(s, "\n{title}\n{:<10}", "iodepth");
        for q in &qds {
            let _ = write!(s, " {q:>8}");
        }
        s.push('\n');
        for m in &modes {
            let _ = write!(s, "{m:<10}");
            for q in &qds {
                let v = runs
                    .iter()
                    .find(|r| &r.mode == m && r.qd == *q)
                    .map_or("-".to_string(), cell);
                let _ = write!(s, " {v:>8}");
            }
            s.push('\n');
        }
    }
    s
}

/// What the numbers were measured on.
pub fn machine() -> Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu_model = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_default();
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "cpu_model": cpu_model,
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
        "vnvme_version": env!("CARGO_PKG_VERSION"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Rw;

    fn run(mode: &str, qd: u16, iops: f64) -> Run {
        Run {
            mode: mode.into(),
            qd,
            rw: Rw::Randread,
            queues: 1,
            submit: crate::bench::Submit::PerIo,
            iops,
            traps_per_io: 2.0,
            sq_traps_per_io: 1.0,
            cq_traps_per_io: 1.0,
            interrupts_per_io: 1.0,
            bounced_bytes_per_io: 0.0,
            lat_p50_us: 10.0,
            lat_p99_us: 20.0,
            ios: 100,
            errors: 0,
            driver_doorbells: "mmio".into(),
            verify: false,
            verified_reads: 0,
            verify_errors: 0,
            rss_start_mib: 10.0,
            rss_end_mib: 10.0,
            rss_max_mib: 10.0,
        }
    }

    #[test]
    fn table_shows_gain_over_trap_at_the_same_depth() {
        let t = table(&[
            run("trap", 1, 1000.0),
            run("adaptive", 1, 4000.0),
            run("adaptive", 2, 8000.0),
        ]);
        assert!(t.contains("4.00x"), "{t}");
        assert!(t.contains("IOPS\niodepth"), "{t}");
        // No trap run at depth 2: no gain to show.
        let line = t
            .lines()
            .find(|l| l.starts_with("adaptive") && l.contains("   2 "))
            .unwrap();
        assert!(line.contains(" - "), "{line}");
    }
}
