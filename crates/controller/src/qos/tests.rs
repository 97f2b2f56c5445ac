//! The buckets driven by a test clock: counts, never timings.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vnvme_spec::{Command, NvmOpcode};
use zerocopy::little_endian::U32;

use super::bucket::{Bucket, MAX_WAIT_NS};
use super::*;

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

fn cmd(op: NvmOpcode, nsid: u32, blocks: u32) -> Command {
    Command {
        cdw0: U32::new(u32::from(op.0)),
        nsid: U32::new(nsid),
        cdw12: U32::new(blocks - 1),
        ..Default::default()
    }
}

fn limits(pairs: &[(&str, u64)]) -> QosLimits {
    let mut l = QosLimits::default();
    for (k, v) in pairs {
        l.set(k, *v).expect("valid limit");
    }
    l
}

#[test]
fn bucket_serves_its_burst_then_one_token_per_interval() {
    let mut b = Bucket::new(10, 5, 0);
    for _ in 0..5 {
        assert_eq!(b.take(1, 0), 0);
    }
    // 10 a second: one token every 100 ms, served in arrival order.
    assert_eq!(b.take(1, 0), 100 * MS);
    assert_eq!(b.take(1, 0), 200 * MS);
    assert_eq!(b.tokens(), -2);
}

#[test]
fn bucket_refills_at_its_rate_up_to_its_burst() {
    let mut b = Bucket::new(1000, 10, 0);
    assert_eq!(b.take(10, 0), 0);
    assert_eq!(b.tokens(), 0);
    // 5 ms at 1000/s: 5 tokens.
    assert_eq!(b.take(0, 5 * MS), 0);
    assert_eq!(b.tokens(), 5);
    // An hour later: only the burst.
    assert_eq!(b.take(0, 3600 * S), 0);
    assert_eq!(b.tokens(), 10);
    // A clock read earlier, arriving late, takes nothing back.
    assert_eq!(b.take(1, S), 0);
    assert_eq!(b.tokens(), 9);
}

#[test]
fn bucket_runs_a_command_costlier_than_its_burst_after_the_debt() {
    let mut b = Bucket::new(4096, 4096, 0);
    // 128 KiB at 4 KiB/s and a 4 KiB burst: 31 s of debt.
    assert_eq!(b.take(128 * 1024, 0), 31 * S);
}

#[test]
fn bucket_debt_is_capped() {
    let mut b = Bucket::new(1, 1, 0);
    assert_eq!(b.take(u64::MAX, 0), MAX_WAIT_NS);
    assert_eq!(b.take(1, 0), MAX_WAIT_NS);
}

#[test]
fn bucket_holds_its_rate_over_ten_seconds_at_qd32() {
    // A closed loop at queue depth 32 against 1000 IOPS, burst 100: a
    // command is resubmitted the moment it starts.
    let mut b = Bucket::new(1000, 100, 0);
    let mut starts: Vec<u64> = (0..32).map(|_| b.take(1, 0)).collect();
    let mut started = 0u64;
    while let Some(i) = (0..starts.len()).min_by_key(|&i| starts[i]) {
        let at = starts[i];
        if at >= 10 * S {
            break;
        }
        started += 1;
        starts[i] = at + b.take(1, at);
    }
    // 10 s at 1000/s plus the first burst.
    assert!((10_099..=10_101).contains(&started), "{started}");
}

#[test]
fn limits_refuse_zero_huge_unknown_and_burst_alone() {
    let mut l = QosLimits::default();
    assert_eq!(l.set("iops", 0), Err(QosError::Zero("iops".into())));
    assert!(matches!(
        l.set("bps", MAX_RATE + 1),
        Err(QosError::TooHigh { .. })
    ));
    let e = l.set("iops_total", 5).unwrap_err();
    assert_eq!(e, QosError::UnknownKey("iops_total".into()));
    assert!(e.to_string().contains("read_iops"), "{e}");
    l.set("write_bps_burst", 4096).unwrap();
    assert_eq!(l.validate(), Err(QosError::BurstWithoutRate("write_bps")));
    l.set("write_bps", 8192).unwrap();
    assert_eq!(l.validate(), Ok(()));
    assert_eq!(l.to_map().get("write_bps_burst"), Some(&4096));
    assert!(QosGroup::new("", QosLimits::default()).is_err());
    assert!(QosGroup::new("a/b", QosLimits::default()).is_err());
}

#[test]
fn default_burst_is_a_tenth_of_a_second_at_least_one() {
    let l = limits(&[("iops", 5), ("bps", 1_000_000)]);
    assert_eq!(l.to_map().get("iops_burst"), Some(&1));
    assert_eq!(l.to_map().get("bps_burst"), Some(&100_000));
}

#[test]
fn reads_and_writes_have_their_own_buckets() {
    let q = Qos::default();
    q.set(
        QosTarget::Controller,
        limits(&[
            ("read_iops", 10),
            ("read_iops_burst", 1),
            ("write_iops", 1000),
        ]),
    )
    .unwrap();
    let t0 = Instant::now();
    let read = cmd(NvmOpcode::READ, 1, 1);
    let write = cmd(NvmOpcode::WRITE, 1, 1);
    assert_eq!(q.admit(&read, |_| Some(512), t0), None);
    assert_eq!(
        q.admit(&read, |_| Some(512), t0),
        Some(t0 + Duration::from_millis(100))
    );
    // Writes do not pay the reads' debt, and 100 of them fit the burst.
    for _ in 0..100 {
        assert_eq!(q.admit(&write, |_| Some(512), t0), None);
    }
    assert!(q.admit(&write, |_| Some(512), t0).is_some());
    // Flush is never throttled.
    assert_eq!(q.admit(&cmd(NvmOpcode::FLUSH, 1, 1), |_| None, t0), None);
}

#[test]
fn bandwidth_counts_the_lba_range_in_bytes() {
    let q = Qos::default();
    q.set(
        QosTarget::Namespace(1),
        limits(&[("bps", 1 << 20), ("bps_burst", 64 << 10)]),
    )
    .unwrap();
    let t0 = Instant::now();
    // 16 x 4 KiB = the burst; the next 64 KiB waits 1/16 s.
    assert_eq!(
        q.admit(&cmd(NvmOpcode::WRITE, 1, 16), |_| Some(4096), t0),
        None
    );
    assert_eq!(
        q.admit(&cmd(NvmOpcode::READ, 1, 16), |_| Some(4096), t0),
        Some(t0 + Duration::from_micros(62_500))
    );
    // Another namespace has no limit.
    assert_eq!(
        q.admit(&cmd(NvmOpcode::READ, 2, 16), |_| Some(4096), t0),
        None
    );
}

#[test]
fn a_group_is_one_budget_for_its_members_and_paid_once() {
    let g = QosGroup::new("tenant-a", limits(&[("iops", 100), ("iops_burst", 2)])).unwrap();
    let a = Qos::default();
    let b = Qos::default();
    a.join(QosTarget::Namespace(1), Some(Arc::clone(&g)));
    a.join(QosTarget::Controller, Some(Arc::clone(&g)));
    b.join(QosTarget::Controller, Some(Arc::clone(&g)));
    let t0 = Instant::now();
    let read = cmd(NvmOpcode::READ, 1, 1);
    // Controller and namespace both in the group: one token, not two.
    assert_eq!(a.admit(&read, |_| Some(512), t0), None);
    assert_eq!(b.admit(&read, |_| Some(512), t0), None);
    // The shared burst is gone, for either controller.
    assert_eq!(
        a.admit(&read, |_| Some(512), t0),
        Some(t0 + Duration::from_millis(10))
    );
    assert_eq!(
        b.admit(&read, |_| Some(512), t0),
        Some(t0 + Duration::from_millis(20))
    );
    assert_eq!(
        a.group("tenant-a").map(|g| g.name().to_string()),
        Some("tenant-a".into())
    );
    assert!(a.report().groups["tenant-a"].throttled_commands >= 2);
}

#[test]
fn a_limit_change_starts_full_and_bumps_the_generation() {
    let q = Qos::default();
    assert!(!q.armed());
    q.set(
        QosTarget::Controller,
        limits(&[("iops", 1), ("iops_burst", 1)]),
    )
    .unwrap();
    assert!(q.armed());
    let t0 = Instant::now();
    let read = cmd(NvmOpcode::READ, 1, 1);
    assert_eq!(q.admit(&read, |_| None, t0), None);
    assert_eq!(
        q.admit(&read, |_| None, t0),
        Some(t0 + Duration::from_secs(1))
    );
    let before = generation();
    q.set(
        QosTarget::Controller,
        limits(&[("iops", 1000), ("iops_burst", 1)]),
    )
    .unwrap();
    assert!(generation() > before);
    assert_eq!(q.admit(&read, |_| None, t0), None);
    assert_eq!(
        q.admit(&read, |_| None, t0),
        Some(t0 + Duration::from_millis(1))
    );
    // No limit left: disarmed, nothing charged.
    q.set(QosTarget::Controller, QosLimits::default()).unwrap();
    assert!(!q.armed());
    assert_eq!(q.admit(&read, |_| None, t0), None);
    let r = q.report();
    assert_eq!(r.controller.own.map(|o| o.throttled_commands), Some(2));
}

#[test]
fn a_reset_forgives_the_controllers_debt() {
    let q = Qos::default();
    q.set(
        QosTarget::Namespace(3),
        limits(&[("write_iops", 1), ("write_iops_burst", 1)]),
    )
    .unwrap();
    let now = Instant::now();
    let write = cmd(NvmOpcode::WRITE, 3, 1);
    assert_eq!(q.admit(&write, |_| None, now), None);
    assert!(q.admit(&write, |_| None, now).is_some());
    q.reset();
    assert_eq!(q.admit(&write, |_| None, Instant::now()), None);
}

#[test]
fn limits_read_back_from_their_map_are_the_same_and_a_bad_map_is_refused() {
    let l = limits(&[
        ("iops", 1000),
        ("read_bps", 50 << 20),
        ("read_bps_burst", 1 << 20),
    ]);
    // A burst left to its default comes back set to that default: the
    // same limits in effect, so the same map.
    let back = QosLimits::from_map(&l.to_map()).unwrap();
    assert_eq!(back.to_map(), l.to_map());
    assert_eq!(back.get(LimitKind::ReadBps), l.get(LimitKind::ReadBps));
    let mut bad = l.to_map();
    bad.insert("no_such_key".into(), 1);
    assert!(QosLimits::from_map(&bad).is_err());
    let burst_alone = BTreeMap::from([("write_iops_burst".to_string(), 4)]);
    assert!(QosLimits::from_map(&burst_alone).is_err());
}
