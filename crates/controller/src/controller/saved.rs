//! Saving and restoring the whole controller (docs/state-format.md): the
//! pause that makes a save consistent, the save that asks every part for
//! its saved form, and the restore that builds a controller from its
//! configuration and puts each part back before any worker runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vnvme_spec::regs::{shutdown, Doorbell};

use super::{handed, Control, Controller};
use crate::background::SavedBackground;
use crate::config::{ControllerConfig, NamespaceConfig};
use crate::doorbell::DoorbellPage;
use crate::keep_alive::KeepAlive;
use crate::memory::{GuestMemory, InterruptSink};
use crate::queue::Limits;
use crate::regs::Regs;
use crate::saved_check::{inconsistent, same};
use crate::saved_state::{SavedState, StateBody, StateError};
use crate::state::{Session, ACL};
use crate::PollGroups;

impl Controller {
    /// Reports queue positions, admin commands and zones to `record` from
    /// now on (`vnvme serve --supervise`); a controller without one pays
    /// nothing. Set once: a second call is ignored (and says so). Each
    /// zoned namespace's zones are all stored now.
    pub fn record_crash_state(&self, record: Arc<dyn crate::crash_record::CrashRecord>) -> bool {
        if self.shared.crash.set(record.clone()).is_err() {
            return false;
        }
        let (rerun, (head, tail)) = self.shared.queues.owed.waiting();
        if !rerun.is_empty() {
            // In flight in the record (whose keeper voided the dead
            // child's entries) before the admin worker, which waited for
            // the record, runs them: a kill before it owes them finds
            // them kept to run again.
            let pos = crate::crash_record::SqPosition { head, tail };
            for cmd in &rerun {
                record.admin_command(cmd.cid(), head, zerocopy::transmute_ref!(cmd));
                record.fetched(0, cmd.cid(), pos);
            }
            self.shared.kick_sq(0);
        }
        for ns in self.shared.subsystem.namespaces.allocated_list() {
            if let Some(zones) = &ns.zones {
                zones.record_to(
                    record.clone() as Arc<dyn crate::crash_record::ZoneRecorder>,
                    ns.nsid,
                );
            }
        }
        true
    }

    /// Lets the queue workers post every completion owed so far (under a
    /// crash record, an admin command's completion waits until the state
    /// holding its effect is kept: `queue::owed`): the keeper
    /// calls it once the crash area's slot is written, or when a
    /// checkpoint failed (the guest does not wait on a slot that may not
    /// come). Each SQ with one is looked at. Returns how many were
    /// released.
    pub fn release_owed(&self) -> usize {
        let owed = &self.shared.queues.owed;
        let before = owed.released();
        let sqs = owed.release_all();
        for qid in sqs {
            self.shared.kick_sq(qid);
        }
        owed.released() - before
    }

    /// Stops the queue workers between two commands: when it returns, no
    /// worker runs, every command fetched has completed or waits on an
    /// asynchronous backend (then [`save_state`](Self::save_state) says
    /// so), and doorbell writes are kept for [`resume`](Self::resume).
    /// The keep alive timer stops with them, and so does a sanitize's
    /// thread, between two steps (it goes on from there when the pause
    /// ends, or in the controller a saved state restores). Register
    /// accesses still work; a reset or an enable meanwhile ends the pause.
    pub fn pause(&self) {
        // Before the control lock: the thread's end reports may take locks
        // a holder of it takes too.
        self.shared.sanitize().task.stop();
        let mut ctl = self.control.lock();
        if !ctl.has_workers() {
            return;
        }
        self.stop_workers(&mut ctl);
        ctl.paused = true;
    }

    /// Starts the workers [`pause`](Self::pause) stopped: they look at
    /// every queue once (doorbells written meanwhile included) and raise
    /// the interrupt of every CQ holding entries (a coalescing timer
    /// pending at the pause is gone). Nothing if not paused.
    pub fn resume(&self) -> Result<(), StateError> {
        crate::admin::resume_sanitize(&self.shared);
        let mut ctl = self.control.lock();
        let Some(session) = ctl.session.clone().filter(|_| ctl.paused) else {
            return Ok(());
        };
        self.run(&mut ctl, &session)
    }

    /// As [`pause`](Self::pause), but each worker first lets the commands
    /// it has in flight on a backend complete, for at most `bound` (a live
    /// upgrade's bounded drain). A command still in flight after it makes
    /// [`save_state`](Self::save_state) refuse.
    pub fn pause_draining(&self, bound: Duration) {
        *self.shared.queues.drain_until.lock() = Some(Instant::now() + bound);
        self.pause();
        *self.shared.queues.drain_until.lock() = None;
    }

    /// Whether [`pause`](Self::pause) holds the workers.
    pub fn is_paused(&self) -> bool {
        self.control.lock().paused
    }

    /// The controller's state (docs/state-format.md). Only at a quiescent
    /// point: paused (or with no worker running: disabled or shut down),
    /// no command in flight on a backend, no sanitize or self-test running.
    pub fn save_state(&self) -> Result<SavedState, StateError> {
        self.save_with(false)
    }

    /// As [`save_state`](Self::save_state) for a live upgrade: the
    /// commands held back (a QoS limit, a fault's delay or
    /// never-complete, a Preempt and Abort's fence: fetched, and not
    /// given to a backend) do not keep it from saving; they are in
    /// [`SavedState::handed`], for the new process
    /// ([`restore`](Self::restore) holds them again). Commands on a
    /// backend still refuse it.
    pub fn save_state_handing(&self) -> Result<SavedState, StateError> {
        self.save_with(true)
    }

    fn save_with(&self, handing: bool) -> Result<SavedState, StateError> {
        let ctl = self.control.lock();
        if !ctl.paused && ctl.has_workers() {
            return Err(StateError::NotPaused);
        }
        let shared = &*self.shared;
        let now = Instant::now();
        let (held, handed) = match handing {
            true => handed::list(&shared.faults, &shared.queues, now)?,
            false => (Vec::new(), Vec::new()),
        };
        let queues = shared.queues.save(&held).map_err(StateError::Busy)?;
        let background = SavedBackground::save(shared.sanitize(), &shared.self_test)
            .map_err(StateError::BackgroundBusy)?;
        let body = StateBody {
            regs: ctl.regs.save(now),
            clean_shutdown: ctl.clean_shutdown,
            lifecycle: shared.lifecycle.save(now),
            interrupts: shared.interrupts.save(),
            features: shared.features.save(),
            reporting: shared.reporting.save(now),
            queues,
            doorbells: shared.doorbells.save(),
            subsystem: shared.subsystem.save(now),
            background,
        };
        Ok(SavedState {
            body,
            handed,
            // Waiting for their first pass: a keeper records them in
            // flight again with this state (`SavedState::rerun_commands`).
            rerun: shared.queues.owed.waiting().0,
        })
    }

    /// A controller of `config` and `namespaces` (their backends: the
    /// saved namespaces reattach to them, see docs/state-format.md) in the
    /// state `state`, attached to the client's `mem` and `irq`. If the
    /// saved controller was running, the workers resume its queues where
    /// they were. A state that does not fit the configuration is refused
    /// with what differs, and nothing runs.
    pub fn restore(
        config: ControllerConfig,
        namespaces: Vec<NamespaceConfig>,
        state: &SavedState,
        mem: Arc<dyn GuestMemory>,
        irq: Arc<dyn InterruptSink>,
    ) -> Result<Self, StateError> {
        Self::restore_with_doorbell_page(config, namespaces, None, state, mem, irq)
    }

    /// As [`restore`](Self::restore), with the doorbell page of
    /// [`with_doorbell_page`](Self::with_doorbell_page).
    pub fn restore_with_doorbell_page(
        config: ControllerConfig,
        namespaces: Vec<NamespaceConfig>,
        page: Option<Arc<dyn DoorbellPage>>,
        state: &SavedState,
        mem: Arc<dyn GuestMemory>,
        irq: Arc<dyn InterruptSink>,
    ) -> Result<Self, StateError> {
        Self::restore_with_poll_groups(config, namespaces, page, None, state, mem, irq)
    }

    /// As [`restore_with_doorbell_page`](Self::restore_with_doorbell_page),
    /// its workers members of `groups` (see
    /// [`with_poll_groups`](Self::with_poll_groups)).
    pub fn restore_with_poll_groups(
        config: ControllerConfig,
        mut namespaces: Vec<NamespaceConfig>,
        page: Option<Arc<dyn DoorbellPage>>,
        groups: Option<PollGroups>,
        state: &SavedState,
        mem: Arc<dyn GuestMemory>,
        irq: Arc<dyn InterruptSink>,
    ) -> Result<Self, StateError> {
        // The zones come from the state: cutting them anew would discard
        // the backend's data (a new zoned namespace starts empty).
        for ns in &mut namespaces {
            ns.zoned = None;
        }
        let ctrl = Self::with_poll_groups(config, namespaces, page, groups)?;
        ctrl.restore_onto(state, mem, irq, true)
    }

    /// Another controller of `first`'s subsystem, restored from `state`:
    /// `first` was restored (or given the subsystem's shared parts with
    /// [`restore_subsystem`](Self::restore_subsystem)) from a state saved
    /// at the same pause, so the namespaces, their attachment to every
    /// controller, the reservations and ANA states are there already;
    /// this controller takes its own parts from `state`, which must agree
    /// with them.
    #[allow(clippy::too_many_arguments)]
    pub fn restore_joining(
        first: &Controller,
        config: ControllerConfig,
        page: Option<Arc<dyn DoorbellPage>>,
        groups: Option<PollGroups>,
        state: &SavedState,
        mem: Arc<dyn GuestMemory>,
        irq: Arc<dyn InterruptSink>,
    ) -> Result<Self, StateError> {
        let ctrl = Self::joining_as_saved(first, config, page, groups)?;
        ctrl.restore_onto(state, mem, irq, false)
    }

    /// The subsystem's shared parts of `state` (the namespaces with their
    /// formats, attachment to every controller and reservations; the ANA
    /// states; this controller's Changed Namespace List and firmware) on
    /// this new controller, which serves no client: a live upgrade's
    /// first controller when its client had not connected. Only before
    /// the controller is enabled, and before others join it.
    pub fn restore_subsystem(&self, state: &SavedState) -> Result<(), StateError> {
        let ctl = self.control.lock();
        if ctl.has_workers() {
            return Err(StateError::NotPaused);
        }
        self.shared
            .subsystem
            .restore(&state.body.subsystem, Instant::now())?;
        Ok(())
    }

    /// Puts `state` back on this new controller, attached to `mem` and
    /// `irq`: every part, the subsystem's shared ones too if `whole`
    /// (else only this controller's, see
    /// [`restore_joining`](Self::restore_joining)).
    fn restore_onto(
        self,
        state: &SavedState,
        mem: Arc<dyn GuestMemory>,
        irq: Arc<dyn InterruptSink>,
        whole: bool,
    ) -> Result<Self, StateError> {
        let ctrl = self;
        ctrl.attach(Arc::clone(&mem), irq);
        let body = &state.body;
        let now = Instant::now();
        let shared = &*ctrl.shared;
        let regs = Regs::restored(&shared.config, &body.regs, now)?;
        check_admin_queues(&regs, body)?;
        shared.lifecycle.restore(&body.lifecycle, now)?;
        shared.interrupts.restore(&body.interrupts, regs.intm)?;
        shared.features.restore(&shared.config, &body.features)?;
        shared.reporting.restore(&body.reporting, now)?;
        if whole {
            shared.subsystem.restore(&body.subsystem, now)?;
        } else {
            shared.subsystem.restore_joined(&body.subsystem)?;
        }
        body.background
            .restore(shared.sanitize(), &shared.self_test)?;
        let limits = Limits {
            max_size: u32::from(shared.config.mqes_z) + 1,
            vectors: shared.config.msix_vectors,
            aborts: usize::from(ACL) + 1,
        };
        shared
            .queues
            .restore(&body.queues, &shared.doorbells, limits)?;
        shared.doorbells.restore(&body.doorbells, &mem)?;
        let mut ctl = ctrl.control.lock();
        ctl.regs = regs;
        ctl.clean_shutdown = body.clean_shutdown;
        let (cc, csts) = (ctl.regs.cc, ctl.regs.csts);
        let running = cc.en() && !csts.cfs() && csts.shst() == shutdown::NONE;
        if running {
            // Their commands' effect is in the state: the host may see
            // them complete, before the workers run (`queue::owed`).
            shared.queues.post_owed(&body.queues.owed, &*mem)?;
            // After them: commands the crash interrupted, run again by the
            // admin worker once a crash record is attached.
            let admin = body.queues.sqs.iter().find(|s| s.qid == 0);
            let at = admin.map_or((0, 0), |s| (s.head, s.tail));
            shared.queues.owed.rerun(&state.rerun, at);
        }
        // Parked before the workers start: they take them as their own.
        handed::hold_again(&shared.faults, &shared.queues, &state.handed, running, now)?;
        if running {
            let page_size = ctl
                .regs
                .validate_enable()
                .map_err(|why| inconsistent(format!("the saved controller runs with {why}")))?;
            let attachment = ctl.attachment.as_ref();
            let Some(att) = attachment else {
                return Err(inconsistent("no client is attached").into());
            };
            let session = Arc::new(Session {
                mem: Arc::clone(&att.mem),
                irq: Arc::clone(&att.irq),
                page_size,
            });
            ctrl.run(&mut ctl, &session)?;
        }
        ctl.regs.settle(now);
        let csts = ctl.regs.csts;
        let active = cc.en() && csts.rdy() && cc.shn() == 0 && csts.shst() == 0;
        shared.features.keep_alive.set_active(active);
        drop(ctl);
        crate::admin::resume_sanitize(shared);
        Ok(ctrl)
    }

    /// Starts the workers on `session` and the keep alive timer, then
    /// has every SQ looked at and every CQ holding entries signalled.
    fn run(&self, ctl: &mut Control, session: &Arc<Session>) -> Result<(), StateError> {
        let shared = &self.shared;
        // While the rings rest in the table, before their workers take
        // them.
        for slot in &shared.queues.cqs {
            if let Some(cq) = slot.lock().as_mut().filter(|cq| cq.head != cq.tail) {
                cq.irq_pending = cq.irq_pending.max(1);
                shared.interrupts.raise(cq, &*session.irq, &shared.stats);
            }
        }
        if !self.spawn_workers(ctl, session) {
            return Err(StateError::Busy(
                "no queue worker thread could start".into(),
            ));
        }
        let sh = Arc::clone(shared);
        KeepAlive::start(&shared.features.keep_alive, move || sh.keep_alive_expired());
        for qid in 0..shared.doorbells.queue_ids() {
            let qid = qid as u16;
            if shared.doorbells.is_open(Doorbell::SqTail(qid)) {
                // A trap while paused left the slot marked as queued, its
                // kick gone with the stopped mailbox.
                shared.doorbells.take_pending(Doorbell::SqTail(qid));
                shared.kick_sq(qid);
            }
        }
        Ok(())
    }
}

/// The admin queues in the state are the ones AQA, ASQ and ACQ describe.
fn check_admin_queues(regs: &Regs, body: &StateBody) -> Result<(), StateError> {
    let sq = body.queues.sqs.iter().find(|q| q.qid == 0);
    let cq = body.queues.cqs.iter().find(|q| q.qid == 0);
    if let Some(sq) = sq {
        same("the admin SQ's base (ASQ)", sq.base, regs.asq)?;
        same(
            "the admin SQ's size (AQA.ASQS + 1)",
            sq.size,
            u32::from(regs.aqa.asqs_z()) + 1,
        )?;
    }
    if let Some(cq) = cq {
        same("the admin CQ's base (ACQ)", cq.base, regs.acq)?;
        same(
            "the admin CQ's size (AQA.ACQS + 1)",
            cq.size,
            u32::from(regs.aqa.acqs_z()) + 1,
        )?;
    }
    Ok(())
}
