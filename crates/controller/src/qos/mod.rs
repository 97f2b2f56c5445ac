//! Quality of service: IOPS and bandwidth limits with bursts, per
//! controller and per namespace, alone or shared with others in a named
//! group (QEMU's `throttle-group`).
//!
//! A limit is a token bucket (`bucket.rs`): `iops`, `read_iops` and
//! `write_iops` count commands, `bps`, `read_bps` and `write_bps` count
//! bytes (the LBA range's logical block data), each with a burst (the
//! bucket's size, by default a tenth of a second's worth, at least 1). The
//! combined keys count reads and writes together; any mix may be set. A
//! command pays every bucket that applies to it — its controller's, its
//! namespace's and their groups' (a group both are in once) — and starts
//! when the last one lets it.
//!
//! Reads are Read, Compare and Verify; writes are Write, Write Zeroes,
//! Write Uncorrectable and Zone Append. Other commands (Flush, Dataset
//! Management, Copy, reservations, zone management) and admin commands
//! are never throttled. A command a fault delays is not charged.
//!
//! A throttled command waits, it does not fail: its worker keeps it with
//! the commands a fault holds (`worker::held`), its CQ entry reserved, and
//! sleeps until the first one's time (no spinning) while it goes on with
//! other queues and commands; the admin queue is never held. Abort finds
//! it as it finds a held one; a controller reset drops it and forgives the
//! controller's and its namespaces' debt (a group's debt, shared with
//! others, stays).
//!
//! A change of limits (the control socket's `qos_set`) starts the buckets
//! it touches full, and every throttled command is charged again under the
//! new limits (in the order its worker holds them), so a raised limit
//! speeds up the commands already waiting.
//!
//! Cost when nothing is limited: one relaxed load per I/O command
//! (`Qos::armed`). A target that joined a group pays the check (a lock
//! per command) even while the group has no limit.
//!
//! Limits are configuration the guest cannot see (no Identify field or
//! feature reports them): saving a controller's state leaves them out,
//! and a restored controller takes them from its configuration.

pub(crate) mod bucket;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use vnvme_spec::{Command, NvmOpcode};

use bucket::Bucket;

/// Highest rate or burst: 2^40 (about 1.1 T commands or bytes a second).
pub const MAX_RATE: u64 = 1 << 40;

/// What a limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LimitKind {
    Iops,
    ReadIops,
    WriteIops,
    Bps,
    ReadBps,
    WriteBps,
}

impl LimitKind {
    pub const ALL: [LimitKind; 6] = [
        LimitKind::Iops,
        LimitKind::ReadIops,
        LimitKind::WriteIops,
        LimitKind::Bps,
        LimitKind::ReadBps,
        LimitKind::WriteBps,
    ];

    /// Its key in the configuration and the control socket (`read_iops`);
    /// its burst's key adds `_burst`.
    pub fn name(self) -> &'static str {
        match self {
            LimitKind::Iops => "iops",
            LimitKind::ReadIops => "read_iops",
            LimitKind::WriteIops => "write_iops",
            LimitKind::Bps => "bps",
            LimitKind::ReadBps => "read_bps",
            LimitKind::WriteBps => "write_bps",
        }
    }

    /// Counts bytes (else commands).
    pub fn bytes(self) -> bool {
        matches!(
            self,
            LimitKind::Bps | LimitKind::ReadBps | LimitKind::WriteBps
        )
    }

    fn index(self) -> usize {
        self as usize
    }

    fn applies(self, op: Op) -> bool {
        match self {
            LimitKind::Iops | LimitKind::Bps => true,
            LimitKind::ReadIops | LimitKind::ReadBps => op == Op::Read,
            LimitKind::WriteIops | LimitKind::WriteBps => op == Op::Write,
        }
    }
}

/// One limit: tokens a second and the bucket's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct QosRate {
    pub rate: u64,
    /// `None`: a tenth of a second's worth, at least 1.
    pub burst: Option<u64>,
}

impl QosRate {
    /// The bucket's size.
    pub fn burst(&self) -> u64 {
        self.burst.unwrap_or(self.rate / 10).max(1)
    }
}

/// The limits of one target; none set: unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QosLimits {
    rates: [Option<QosRate>; 6],
}

/// A limit that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QosError {
    #[error("{0}: 0 would stop all I/O; leave {0} out for no limit")]
    Zero(String),
    #[error("{key}: {value} is more than the highest, {MAX_RATE}")]
    TooHigh { key: String, value: u64 },
    #[error("{0}_burst needs {0}")]
    BurstWithoutRate(&'static str),
    #[error("unknown QoS key '{0}': use one of {keys}", keys = QosLimits::keys().join(", "))]
    UnknownKey(String),
    #[error("namespace {0} does not exist")]
    NoNamespace(u32),
    #[error("no QoS group '{0}' in this controller: groups are named in the configuration")]
    NoGroup(String),
    #[error("a QoS group needs a name of 1 to 64 letters, digits, '-', '_' or '.'")]
    GroupName,
}

impl QosLimits {
    /// Every key [`set`](Self::set) takes: each limit and its burst.
    pub fn keys() -> Vec<String> {
        LimitKind::ALL
            .iter()
            .flat_map(|k| [k.name().to_string(), format!("{}_burst", k.name())])
            .collect()
    }

    /// Whether `key` counts bytes (`bps`, `read_bps_burst`...), `None` if
    /// it is no key of [`keys`](Self::keys).
    pub fn key_counts_bytes(key: &str) -> Option<bool> {
        let base = key.strip_suffix("_burst").unwrap_or(key);
        LimitKind::ALL
            .iter()
            .find(|k| k.name() == base)
            .map(|k| k.bytes())
    }

    /// Sets `key` (a limit or its burst) to `value`, checked.
    pub fn set(&mut self, key: &str, value: u64) -> Result<(), QosError> {
        let (base, burst) = match key.strip_suffix("_burst") {
            Some(b) => (b, true),
            None => (key, false),
        };
        let kind = LimitKind::ALL
            .into_iter()
            .find(|k| k.name() == base)
            .ok_or_else(|| QosError::UnknownKey(key.to_string()))?;
        if value == 0 {
            return Err(QosError::Zero(key.to_string()));
        }
        if value > MAX_RATE {
            return Err(QosError::TooHigh {
                key: key.to_string(),
                value,
            });
        }
        let slot = &mut self.rates[kind.index()];
        match (slot.as_mut(), burst) {
            (Some(r), true) => r.burst = Some(value),
            (None, true) => {
                *slot = Some(QosRate {
                    rate: 0,
                    burst: Some(value),
                })
            }
            (Some(r), false) => r.rate = value,
            (None, false) => {
                *slot = Some(QosRate {
                    rate: value,
                    burst: None,
                })
            }
        }
        Ok(())
    }

    /// Checks what [`set`](Self::set) cannot see alone: every burst has
    /// its limit.
    pub fn validate(&self) -> Result<(), QosError> {
        for kind in LimitKind::ALL {
            if let Some(r) = self.get(kind) {
                if r.rate == 0 {
                    return Err(QosError::BurstWithoutRate(kind.name()));
                }
            }
        }
        Ok(())
    }

    pub fn get(&self, kind: LimitKind) -> Option<QosRate> {
        self.rates.get(kind.index()).copied().flatten()
    }

    /// No limit set.
    pub fn is_empty(&self) -> bool {
        self.rates.iter().all(Option::is_none)
    }

    /// Each limit and burst set, by key (bursts as in effect).
    pub fn to_map(&self) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for kind in LimitKind::ALL {
            if let Some(r) = self.get(kind) {
                m.insert(kind.name().to_string(), r.rate);
                m.insert(format!("{}_burst", kind.name()), r.burst());
            }
        }
        m
    }

    /// The limits [`to_map`](Self::to_map) wrote, checked as `set` and
    /// `validate` check them.
    pub fn from_map(keys: &BTreeMap<String, u64>) -> Result<Self, QosError> {
        let mut limits = Self::default();
        for (key, &value) in keys {
            limits.set(key, value)?;
        }
        limits.validate()?;
        Ok(limits)
    }
}

/// Reads or writes, as limits tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Read,
    Write,
}

/// Whether `cmd` is throttled, and its direction and blocks.
pub(crate) fn classify(cmd: &Command) -> Option<(Op, u64)> {
    let op = match NvmOpcode(cmd.opcode()) {
        NvmOpcode::READ | NvmOpcode::COMPARE | NvmOpcode::VERIFY => Op::Read,
        NvmOpcode::WRITE
        | NvmOpcode::WRITE_ZEROES
        | NvmOpcode::WRITE_UNCORRECTABLE
        | NvmOpcode::ZONE_APPEND => Op::Write,
        _ => return None,
    };
    // CDW12 bits 15:0: NLB, 0's based.
    let blocks = u64::from(cmd.cdw12.get() & 0xFFFF) + 1;
    Some((op, blocks))
}

/// Nanoseconds since this process's QoS epoch: the buckets' clock.
pub(crate) fn clock_ns(now: Instant) -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(now.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX)
}

/// Bumped by every change of limits in this process: a held command
/// charged under an older one is charged again.
static GENERATION: AtomicU64 = AtomicU64::new(0);

pub(crate) fn generation() -> u64 {
    GENERATION.load(Relaxed)
}

/// A command a limit holds back, as its worker keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Throttled {
    /// The [`generation`] it was charged at.
    pub generation: u64,
    /// When it was first held.
    pub since: Instant,
}

/// A set of buckets and their counters: one target's own limits, or a
/// group's.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    state: Mutex<ThrottleState>,
    /// Commands this throttle made wait, and the time it planned for them.
    throttled: AtomicU64,
    throttled_ns: AtomicU64,
}

#[derive(Debug, Default)]
struct ThrottleState {
    limits: QosLimits,
    buckets: [Option<Bucket>; 6],
}

impl Throttle {
    fn new(limits: QosLimits, now_ns: u64) -> Self {
        let t = Self::default();
        t.set(limits, now_ns);
        t
    }

    /// New limits, their buckets full.
    pub fn set(&self, limits: QosLimits, now_ns: u64) {
        let mut s = self.state.lock();
        s.limits = limits;
        for kind in LimitKind::ALL {
            if let Some(b) = s.buckets.get_mut(kind.index()) {
                *b = limits
                    .get(kind)
                    .map(|r| Bucket::new(r.rate, r.burst(), now_ns));
            }
        }
    }

    /// Forgives the debt: the buckets full again.
    fn refill(&self, now_ns: u64) {
        let limits = self.state.lock().limits;
        self.set(limits, now_ns);
    }

    pub fn limits(&self) -> QosLimits {
        self.state.lock().limits
    }

    fn counts_bytes(&self) -> bool {
        let s = self.state.lock();
        LimitKind::ALL
            .iter()
            .any(|k| k.bytes() && s.limits.get(*k).is_some())
    }

    /// Charges a command: nanoseconds it waits.
    pub fn charge(&self, op: Op, bytes: u64, now_ns: u64) -> u64 {
        let mut s = self.state.lock();
        let mut wait = 0;
        for kind in LimitKind::ALL {
            if !kind.applies(op) {
                continue;
            }
            if let Some(b) = s.buckets.get_mut(kind.index()).and_then(Option::as_mut) {
                let cost = if kind.bytes() { bytes } else { 1 };
                wait = wait.max(b.take(cost, now_ns));
            }
        }
        drop(s);
        if wait > 0 {
            self.throttled.fetch_add(1, Relaxed);
            self.throttled_ns.fetch_add(wait, Relaxed);
        }
        wait
    }

    fn report(&self) -> ThrottleReport {
        ThrottleReport {
            limits: self.limits().to_map(),
            throttled_commands: self.throttled.load(Relaxed),
            throttled_wait_ns: self.throttled_ns.load(Relaxed),
        }
    }
}

/// A named budget several targets share, in one controller or several of
/// one process (share the `Arc`).
#[derive(Debug)]
pub struct QosGroup {
    name: String,
    throttle: Throttle,
}

impl QosGroup {
    pub fn new(name: &str, limits: QosLimits) -> Result<Arc<Self>, QosError> {
        let ok = (1..=64).contains(&name.len())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !ok {
            return Err(QosError::GroupName);
        }
        limits.validate()?;
        Ok(Arc::new(Self {
            name: name.to_string(),
            throttle: Throttle::new(limits, clock_ns(Instant::now())),
        }))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn limits(&self) -> QosLimits {
        self.throttle.limits()
    }

    /// New limits for every member (their buckets full).
    pub fn set(&self, limits: QosLimits) -> Result<(), QosError> {
        limits.validate()?;
        self.throttle.set(limits, clock_ns(Instant::now()));
        GENERATION.fetch_add(1, Relaxed);
        Ok(())
    }
}

/// What a limit applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QosTarget {
    Controller,
    Namespace(u32),
}

#[derive(Debug, Default, Clone)]
struct Target {
    own: Option<Arc<Throttle>>,
    group: Option<Arc<QosGroup>>,
}

impl Target {
    fn limited(&self) -> bool {
        self.group.is_some() || self.own.as_ref().is_some_and(|t| !t.limits().is_empty())
    }

    fn report(&self) -> TargetReport {
        TargetReport {
            own: self.own.as_ref().map(|t| t.report()),
            group: self.group.as_ref().map(|g| g.name.clone()),
        }
    }
}

#[derive(Debug, Default)]
struct Table {
    controller: Target,
    namespaces: BTreeMap<u32, Target>,
}

impl Table {
    fn target_mut(&mut self, t: QosTarget) -> &mut Target {
        match t {
            QosTarget::Controller => &mut self.controller,
            QosTarget::Namespace(nsid) => self.namespaces.entry(nsid).or_default(),
        }
    }

    fn limited(&self) -> bool {
        self.controller.limited() || self.namespaces.values().any(Target::limited)
    }
}

/// One controller's limits.
#[derive(Debug, Default)]
pub(crate) struct Qos {
    /// Some target is limited (changed under `table`'s write lock).
    armed: AtomicBool,
    table: RwLock<Table>,
}

impl Qos {
    /// Whether any limit applies: the one load an unlimited controller
    /// pays per command.
    #[inline]
    pub fn armed(&self) -> bool {
        self.armed.load(Relaxed)
    }

    /// Replaces `target`'s own limits (empty: none).
    pub fn set(&self, target: QosTarget, limits: QosLimits) -> Result<(), QosError> {
        limits.validate()?;
        let now_ns = clock_ns(Instant::now());
        let mut table = self.table.write();
        let t = table.target_mut(target);
        match &t.own {
            Some(own) => own.set(limits, now_ns),
            None if limits.is_empty() => {}
            None => t.own = Some(Arc::new(Throttle::new(limits, now_ns))),
        }
        self.armed.store(table.limited(), Relaxed);
        GENERATION.fetch_add(1, Relaxed);
        Ok(())
    }

    /// `target` shares `group`'s budget (`None`: leaves its group).
    pub fn join(&self, target: QosTarget, group: Option<Arc<QosGroup>>) {
        let mut table = self.table.write();
        table.target_mut(target).group = group;
        self.armed.store(table.limited(), Relaxed);
        GENERATION.fetch_add(1, Relaxed);
    }

    /// The group named `name` some target of this controller is in.
    pub fn group(&self, name: &str) -> Option<Arc<QosGroup>> {
        let table = self.table.read();
        std::iter::once(&table.controller)
            .chain(table.namespaces.values())
            .filter_map(|t| t.group.as_ref())
            .find(|g| g.name == name)
            .cloned()
    }

    /// A controller reset: its own buckets full again (a group's are
    /// shared, so they stay).
    pub fn reset(&self) {
        let now_ns = clock_ns(Instant::now());
        let table = self.table.read();
        for t in std::iter::once(&table.controller).chain(table.namespaces.values()) {
            if let Some(own) = &t.own {
                own.refill(now_ns);
            }
        }
    }

    /// Charges I/O command `cmd` at `now` to every bucket that applies;
    /// when it may start, if later than `now`. `block_bytes` gives a
    /// namespace's bytes per logical block (asked only for byte limits;
    /// `None`: no such namespace, so no bytes).
    pub fn admit(
        &self,
        cmd: &Command,
        block_bytes: impl FnOnce(u32) -> Option<u64>,
        now: Instant,
    ) -> Option<Instant> {
        let (op, blocks) = classify(cmd)?;
        let nsid = cmd.nsid.get();
        let table = self.table.read();
        let ns = table.namespaces.get(&nsid);
        let mut throttles: Vec<&Throttle> = Vec::with_capacity(4);
        let mut groups: Vec<&Arc<QosGroup>> = Vec::with_capacity(2);
        for t in std::iter::once(&table.controller).chain(ns) {
            if let Some(own) = &t.own {
                throttles.push(own);
            }
            if let Some(g) = &t.group {
                // A group the controller and the namespace both are in is
                // paid once.
                if !groups.iter().any(|o| Arc::ptr_eq(o, g)) {
                    groups.push(g);
                    throttles.push(&g.throttle);
                }
            }
        }
        let bytes = if throttles.iter().any(|t| t.counts_bytes()) {
            block_bytes(nsid).map_or(0, |b| b.saturating_mul(blocks))
        } else {
            0
        };
        let now_ns = clock_ns(now);
        let wait = throttles
            .iter()
            .map(|t| t.charge(op, bytes, now_ns))
            .max()
            .unwrap_or(0);
        (wait > 0).then(|| now + Duration::from_nanos(wait))
    }

    pub fn report(&self) -> QosReport {
        let table = self.table.read();
        let mut groups = BTreeMap::new();
        for t in std::iter::once(&table.controller).chain(table.namespaces.values()) {
            if let Some(g) = &t.group {
                groups.insert(g.name.clone(), g.throttle.report());
            }
        }
        QosReport {
            controller: table.controller.report(),
            namespaces: table
                .namespaces
                .iter()
                .filter(|(_, t)| t.own.is_some() || t.group.is_some())
                .map(|(&nsid, t)| (nsid, t.report()))
                .collect(),
            groups,
        }
    }
}

/// The limits and counters of a controller's targets (`qos_get`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct QosReport {
    pub controller: TargetReport,
    pub namespaces: BTreeMap<u32, TargetReport>,
    /// Groups a target of this controller is in.
    pub groups: BTreeMap<String, ThrottleReport>,
}

/// One target: its own limits, if any were ever set, and its group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TargetReport {
    pub own: Option<ThrottleReport>,
    pub group: Option<String>,
}

/// Limits by key (bursts as in effect) and what they did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ThrottleReport {
    pub limits: BTreeMap<String, u64>,
    /// Commands these limits made wait.
    pub throttled_commands: u64,
    /// The time they planned for those commands, summed.
    pub throttled_wait_ns: u64,
}
