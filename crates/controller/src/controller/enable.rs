//! CC.EN transitions (§3.5.1, §3.7.2): enable creates the admin queues
//! and starts the workers; a controller reset stops them, deletes every
//! queue and returns the controller's state to its defaults.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use vnvme_spec::regs::{shutdown, Doorbell};

use super::{Control, Controller, MEMBERS_LEAVE};
use crate::config::Readiness;
use crate::features::AdminState;
use crate::keep_alive::KeepAlive;
use crate::lifecycle::timestamp::TimestampClock;
use crate::memory::GuestAddress;
use crate::queue::{Cq, Sq};
use crate::reporting::Events;
use crate::state::{Session, ADMIN_WORKER};
use crate::subsystem::ReadyTimer;
use crate::worker;
use crate::worker::group::Detached;

impl Controller {
    /// CC.EN 0 -> 1 (§3.5.1): validate, create the admin queues, start the
    /// workers, set CSTS.RDY. A bad configuration sets CSTS.CFS instead.
    pub(super) fn enable(&self, ctl: &mut Control) {
        let shared = &*self.shared;
        let page_size = match ctl.regs.validate_enable() {
            Ok(p) => p,
            Err(why) => {
                tracing::warn!("enable refused: {why}");
                shared.stats.fatal_errors.fetch_add(1, Ordering::Relaxed);
                ctl.regs.csts.set_cfs(true);
                shared.controller_telemetry(&format!("enable refused: {why}"));
                return;
            }
        };
        let Some(att) = &ctl.attachment else {
            tracing::warn!("enable refused: no client attached");
            ctl.regs.csts.set_cfs(true);
            shared.controller_telemetry("enable refused: no client attached");
            return;
        };
        let session = Arc::new(Session {
            mem: att.mem.clone(),
            irq: att.irq.clone(),
            page_size,
        });
        self.stop_workers(ctl);
        self.clear_queues();
        let asqs = u32::from(ctl.regs.aqa.asqs_z()) + 1;
        let acqs = u32::from(ctl.regs.aqa.acqs_z()) + 1;
        let mut cq = Cq::new(0, GuestAddress(ctl.regs.acq), acqs, true, 0);
        cq.set_source(shared.doorbells.source_for(Doorbell::CqHead(0)));
        let mut sq = Sq::new(0, GuestAddress(ctl.regs.asq), asqs, 0);
        sq.set_source(shared.doorbells.source_for(Doorbell::SqTail(0)));
        if let (Some(sq_slot), Some(cq_slot)) =
            (shared.queues.sqs.first(), shared.queues.cqs.first())
        {
            *sq_slot.lock() = Some(sq);
            *cq_slot.lock() = Some(cq);
        }
        shared.queues.list_resting();
        shared
            .doorbells
            .open(Doorbell::SqTail(0), asqs, ADMIN_WORKER);
        shared
            .doorbells
            .open(Doorbell::CqHead(0), acqs, ADMIN_WORKER);
        if !self.spawn_workers(ctl, &session) {
            self.clear_queues();
            ctl.regs.csts.set_cfs(true);
            return;
        }
        let now = Instant::now();
        shared.lifecycle.enabled(now);
        let active = shared.subsystem.namespaces.active_list();
        if ctl.regs.cc.crime() {
            // Ready independent of media: RDY now, and each slow namespace
            // announces itself (NSTAT, Namespace Attribute Changed).
            let sh = Arc::clone(&self.shared);
            let became_ready = move |nsid| {
                // Still there and still attached: it may have been detached
                // or deleted meanwhile.
                if sh.subsystem.namespaces.active(nsid).is_some() {
                    sh.namespace_changed(nsid);
                }
            };
            if let Some(t) =
                ReadyTimer::start(&shared.subsystem.ready_timer, &active, now, became_ready)
            {
                ctl.threads.push(t);
            }
        }
        let sh = Arc::clone(&self.shared);
        KeepAlive::start(&shared.features.keep_alive, move || sh.keep_alive_expired());
        ctl.clean_shutdown = false;
        shared.lifecycle.set_ready();
        shared.stats.enables.fetch_add(1, Ordering::Relaxed);
        ctl.regs.csts.set_cfs(false);
        // Ready with media (CC.CRIME = 0, every host that predates NVMe 2.0):
        // RDY waits for the slowest namespace that will become ready, so
        // the host finds every namespace ready and needs no polling. A
        // never-ready namespace does not hold RDY back.
        let with_media = active
            .iter()
            .filter_map(|ns| match ns.readiness {
                Readiness::After(d) if !ctl.regs.cc.crime() => Some(d),
                _ => None,
            })
            .max()
            .unwrap_or_default();
        ctl.regs.rdy_at = Some(now + with_media);
        ctl.regs.settle(now);
    }

    /// Starts a worker thread per mailbox on `session`. On failure, stops
    /// those started and returns `false`.
    /// In poll groups, hands each worker to its group instead.
    pub(super) fn spawn_workers(&self, ctl: &mut Control, session: &Arc<Session>) -> bool {
        if let Some(groups) = &self.groups {
            let mailboxes = &self.shared.queues.mailboxes;
            let members = Detached::new(mailboxes.len());
            for (i, w) in mailboxes.iter().enumerate() {
                w.rearm();
                let group = w.group().unwrap_or(0);
                let (sh, se) = (self.shared.clone(), session.clone());
                match worker::member(sh, se, i, true) {
                    Some(m) => groups.join(group, m, Arc::clone(&members)),
                    None => members.left(),
                }
            }
            ctl.members = Some(members);
            // As for threads of its own: a pause stops them and a resume
            // joins them again on this session.
            ctl.session = Some(Arc::clone(session));
            ctl.paused = false;
            return true;
        }
        for (i, w) in self.shared.queues.mailboxes.iter().enumerate() {
            w.rearm();
            let (sh, se) = (self.shared.clone(), session.clone());
            let spawned = std::thread::Builder::new()
                .name(match i {
                    ADMIN_WORKER => "vnvme-admin".into(),
                    i => format!("vnvme-io{i}"),
                })
                .spawn(move || worker::run(sh, se, i));
            match spawned {
                Ok(t) => ctl.threads.push(t),
                Err(e) => {
                    tracing::error!("spawning queue worker {i}: {e}");
                    self.stop_workers(ctl);
                    return false;
                }
            }
        }
        ctl.session = Some(Arc::clone(session));
        ctl.paused = false;
        true
    }

    /// Controller reset (§3.7.2): stop the workers, delete every queue,
    /// drop outstanding AERs, return features to defaults, clear CSTS.RDY,
    /// activate the firmware slot a Firmware Commit left for this reset.
    pub(super) fn controller_reset(&self, ctl: &mut Control) {
        let shared = &*self.shared;
        let was_enabled = ctl.regs.cc.en() || ctl.regs.csts.rdy();
        shared.lifecycle.reset();
        self.stop_workers(ctl);
        (ctl.session, ctl.paused) = (None, false);
        self.clear_queues();
        // The commands faults held went with the workers.
        shared.faults.reset();
        // And those limits held: their debt goes too.
        shared.qos.reset();
        // With the workers stopped no command sees the switch half done.
        // Persistent Event Log: the Power-on or Reset event of this reset
        // records this (its FA field) and the revision now running.
        if shared.subsystem.firmware.lock().reset() {
            tracing::debug!("firmware activated by the controller reset");
        }
        shared.doorbells.clear_dbbuf();
        shared.features.keep_alive.reset();
        *shared.features.admin.lock() = AdminState::new(&shared.config);
        *shared.reporting.events.lock() = Events::default();
        *shared.reporting.reservation_notices.lock() = Default::default();
        shared.features.streams.lock().reset();
        shared.interrupts.reset();
        shared.features.wce.store(true, Ordering::Relaxed);
        shared.lifecycle.clear_fatal();
        // A sanitize goes on across the reset (one a pause stopped goes on
        // now: the reset ends the pause); so does an extended self-test.
        crate::admin::resume_sanitize(shared);
        shared
            .self_test
            .controller_reset(shared.lifecycle.power_on_hours());
        ctl.regs.cc.set_en(false);
        ctl.regs.csts.set_rdy(false);
        ctl.regs.rdy_at = None;
        ctl.regs.csts.set_cfs(false);
        ctl.regs.csts.set_shst(shutdown::NONE);
        shared.lifecycle.set_cc(ctl.regs.cc);
        // The host that took a Persistent Event Log reporting context is
        // gone with the reset; keeping it would refuse its next Establish.
        shared.reporting.persistent_events.release();
        if was_enabled {
            shared
                .stats
                .controller_resets
                .fetch_add(1, Ordering::Relaxed);
            let power_cycles = shared.stats.power_cycles.load(Ordering::Relaxed);
            shared
                .reporting
                .persistent_events
                .power_on_or_reset(Instant::now(), power_cycles);
        }
        // After the reset's event, which carries the time it happened at.
        shared
            .lifecycle
            .set_timestamp(TimestampClock::reset(Instant::now()));
    }

    pub(super) fn stop_workers(&self, ctl: &mut Control) {
        self.shared.subsystem.ready_timer.stop();
        self.shared.features.keep_alive.stop();
        for w in &self.shared.queues.mailboxes {
            w.stop();
        }
        for t in ctl.threads.drain(..) {
            if t.join().is_err() {
                tracing::error!("a queue worker panicked");
            }
        }
        if let Some(members) = ctl.members.take() {
            if !members.wait(MEMBERS_LEAVE) {
                tracing::error!(
                    "a queue worker did not leave its poll group within {MEMBERS_LEAVE:?}: it is \
                     blocked, most likely in storage that does not answer"
                );
            }
        }
    }

    pub(super) fn clear_queues(&self) {
        let shared = &*self.shared;
        // The commands a pause kept go with their queues.
        shared.drop_parked_inflight();
        shared.queues.clear();
        shared.doorbells.close_all();
    }
}
