//! Faults injected on purpose, at run time (the control socket) or from the
//! configuration: what host software developers need to exercise their
//! error paths with a device that fails exactly when they ask.
//!
//! Two sorts:
//!
//! * **Command faults** ([`FaultKind::Latency`], [`FaultKind::Status`],
//!   [`FaultKind::NeverComplete`]) are rules matched against every I/O
//!   command as it is fetched: by namespace, opcode and LBA range, firing
//!   with a probability and at most a count of times. A worker looks at one
//!   flag first, so with no rule armed a command pays one relaxed load.
//! * **State faults** (a media error on an LBA range, a namespace not
//!   ready for a while, a SMART critical warning, power loss) change the
//!   controller's state once when they are added; the controller applies
//!   them (they need namespaces and events), this module keeps what is
//!   left of them to see: the not-ready periods and the warning bits.
//!
//! Commands a rule holds back (latency, never-complete) stay in their
//! worker's hands (the worker's `held` list); their keys are registered here so Abort can
//! find them, and a controller reset forgets them all.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use vnvme_spec::{Command, NvmOpcode, Status};

use vnvme_spec::ana::AnaState;

/// Command fault rules kept at most (a control client cannot grow the
/// table without bound).
pub const MAX_FAULTS: usize = 256;

/// Commands held back at once, over every queue; past that a rule that
/// would hold one more lets it run (bounded memory whatever the rules).
pub(crate) const MAX_HELD: usize = 4096;

/// Longest latency a rule may add: longer than any host's timeout, and
/// short enough that no distribution sample overflows an `Instant`.
pub const MAX_LATENCY: Duration = Duration::from_secs(3600);

/// How long a [`Latency`] lasts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Latency {
    Fixed(Duration),
    /// Uniformly between the two (inclusive).
    Uniform(Duration, Duration),
    /// Exponentially distributed with this mean (capped at
    /// [`MAX_LATENCY`]): a long tail, as a device doing garbage collection.
    Exponential(Duration),
}

impl Latency {
    fn sample(&self, rng: &mut Rng) -> Duration {
        let d = match *self {
            Latency::Fixed(d) => d,
            Latency::Uniform(lo, hi) => lo + (hi.saturating_sub(lo)).mul_f64(rng.unit()),
            // Inverse transform: -mean * ln(1 - u), u in [0, 1).
            Latency::Exponential(mean) => mean.mul_f64(-(1.0 - rng.unit()).ln().min(1e6)),
        };
        d.min(MAX_LATENCY)
    }

    fn check(&self) -> Result<(), FaultError> {
        let too_long = |d: Duration| d > MAX_LATENCY;
        match *self {
            Latency::Fixed(d) | Latency::Exponential(d) if too_long(d) => Err(FaultError::Latency),
            Latency::Uniform(lo, hi) if too_long(hi) || lo > hi => Err(FaultError::Latency),
            _ => Ok(()),
        }
    }
}

/// What a fault does.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultKind {
    /// Matching commands start this much later (the worker goes on with
    /// other commands meanwhile).
    Latency(Latency),
    /// Matching commands complete with this status (DNR as given) without
    /// running.
    Status(Status),
    /// Matching commands are never completed: the host's timeout, Abort
    /// and reset paths get exercised. Abort completes one with Command
    /// Abort Requested; a controller reset drops them.
    NeverComplete,
    /// The LBA range of the namespace fails reads with Unrecovered Read
    /// Error until it is written (as Write Uncorrectable marks it).
    MediaError,
    /// The namespace answers I/O with Namespace Not Ready (DNR = 0) and
    /// shows NSTAT not ready for this long, then announces itself ready
    /// with a Namespace Attribute Changed event.
    NotReady(Duration),
    /// SMART / Health critical warning bits (log page 02h byte 0) raised,
    /// with a SMART / Health asynchronous event where the host enabled it.
    SmartWarning(u8),
    /// Power loss: every write the volatile write cache holds (since the
    /// last Flush) is dropped, then the controller goes through a reset as
    /// after power returns (CSTS.CFS until the host resets it).
    PowerLoss,
    /// A path fails: ANA groups of one controller of the subsystem go to a
    /// state (an ANA Change notice to its host), and back to what they were
    /// after the duration, if given and nobody changed them meanwhile.
    Ana(AnaFault),
}

/// The path an [`FaultKind::Ana`] fault fails, and for how long.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AnaFault {
    /// CNTLID: 1, 2, ... in the order of the server's `--socket`.
    pub controller: u16,
    /// ANA group (= NSID); `None`: every group.
    pub group: Option<u32>,
    pub state: AnaState,
    /// `None`: the state stays until set again.
    pub duration: Option<Duration>,
}

impl FaultKind {
    /// The name used by the control socket and the configuration.
    pub fn name(&self) -> &'static str {
        match self {
            FaultKind::Latency(_) => "latency",
            FaultKind::Status(_) => "status",
            FaultKind::NeverComplete => "never-complete",
            FaultKind::MediaError => "media-error",
            FaultKind::NotReady(_) => "not-ready",
            FaultKind::SmartWarning(_) => "smart-warning",
            FaultKind::PowerLoss => "power-loss",
            FaultKind::Ana(_) => "ana",
        }
    }

    /// A rule matched against commands (else a one-time change of state).
    pub fn is_command_fault(&self) -> bool {
        matches!(
            self,
            FaultKind::Latency(_) | FaultKind::Status(_) | FaultKind::NeverComplete
        )
    }
}

/// A fault as asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultSpec {
    pub kind: FaultKind,
    /// The namespace (`None`: every namespace; required by the state
    /// faults that concern one).
    pub nsid: Option<u32>,
    /// I/O opcodes it applies to (empty: every one).
    pub opcodes: Vec<u8>,
    /// First LBA and number of blocks (`None`: anywhere). A command
    /// without an LBA range (Flush, Dataset Management) never matches a
    /// rule that has one.
    pub lba: Option<(u64, u64)>,
    /// Chance that a matching command is hit, 0 to 1.
    pub probability: f64,
    /// Hits left (`None`: no limit); the rule goes away at 0.
    pub count: Option<u64>,
}

impl FaultSpec {
    /// A fault of `kind` on every command, always, without limit.
    pub fn new(kind: FaultKind) -> Self {
        Self {
            kind,
            nsid: None,
            opcodes: Vec::new(),
            lba: None,
            probability: 1.0,
            count: None,
        }
    }

    /// Checks what no fault may be: a probability outside 0..=1, an
    /// empty LBA range, a latency past [`MAX_LATENCY`], a state fault
    /// without the namespace it needs.
    pub fn validate(&self) -> Result<(), FaultError> {
        if !(0.0..=1.0).contains(&self.probability) {
            return Err(FaultError::Probability(self.probability));
        }
        if let Some((_, 0)) = self.lba {
            return Err(FaultError::EmptyRange);
        }
        if self.count == Some(0) {
            return Err(FaultError::ZeroCount);
        }
        if self.nsid == Some(0) || self.nsid == Some(u32::MAX) {
            return Err(FaultError::Nsid);
        }
        match &self.kind {
            FaultKind::Latency(l) => l.check(),
            FaultKind::MediaError if self.lba.is_none() || self.nsid.is_none() => {
                Err(FaultError::NeedsRange)
            }
            FaultKind::NotReady(d) if self.nsid.is_none() || *d > MAX_LATENCY => {
                Err(FaultError::NotReady)
            }
            FaultKind::SmartWarning(0) => Err(FaultError::NoWarning),
            FaultKind::Ana(a) if a.duration.is_some_and(|d| d > MAX_LATENCY) => {
                Err(FaultError::AnaDuration)
            }
            _ => Ok(()),
        }
    }
}

/// Why a fault was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FaultError {
    #[error("probability {0} is outside 0 to 1")]
    Probability(f64),
    #[error("the LBA range is empty: give at least one block")]
    EmptyRange,
    #[error("count 0 would never fire: leave it out for no limit")]
    ZeroCount,
    #[error("nsid must be 1 to 4294967294")]
    Nsid,
    #[error("latency must be at most 3600 s, with min <= max")]
    Latency,
    #[error("a media error needs a namespace (nsid) and an LBA range")]
    NeedsRange,
    #[error("not-ready needs a namespace (nsid) and a duration of at most 3600 s")]
    NotReady,
    #[error("a SMART warning needs at least one critical warning bit")]
    NoWarning,
    #[error("an ana fault lasts at most 3600 s (leave duration out for a state that stays)")]
    AnaDuration,
    /// The ANA state could not be set (the reason, from `ana_set`).
    #[error("{0}")]
    Ana(String),
    #[error("at most {MAX_FAULTS} command faults at once: clear some first")]
    TooMany,
    #[error("namespace {0} does not exist")]
    NoNamespace(u32),
    #[error("the LBA range is past the end of namespace {0}")]
    OutOfRange(u32),
    #[error("power loss needs an enabled controller with a client attached")]
    NotEnabled,
    #[error("{0}")]
    Media(String),
    #[error("no attached namespace has a volatile write cache that can lose writes: give a ram namespace the vwc option")]
    NoVolatileCache,
    #[error("a {0} fault is a change of state, not a rule with an id: add it on each controller")]
    NotCommand(&'static str),
}

/// A command fault in the table: its id and what is left of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub id: u64,
    pub spec: FaultSpec,
    /// Times it fired.
    pub hits: u64,
}

/// What a rule does to a command it hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hit {
    /// Start it this much later.
    Delay(Duration),
    /// Complete it at once with this status.
    Fail(Status),
    /// Never complete it.
    Hang,
}

/// A command a rule holds back, as its worker keeps it.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub cmd: Command,
    pub sqid: u16,
    pub sq_instance: u64,
    pub cqid: u16,
    pub cq_instance: u64,
    /// When it runs; `None`: never (until aborted).
    pub due: Option<Instant>,
    /// Held by a limit ([`crate::qos`]), not a fault.
    pub throttled: Option<crate::qos::Throttled>,
    /// A Preempt and Abort that ran, its completion waiting for this
    /// fence, not a fault.
    pub fence: Option<Arc<dyn Gate>>,
}

/// What a held command waits for besides its time: the fence of a
/// Preempt and Abort, which completes once the commands admitted on its
/// namespace before it are done (the namespace's reservations keep it;
/// this module sits below them).
pub(crate) trait Gate: std::fmt::Debug + Send + Sync {
    /// Whether the command may complete now.
    fn open(&self) -> bool;
}

/// The controller's faults.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    /// Some command rule is armed (changed under the `rules` lock).
    armed: AtomicBool,
    rules: Mutex<Rules>,
    /// Namespaces not ready until then.
    not_ready: Mutex<BTreeMap<u32, Instant>>,
    /// `not_ready` has an entry (changed under its lock): every I/O command
    /// asks, and with none it pays one relaxed load, no lock, no clock.
    any_not_ready: AtomicBool,
    /// SMART critical warning bits raised.
    pub smart_warning: AtomicU8,
    /// (sqid, cid) of commands held back, and whether Abort asked for one.
    held: Mutex<BTreeMap<(u16, u16), bool>>,
    /// Held commands of workers that stopped without a reset (a pause):
    /// the next workers take them back.
    parked: Mutex<Vec<Held>>,
}

#[derive(Debug, Default)]
struct Rules {
    list: Vec<Fault>,
    rng: Rng,
}

impl Faults {
    /// Adds a command fault with `id`, which the subsystem gives out (one
    /// fault armed on several of its controllers has one id).
    pub fn add(&self, spec: FaultSpec, id: u64) -> Result<u64, FaultError> {
        spec.validate()?;
        let mut rules = self.rules.lock();
        if rules.list.len() >= MAX_FAULTS {
            return Err(FaultError::TooMany);
        }
        rules.list.push(Fault { id, spec, hits: 0 });
        self.armed.store(true, Ordering::Relaxed);
        Ok(id)
    }

    /// The command faults armed now.
    pub fn list(&self) -> Vec<Fault> {
        self.rules.lock().list.clone()
    }

    /// Removes fault `id` (`None`: every command fault, and the state
    /// faults' leftovers: not-ready periods and warning bits). Returns how
    /// many command faults went.
    pub fn clear(&self, id: Option<u64>) -> usize {
        let mut rules = self.rules.lock();
        let before = rules.list.len();
        match id {
            Some(id) => rules.list.retain(|f| f.id != id),
            None => {
                rules.list.clear();
                let mut not_ready = self.not_ready.lock();
                not_ready.clear();
                self.any_not_ready.store(false, Ordering::Relaxed);
                self.smart_warning.store(0, Ordering::Relaxed);
            }
        }
        self.armed.store(!rules.list.is_empty(), Ordering::Relaxed);
        before - rules.list.len()
    }

    /// What the first rule that hits I/O command `cmd` does to it, if any.
    #[inline]
    pub fn on_command(&self, cmd: &Command) -> Option<Hit> {
        if !self.armed.load(Ordering::Relaxed) {
            return None;
        }
        self.match_rules(cmd)
    }

    fn match_rules(&self, cmd: &Command) -> Option<Hit> {
        let range = lba_range(cmd);
        let mut rules = self.rules.lock();
        let Rules { list, rng, .. } = &mut *rules;
        let index = list.iter().position(|f| {
            f.spec.matches(cmd, range)
                && (f.spec.probability >= 1.0 || rng.unit() < f.spec.probability)
        })?;
        let fault = list.get_mut(index)?;
        fault.hits = fault.hits.saturating_add(1);
        let hit = match &fault.spec.kind {
            FaultKind::Latency(l) => Hit::Delay(l.sample(rng)),
            FaultKind::Status(s) => Hit::Fail(*s),
            _ => Hit::Hang,
        };
        if let Some(left) = fault.spec.count.as_mut() {
            *left = left.saturating_sub(1);
            if *left == 0 {
                list.remove(index);
                self.armed.store(!list.is_empty(), Ordering::Relaxed);
            }
        }
        Some(hit)
    }

    /// Namespace `nsid` is not ready until `until`.
    pub fn set_not_ready(&self, nsid: u32, until: Instant) {
        let mut map = self.not_ready.lock();
        map.insert(nsid, until);
        self.any_not_ready.store(true, Ordering::Relaxed);
    }

    /// Whether a not-ready fault holds namespace `nsid` at `now`.
    pub fn not_ready(&self, nsid: u32, now: impl FnOnce() -> Instant) -> bool {
        if !self.any_not_ready.load(Ordering::Relaxed) {
            return false;
        }
        let mut map = self.not_ready.lock();
        match map.get(&nsid) {
            Some(&until) if now() < until => true,
            Some(_) => {
                map.remove(&nsid);
                self.any_not_ready.store(!map.is_empty(), Ordering::Relaxed);
                false
            }
            None => false,
        }
    }

    /// NSIDs not ready at `now`.
    pub fn not_ready_list(&self, now: Instant) -> Vec<u32> {
        let map = self.not_ready.lock();
        map.iter()
            .filter(|(_, &until)| now < until)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Registers a held command; false if too many are held already (the
    /// command then runs as if no rule had hit it).
    pub fn hold(&self, sqid: u16, cid: u16) -> bool {
        let mut held = self.held.lock();
        if held.len() >= MAX_HELD {
            return false;
        }
        held.insert((sqid, cid), false);
        true
    }

    /// Abort asks for held command `cid` of `sqid`: true if it is held.
    pub fn abort(&self, sqid: u16, cid: u16) -> bool {
        match self.held.lock().get_mut(&(sqid, cid)) {
            Some(aborted) => {
                *aborted = true;
                true
            }
            None => false,
        }
    }

    /// The worker lets held command `cid` of `sqid` go: whether Abort asked
    /// for it.
    pub fn release(&self, sqid: u16, cid: u16) -> bool {
        self.held.lock().remove(&(sqid, cid)).unwrap_or(false)
    }

    /// Whether Abort asked for held command `cid` of `sqid`.
    pub fn abort_requested(&self, sqid: u16, cid: u16) -> bool {
        self.held.lock().get(&(sqid, cid)).copied().unwrap_or(false)
    }

    /// A controller reset dropped every held command.
    pub fn reset(&self) {
        self.held.lock().clear();
        self.parked.lock().clear();
    }

    /// A stopping worker leaves its held commands for the next one (a
    /// reset drops them).
    pub fn park(&self, held: Vec<Held>) {
        if !held.is_empty() {
            self.parked.lock().extend(held);
        }
    }

    /// The parked commands, as they are (an upgrade lists them).
    pub fn parked(&self) -> Vec<Held> {
        self.parked.lock().clone()
    }

    /// A starting worker takes the parked commands `mine` picks.
    pub fn adopt(&self, mine: impl Fn(&Held) -> bool) -> Vec<Held> {
        let mut parked = self.parked.lock();
        let (taken, left) = std::mem::take(&mut *parked).into_iter().partition(mine);
        *parked = left;
        taken
    }
}

impl FaultSpec {
    fn matches(&self, cmd: &Command, range: Option<(u64, u64)>) -> bool {
        if !self.kind.is_command_fault() {
            return false;
        }
        if self.nsid.is_some_and(|n| n != cmd.nsid.get()) {
            return false;
        }
        if !self.opcodes.is_empty() && !self.opcodes.contains(&cmd.opcode()) {
            return false;
        }
        match (self.lba, range) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some((start, n)), Some((slba, nlb))) => {
                slba < start.saturating_add(n) && start < slba.saturating_add(nlb)
            }
        }
    }
}

/// The blocks an I/O command names: SLBA (CDW10-11) and NLB (CDW12 15:0,
/// 0's based) for the commands that carry them.
fn lba_range(cmd: &Command) -> Option<(u64, u64)> {
    let op = NvmOpcode(cmd.opcode());
    let with_range = [
        NvmOpcode::READ,
        NvmOpcode::WRITE,
        NvmOpcode::COMPARE,
        NvmOpcode::WRITE_ZEROES,
        NvmOpcode::WRITE_UNCORRECTABLE,
        NvmOpcode::VERIFY,
    ];
    if !with_range.contains(&op) {
        return None;
    }
    let slba = u64::from(cmd.cdw10.get()) | (u64::from(cmd.cdw11.get()) << 32);
    let nlb = u64::from(cmd.cdw12.get() & 0xFFFF) + 1;
    Some((slba, nlb))
}

/// xorshift64*: a probability and latency source, seeded from the clock
/// (faults need to be unpredictable to the host, not cryptographic).
#[derive(Debug)]
struct Rng(u64);

impl Default for Rng {
    fn default() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Self(nanos | 1)
    }
}

impl Rng {
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::little_endian::U32;

    fn read(nsid: u32, slba: u64, nlb: u16) -> Command {
        Command {
            cdw0: U32::new(u32::from(NvmOpcode::READ.0)),
            nsid: U32::new(nsid),
            cdw10: U32::new(slba as u32),
            cdw11: U32::new((slba >> 32) as u32),
            cdw12: U32::new(u32::from(nlb.saturating_sub(1))),
            ..Command::default()
        }
    }

    #[test]
    fn rule_matches_namespace_opcode_and_overlapping_range_only() {
        let f = Faults::default();
        let mut spec = FaultSpec::new(FaultKind::Status(Status::INTERNAL_ERROR));
        spec.nsid = Some(1);
        spec.opcodes = vec![NvmOpcode::READ.0];
        spec.lba = Some((100, 10));
        f.add(spec, 1).unwrap();
        assert_eq!(f.on_command(&read(1, 90, 10)), None, "ends at 99");
        assert_eq!(f.on_command(&read(2, 100, 1)), None, "other namespace");
        let mut write = read(1, 100, 1);
        write.cdw0 = U32::new(u32::from(NvmOpcode::WRITE.0));
        assert_eq!(f.on_command(&write), None, "other opcode");
        assert_eq!(
            f.on_command(&read(1, 95, 6)),
            Some(Hit::Fail(Status::INTERNAL_ERROR))
        );
        assert_eq!(
            f.on_command(&read(1, 109, 100)),
            Some(Hit::Fail(Status::INTERNAL_ERROR))
        );
        assert_eq!(f.list()[0].hits, 2);
    }

    #[test]
    fn count_removes_the_rule_when_spent() {
        let f = Faults::default();
        let mut spec = FaultSpec::new(FaultKind::NeverComplete);
        spec.count = Some(2);
        f.add(spec, 1).unwrap();
        assert_eq!(f.on_command(&read(1, 0, 1)), Some(Hit::Hang));
        assert_eq!(f.on_command(&read(1, 0, 1)), Some(Hit::Hang));
        assert_eq!(f.on_command(&read(1, 0, 1)), None);
        assert!(f.list().is_empty());
    }

    #[test]
    fn probability_zero_never_fires_and_half_fires_about_half() {
        let f = Faults::default();
        let mut spec = FaultSpec::new(FaultKind::Status(Status::INTERNAL_ERROR));
        spec.probability = 0.0;
        let id = f.add(spec.clone(), 1).unwrap();
        assert!((0..1000).all(|_| f.on_command(&read(1, 0, 1)).is_none()));
        f.clear(Some(id));
        spec.probability = 0.5;
        f.add(spec, 2).unwrap();
        let hits = (0..10_000)
            .filter(|_| f.on_command(&read(1, 0, 1)).is_some())
            .count();
        assert!((4000..6000).contains(&hits), "{hits} of 10000");
    }

    #[test]
    fn latency_samples_stay_within_their_bounds() {
        let mut rng = Rng::default();
        let l = Latency::Uniform(Duration::from_millis(5), Duration::from_millis(10));
        for _ in 0..1000 {
            let d = l.sample(&mut rng);
            assert!(d >= Duration::from_millis(5) && d <= Duration::from_millis(10));
        }
        let e = Latency::Exponential(Duration::from_millis(1));
        let mean = (0..10_000)
            .map(|_| e.sample(&mut rng).as_secs_f64())
            .sum::<f64>()
            / 10_000.0;
        assert!((0.0008..0.0012).contains(&mean), "mean {mean}");
    }

    #[test]
    fn invalid_specs_are_refused_with_the_reason() {
        let mut s = FaultSpec::new(FaultKind::MediaError);
        assert_eq!(s.validate(), Err(FaultError::NeedsRange));
        s.kind = FaultKind::Status(Status::INTERNAL_ERROR);
        s.probability = 1.5;
        assert_eq!(s.validate(), Err(FaultError::Probability(1.5)));
        s.probability = 1.0;
        s.lba = Some((0, 0));
        assert_eq!(s.validate(), Err(FaultError::EmptyRange));
        s.lba = None;
        s.kind = FaultKind::Latency(Latency::Uniform(
            Duration::from_secs(2),
            Duration::from_secs(1),
        ));
        assert_eq!(s.validate(), Err(FaultError::Latency));
    }

    #[test]
    fn table_is_bounded() {
        let f = Faults::default();
        for id in 0..MAX_FAULTS as u64 {
            f.add(FaultSpec::new(FaultKind::NeverComplete), id).unwrap();
        }
        assert_eq!(
            f.add(FaultSpec::new(FaultKind::NeverComplete), 0),
            Err(FaultError::TooMany)
        );
        assert_eq!(f.clear(None), MAX_FAULTS);
        assert!(f.on_command(&read(1, 0, 1)).is_none());
    }
}
