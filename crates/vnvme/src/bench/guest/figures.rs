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
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Slices {
    pub(super) slices: u32,
    /// I/Os after the ramps, and the seconds they took.
    ios: f64,
    secs: f64,
    /// I/Os with each ramp counted at its slice's rate: what the guest's
    /// interrupt count spans.
    ios_with_ramp: f64,
    guest_irqs: Option<f64>,
    /// Percentiles of all the slices' I/Os together (see
    /// [`union_percentile`]); the mean of the slices' own where a slice
    /// lacks fio's percentile list.
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
        let mut cdfs: Option<Vec<Percentiles>> = Some(Vec::new());
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
            s.p50_us += f("lat_p50_us").unwrap_or(0.0);
            s.p99_us += f("lat_p99_us").unwrap_or(0.0);
            s.lat_mean_us += f("lat_mean_us").unwrap_or(0.0) * ios;
            cdfs = cdfs.zip(percentiles(v)).map(|(mut all, pcts)| {
                all.push((ios, pcts));
                all
            });
        }
        if s.slices == 0 || s.ios <= 0.0 {
            return None;
        }
        s.p50_us /= f64::from(s.slices);
        s.p99_us /= f64::from(s.slices);
        if let Some(cdfs) = cdfs {
            s.p50_us = union_percentile(&cdfs, 50.0).unwrap_or(s.p50_us);
            s.p99_us = union_percentile(&cdfs, 99.0).unwrap_or(s.p99_us);
        }
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

/// A slice's I/O count and its latency percentiles, `(percent, µs)`.
type Percentiles = (f64, Vec<(f64, f64)>);

/// A slice's latency percentiles (`lat_pcts_us`: `[[percent, us], ...]`),
/// sorted by percent.
fn percentiles(v: &Value) -> Option<Vec<(f64, f64)>> {
    let mut pcts = v
        .get("lat_pcts_us")?
        .as_array()?
        .iter()
        .map(|pair| Some((pair.get(0)?.as_f64()?, pair.get(1)?.as_f64()?)))
        .collect::<Option<Vec<_>>>()?;
    pcts.sort_by(|a, b| a.0.total_cmp(&b.0));
    (!pcts.is_empty()).then_some(pcts)
}

/// The `percent`th percentile of the union of slices, each given as its
/// I/O count and its fio percentiles. fio keeps no histogram in its terse
/// output, so each slice's distribution is taken as linear between its
/// percentile points (from 0 at 0 µs); the union's is their mean weighted
/// by I/Os, which is linear between consecutive points of all slices, so
/// the crossing is found exactly. A mean of the slices' p99s would let one
/// slice's hiccup (its 1% slowest) stand for the union's 1% slowest.
fn union_percentile(slices: &[Percentiles], percent: f64) -> Option<f64> {
    let total: f64 = slices.iter().map(|(ios, _)| ios).sum();
    if total <= 0.0 {
        return None;
    }
    // One slice's share of I/Os at or below `us`, in percent.
    let below = |pcts: &[(f64, f64)], us: f64| {
        let mut prev = (0.0, 0.0);
        for &(p, v) in pcts {
            if us < v {
                let span = v - prev.1;
                return prev.0 + (p - prev.0) * (us - prev.1) / span;
            }
            prev = (p, v);
        }
        prev.0
    };
    let union = |us: f64| {
        slices
            .iter()
            .map(|(ios, pcts)| ios * below(pcts, us))
            .sum::<f64>()
            / total
    };
    let mut points: Vec<f64> = slices
        .iter()
        .flat_map(|(_, pcts)| pcts.iter().map(|&(_, v)| v))
        .collect();
    points.sort_by(f64::total_cmp);
    let mut prev = (0.0, 0.0);
    for us in points {
        let at = union(us);
        if at >= percent {
            let span = at - prev.1;
            return Some(if span > 0.0 {
                prev.0 + (us - prev.0) * (percent - prev.1) / span
            } else {
                us
            });
        }
        prev = (us, at);
    }
    None
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
                "lat_p50_us": 100, "lat_p99_us": p99, "lat_mean_us": 1e6 / iops,
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
    fn the_p99_is_the_unions_not_a_mean_of_the_slices() {
        // Three calm slices and one whose 1% slowest met a hiccup.
        let calm = vec![(50.0, 100.0), (90.0, 200.0), (99.0, 400.0), (99.9, 600.0)];
        let hiccup = vec![
            (50.0, 100.0),
            (90.0, 200.0),
            (98.5, 400.0),
            (99.0, 10_000.0),
        ];
        let slices = [
            (1000.0, calm.clone()),
            (1000.0, calm.clone()),
            (1000.0, calm),
            (1000.0, hiccup),
        ];
        // The mean of the four p99s is 2800 µs. In the union, 98.875% of
        // the I/Os took at most 400 µs, and the calm slices' next 0.9%
        // spread over 400-600 µs: 99% is reached at about 437 µs.
        let p99 = union_percentile(&slices, 99.0).unwrap();
        assert!((430.0..445.0).contains(&p99), "{p99}");
        let p50 = union_percentile(&slices, 50.0).unwrap();
        assert!((p50 - 100.0).abs() < 1e-9, "{p50}");
        // One slice alone: its own percentiles, interpolated between them.
        let one = [(10.0, vec![(50.0, 100.0), (99.0, 400.0)])];
        assert!((union_percentile(&one, 99.0).unwrap() - 400.0).abs() < 1e-9);
        assert!((union_percentile(&one, 25.0).unwrap() - 50.0).abs() < 1e-9);
        assert_eq!(union_percentile(&[], 99.0), None);
    }

    #[test]
    fn slices_with_percentile_lists_give_the_unions_percentiles() {
        // fio_json's line for a slice, with its percentile list.
        let slice = |p99: f64| {
            serde_json::json!({"iops": 1000, "io_kib": 4000, "runtime_ms": 1000,
                "lat_p50_us": 100, "lat_p99_us": p99, "lat_mean_us": 120.0,
                "lat_pcts_us": [[99, p99], [50, 100], [90, 200]]})
        };
        let s = Slices::sum(&[slice(400.0), slice(400.0)]).unwrap();
        assert!((s.p99_us - 400.0).abs() < 1e-9, "{}", s.p99_us);
        assert!((s.p50_us - 100.0).abs() < 1e-9, "{}", s.p50_us);
        // One slice without the list: the mean of the slices' own.
        let mut bare = slice(1000.0);
        bare.as_object_mut().unwrap().remove("lat_pcts_us");
        let s = Slices::sum(&[slice(400.0), bare]).unwrap();
        assert!((s.p99_us - 700.0).abs() < 1e-9, "{}", s.p99_us);
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
