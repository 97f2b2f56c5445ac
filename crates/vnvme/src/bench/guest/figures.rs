//! The figures of one guest benchmark point: a server's counters from its
//! `--stats` file, and one device's fio slices summed.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use super::RAMP;

/// The counters read from one `--stats` file.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Counters {
    traps: u64,
    interrupts: u64,
    io_commands: u64,
}

impl Counters {
    pub(super) fn parse(v: &Value) -> Option<Self> {
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
    pub(super) fn per_io(&self, later: &Self) -> (f64, f64, u64) {
        let ios = later.io_commands.saturating_sub(self.io_commands);
        let d = ios.max(1) as f64;
        (
            later.traps.saturating_sub(self.traps) as f64 / d,
            later.interrupts.saturating_sub(self.interrupts) as f64 / d,
            ios,
        )
    }
}

/// One device's fio slices at one point, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Slices {
    pub(super) slices: u32,
    /// I/Os after the ramps, and the seconds they took.
    ios: f64,
    secs: f64,
    /// I/Os with each ramp counted at its slice's rate: what the guest's
    /// interrupt count spans.
    ios_with_ramp: f64,
    guest_irqs: Option<f64>,
    /// Means over the slices (a percentile of the union is not kept by fio's
    /// terse output; each slice has thousands of I/Os).
    pub(super) p50_us: f64,
    pub(super) p99_us: f64,
    /// Weighted by each slice's I/Os.
    pub(super) lat_mean_us: f64,
}

impl Slices {
    /// `None` for no slice with I/O.
    pub(super) fn sum(results: &[Value]) -> Option<Self> {
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

    pub(super) fn iops(&self) -> f64 {
        self.ios / self.secs.max(1e-9)
    }

    pub(super) fn guest_interrupts_per_io(&self) -> Option<f64> {
        self.guest_irqs.map(|n| n / self.ios_with_ramp.max(1.0))
    }
}

/// Waits (up to 1.8 s in all) for each server to rewrite its stats file
/// after now, then reads them. `None` for one that never did or does not
/// parse.
pub(super) fn fresh_stats(paths: &[&Path]) -> Vec<Option<Counters>> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn counters_exclude_admin_commands() {
        let v = serde_json::json!({
            "sq_doorbell_traps": 5, "cq_doorbell_traps": 2, "interrupts": 9, "commands": 110,
            "queues": [{"qid": 0, "commands": 10}, {"qid": 1, "commands": 100}]
        });
        let c = Counters::parse(&v).unwrap();
        assert_eq!((c.traps, c.interrupts, c.io_commands), (7, 9, 100));
    }
}
