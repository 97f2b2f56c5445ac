//! The controller's interrupts: the one place that decides whether a CQ's
//! posted entries get an interrupt now, later or not at all, and raises it.
//!
//! The decision, in order: a CQ with interrupts disabled (IEN clear) never
//! signals; the admin CQ and a vector with coalescing disabled (Interrupt
//! Vector Configuration, feature 09h) signal at once; with Interrupt
//! Coalescing (feature 08h) TIME set, the interrupt waits for THR entries or
//! TIME (§5.27.1.6); else a slow host's interrupt waits while it fills its
//! queue ([`crate::irq_batch`]). Without MSI-X, the INTMS mask holds a
//! raised interrupt back until INTMC unmasks it.
//!
//! What is what, for a save and restore of the controller:
//! * configuration: whether interrupt batching is on (`--batch-interrupts`);
//! * guest-visible state: the INTMS/INTMC mask, the Interrupt Coalescing
//!   value and each vector's Coalescing Disable bit (features 08h and 09h,
//!   back to defaults at a controller reset);
//! * transient: an INTx interrupt held by the mask (signalled at unmask),
//!   and each CQ's pending count, its oldest pending entry's time and its
//!   host's learned pace ([`Cq::batch`]), all of which a restore may drop
//!   by raising every CQ's interrupt once.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use vnvme_spec::feature::InterruptCoalescing;

use crate::config::ControllerConfig;
use crate::memory::InterruptSink;
use crate::queue::Cq;
use crate::stats::Stats;

mod saved;
pub(crate) use saved::SavedInterrupts;

/// The controller-wide interrupt state (a field of the shared state; every
/// value an atomic, read by the workers on each pass).
#[derive(Debug)]
pub(crate) struct Interrupts {
    /// Interrupt batching on (configuration).
    batching: bool,
    /// Interrupt mask (INTMS) for non-MSI-X interrupts, bit per vector.
    intm: AtomicU32,
    /// An interrupt was held back by the mask.
    intx_held: AtomicBool,
    /// Interrupt Coalescing feature value (THR 7:0, TIME 15:8).
    coalescing: AtomicU32,
    /// Interrupt Vector Configuration: coalescing disabled, per vector.
    coalescing_disabled: Vec<AtomicBool>,
}

/// What interrupt batching makes of a pending interrupt.
enum Batched {
    Raise,
    /// The host is still filling its queue.
    Hold,
    /// The host has reaped every entry posted (while its interrupt was
    /// held): nothing is left to signal.
    Reaped,
}

impl Interrupts {
    pub fn new(config: &ControllerConfig) -> Self {
        Self {
            batching: config.batch_interrupts,
            intm: AtomicU32::new(0),
            intx_held: AtomicBool::new(false),
            coalescing: AtomicU32::new(0),
            coalescing_disabled: (0..config.msix_vectors)
                .map(|_| AtomicBool::new(false))
                .collect(),
        }
    }

    /// Controller reset: coalescing back to its defaults, no interrupt held
    /// (the mask is a register: the register file resets it).
    pub fn reset(&self) {
        self.coalescing.store(0, Ordering::Relaxed);
        for cd in &self.coalescing_disabled {
            cd.store(false, Ordering::Relaxed);
        }
        self.intx_held.store(false, Ordering::Relaxed);
    }

    /// The Interrupt Coalescing feature value (Get Features 08h).
    pub fn coalescing(&self) -> u32 {
        self.coalescing.load(Ordering::Relaxed)
    }

    /// Set Features 08h: THR and TIME; the reserved bits are not kept.
    pub fn set_coalescing(&self, ic: InterruptCoalescing) {
        let kept = InterruptCoalescing::new()
            .with_thr_z(ic.thr_z())
            .with_time(ic.time());
        self.coalescing.store(kept.into(), Ordering::Relaxed);
    }

    /// Vector `iv`'s Coalescing Disable bit, `None` past the last vector.
    pub fn coalescing_disabled(&self, iv: u16) -> Option<bool> {
        let cd = self.coalescing_disabled.get(usize::from(iv))?;
        Some(cd.load(Ordering::Relaxed))
    }

    /// Sets vector `iv`'s Coalescing Disable bit; `None` past the last
    /// vector.
    pub fn set_coalescing_disabled(&self, iv: u16, cd: bool) -> Option<()> {
        let slot = self.coalescing_disabled.get(usize::from(iv))?;
        slot.store(cd, Ordering::Relaxed);
        Some(())
    }

    /// Aggregation Time of the Interrupt Coalescing feature.
    pub fn aggregation_time(&self) -> Duration {
        let c = self.coalescing();
        Duration::from_micros(u64::from((c >> 8) & 0xFF) * 100)
    }

    /// INTMS as the register file holds it now.
    pub fn set_mask(&self, intm: u32) {
        self.intm.store(intm, Ordering::Release);
    }

    /// Whether INTMS masks vector `iv` (meaningful without MSI-X only).
    pub fn masked(&self, iv: u16) -> bool {
        self.intm.load(Ordering::Acquire) & (1u32 << (iv & 31)) != 0
    }

    /// INTMC unmasked: whether an interrupt was held back meanwhile (then
    /// it is signalled now, and no longer held).
    pub fn take_held(&self) -> bool {
        self.intx_held.swap(false, Ordering::AcqRel)
    }

    /// A pass fetched commands that complete on `cq`: what batching learns
    /// of its host's pace.
    pub fn fetched(&self, cq: &mut Cq, now: Instant) {
        if self.batching {
            cq.batch.fetched(now);
        }
    }

    /// When the worker should look again at the CQs in `timers` (their
    /// interrupts waiting), each read through `deadline_of`.
    pub fn next_deadline(
        &self,
        timers: &[u16],
        deadline_of: impl Fn(u16) -> Option<Instant>,
    ) -> Option<Instant> {
        if timers.is_empty() {
            return None;
        }
        let time = self.aggregation_time();
        if time.is_zero() {
            // Batched interrupts: the earliest CQ's.
            return timers.iter().filter_map(|&cqid| deadline_of(cqid)).min();
        }
        // Coarse: wake after one aggregation time and re-check every CQ.
        Some(Instant::now() + time.max(Duration::from_micros(50)))
    }

    /// When `cq`'s held interrupt is next worth a look (batching).
    pub fn deadline(cq: &Cq) -> Option<Instant> {
        Some(cq.batch.deadline(cq.irq_since?))
    }

    /// Raises `cq`'s interrupt now or leaves it for later (§5.27.1.6).
    /// Returns `true` when nothing is left pending. `refresh_head` re-reads
    /// the CQ head from its doorbell source (batching asks whether the host
    /// reaped already). The clock is read only for a coalesced interrupt:
    /// this runs after every pass, idle polls included.
    pub fn settle(
        &self,
        cq: &mut Cq,
        sink: &dyn InterruptSink,
        stats: &Stats,
        refresh_head: impl FnOnce(&mut Cq),
    ) -> bool {
        if cq.irq_pending == 0 {
            return true;
        }
        let c = self.coalescing();
        let thr_z = c & 0xFF;
        let time = self.aggregation_time();
        let exempt = cq.qid == 0 || self.coalescing_disabled(cq.iv) == Some(true);
        let due = if exempt {
            true
        } else if time.is_zero() {
            match self.batched(cq, refresh_head) {
                Batched::Raise => true,
                Batched::Hold => false,
                Batched::Reaped => {
                    cq.irq_pending = 0;
                    cq.irq_since = None;
                    return true;
                }
            }
        } else {
            cq.irq_pending > thr_z || cq.irq_since.is_none_or(|t| t.elapsed() >= time)
        };
        if due {
            self.raise(cq, sink, stats);
        }
        due
    }

    fn batched(&self, cq: &mut Cq, refresh_head: impl FnOnce(&mut Cq)) -> Batched {
        let Some(since) = cq.irq_since else {
            return Batched::Raise;
        };
        if !self.batching || !cq.ien || !cq.batch.slow() {
            return Batched::Raise;
        }
        refresh_head(cq);
        if cq.head == cq.tail {
            return Batched::Reaped;
        }
        if cq.batch.hold(cq.outstanding(), since, Instant::now()) {
            Batched::Hold
        } else {
            Batched::Raise
        }
    }

    /// Signals `cq`'s vector (unless IEN is clear, or INTMS masks it
    /// without MSI-X: then it is held until unmasked) and counts it.
    pub fn raise(&self, cq: &mut Cq, sink: &dyn InterruptSink, stats: &Stats) {
        cq.irq_pending = 0;
        cq.irq_since = None;
        if !cq.ien {
            return;
        }
        if !sink.msix_enabled() && self.masked(cq.iv) {
            self.intx_held.store(true, Ordering::Release);
            return;
        }
        sink.signal(cq.iv);
        if let Some(q) = stats.queue(cq.qid) {
            q.interrupts.fetch_add(1, Ordering::Relaxed);
        }
    }
}
