//! The table `vnvme bench --guest` prints: one row per device at each
//! engine and depth, with the ratio to QEMU's nvme.

use std::fmt::Write as _;

use super::{Engine, GuestRun};
use crate::bench::report::kilo;

/// The reference of a point: QEMU's nvme with dbcs=on, same engine and
/// depth; without it (`VNVME_BENCH_NO_QEMU=1`) the point's first device.
pub(super) fn reference(runs: &[GuestRun], engine: Engine, qd: u16) -> Option<f64> {
    let point = || runs.iter().filter(|r| r.engine == engine && r.qd == qd);
    point()
        .find(|r| r.device == "qemu-nvme" && r.dbcs == Some(true))
        .or_else(|| point().next())
        .map(|r| r.iops)
        .filter(|&i| i > 0.0)
}

/// "vnvme adaptive B", "qemu-nvme dbcs=on".
pub(super) fn label(r: &GuestRun) -> String {
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
        "\n{:<9} {:>4}  {:<19} {:>8} {:>8} {:>9} {:>7} {:>9} {:>7} {:>7}",
        "engine",
        "qd",
        "device",
        "IOPS",
        "vs qemu",
        "traps/IO",
        "irq/IO",
        "guest irq",
        "p50 us",
        "p99 us"
    );
    for (engine, qd) in keys {
        let base = reference(runs, engine, qd);
        for r in runs.iter().filter(|r| r.engine == engine && r.qd == qd) {
            let device = label(r);
            let ratio = base.map_or("-".to_string(), |b| format!("{:.2}x", r.iops / b));
            let per = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.3}"));
            let _ = writeln!(
                s,
                "{:<9} {:>4}  {:<19} {:>8} {:>8} {:>9} {:>7} {:>9} {:>7.0} {:>7.0}",
                engine.name(),
                qd,
                device,
                kilo(r.iops),
                ratio,
                per(r.traps_per_io),
                per(r.interrupts_per_io),
                per(r.guest_interrupts_per_io),
                r.lat_p50_us,
                r.lat_p99_us
            );
        }
    }
    let _ = writeln!(
        s,
        "(latency: fio's total, submission to completion, of all a point's slices together)"
    );
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
    use serde_json::Value;

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
            lat_p50_us: 100.0,
            lat_p99_us: 300.0,
            lat_mean_us: 110.0,
            server_ios: None,
            host_cores: None,
        }
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
}
