//! Asynchronous events and namespace rescans after initialisation.
//!
//! The driver keeps one Asynchronous Event Request outstanding on the admin
//! queue (when Identify Controller OAES bit 8 offers Namespace Attribute
//! Notices). Nothing runs in the background: the user calls
//! [`Controller::poll_events`] (or [`Controller::wait_events`], e.g. from a
//! housekeeping thread: the controller is `Sync`), which handles what has
//! completed and re-arms the request. On Namespace Attribute Changed it
//! reads the Changed Namespace List log (04h, which also re-enables the
//! notice) and probes those NSIDs again, without waiting for readiness: a
//! namespace still not ready stays [`NsState::NotReady`] until its next
//! notice. I/O queues see new namespaces at their next read or write.

use std::time::Duration;

use vnvme_spec::cdw::AsyncEventCompletion;
use vnvme_spec::log::{async_event, LogPageId};
use vnvme_spec::Completion;

use super::{active_nsids, Controller};
use crate::admin::{self, AdminQueue};
use crate::error::Error;
use crate::namespace::{self, NamespaceState, NsState, Probe, ProbeCtx};

/// The Changed Namespace List holds up to 1024 NSIDs; this one in the first
/// entry means more changed.
const MORE_THAN_1024: u32 = 0xFFFF_FFFF;

/// One asynchronous event the driver handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AsyncEvent {
    /// Asynchronous Event Type (completion dword 0, bits 2:0).
    pub kind: u8,
    /// Asynchronous Event Information (15:8).
    pub info: u8,
    /// Log page to read (23:16).
    pub lid: u8,
    /// Namespaces probed again because of it, with their new state.
    pub namespaces: Vec<NamespaceState>,
}

impl Controller {
    /// Whether an Asynchronous Event Request is outstanding.
    pub fn async_events_armed(&self) -> bool {
        self.admin.lock().async_event_armed()
    }

    /// Handles the asynchronous events completed so far, without waiting.
    pub fn poll_events(&self) -> Result<Vec<AsyncEvent>, Error> {
        self.wait_events(Duration::ZERO)
    }

    /// Like [`poll_events`](Self::poll_events), waiting up to `timeout` for
    /// a first event. Returns at once when no request is outstanding. The
    /// admin queue is held meanwhile: other admin commands wait, so keep
    /// `timeout` short on a thread that shares the controller.
    pub fn wait_events(&self, timeout: Duration) -> Result<Vec<AsyncEvent>, Error> {
        let mut admin = self.admin.lock();
        let completions = admin.take_events(timeout)?;
        let mut handled = Vec::new();
        for cqe in completions {
            if let Some(event) = self.handle_event(&mut admin, &cqe)? {
                handled.push(event);
            }
        }
        if self.opts.async_events && !handled.is_empty() {
            admin.arm_async_event()?;
        }
        Ok(handled)
    }

    /// Reads the active namespace list again and probes every NSID in it
    /// (no readiness wait): new namespaces become usable, vanished ones are
    /// dropped. Returns the new report.
    pub fn rescan(&self) -> Result<Vec<NamespaceState>, Error> {
        self.rescan_locked(&mut self.admin.lock())
    }

    fn rescan_locked(&self, admin: &mut AdminQueue) -> Result<Vec<NamespaceState>, Error> {
        let buf = self.access.dma_alloc(vnvme_spec::identify::IDENTIFY_SIZE)?;
        let mut cx = self.probe_ctx(admin, &buf);
        let nsids = active_nsids(&mut cx, &self.identify)?;
        let mut report = self.ns_report.lock();
        report.clear();
        let mut found = Vec::new();
        for nsid in nsids {
            let probe = namespace::probe(&mut cx, nsid)?;
            report.insert(nsid, probe.state(nsid));
            if let Probe::Ready(ns) = probe {
                found.push(ns);
            }
        }
        self.namespaces.replace(found);
        Ok(report.values().cloned().collect())
    }

    fn probe_ctx<'a>(
        &self,
        admin: &'a mut AdminQueue,
        buf: &'a crate::access::DmaBuffer,
    ) -> ProbeCtx<'a> {
        ProbeCtx {
            admin,
            buf,
            timeout: self.opts.admin_timeout,
            deadline: None,
            nstat: self.nstat,
        }
    }

    fn handle_event(
        &self,
        admin: &mut AdminQueue,
        cqe: &Completion,
    ) -> Result<Option<AsyncEvent>, Error> {
        let status = cqe.status();
        if !status.is_success() {
            // Aborted by a reset or refused: nothing to handle, and
            // re-arming a refused request would only fail again.
            tracing::debug!(%status, "asynchronous event request failed");
            return Ok(None);
        }
        let dw0 = AsyncEventCompletion::from(cqe.dw0);
        let (kind, info, lid) = (dw0.aet(), dw0.aei(), dw0.lid());
        let mut event = AsyncEvent {
            kind,
            info,
            lid,
            namespaces: Vec::new(),
        };
        let timeout = self.opts.admin_timeout;
        let buf = self.access.dma_alloc(4096)?;
        if kind == async_event::TYPE_NOTICE && info == async_event::NOTICE_NS_ATTRIBUTE_CHANGED {
            // Reading the log (RAE = 0) re-enables the notice.
            admin.execute(
                admin::get_log_page(LogPageId::CHANGED_NAMESPACES, 0xFFFF_FFFF, 4096, false),
                Some(&buf),
                timeout,
            )?;
            let page = buf.to_vec();
            let changed: Vec<u32> = page
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .take_while(|&n| n != 0)
                .collect();
            drop(buf);
            event.namespaces = if changed.first() == Some(&MORE_THAN_1024) {
                self.rescan_locked(admin)?
            } else {
                self.reprobe(admin, &changed)?
            };
        } else if lid != 0 {
            // Other events stay masked until their log page is read.
            if let Err(e) = admin.execute(
                admin::get_log_page(LogPageId(lid), 0xFFFF_FFFF, 4096, false),
                Some(&buf),
                timeout,
            ) {
                tracing::debug!(error = %e, lid, "reading the event's log page failed");
            }
        }
        Ok(Some(event))
    }

    /// Probes `nsids` again and updates the namespace set and report.
    fn reprobe(&self, admin: &mut AdminQueue, nsids: &[u32]) -> Result<Vec<NamespaceState>, Error> {
        let buf = self.access.dma_alloc(vnvme_spec::identify::IDENTIFY_SIZE)?;
        let mut cx = self.probe_ctx(admin, &buf);
        let (_, current) = self.namespaces.snapshot();
        let mut list: Vec<_> = current
            .iter()
            .filter(|n| !nsids.contains(&n.nsid))
            .cloned()
            .collect();
        let mut states = Vec::new();
        let mut report = self.ns_report.lock();
        for &nsid in nsids {
            let probe = namespace::probe(&mut cx, nsid)?;
            let state = probe.state(nsid);
            if state.state == NsState::Ready {
                tracing::info!(nsid, "namespace ready");
            }
            report.insert(nsid, state.clone());
            states.push(state);
            if let Probe::Ready(ns) = probe {
                list.push(ns);
            }
        }
        self.namespaces.replace(list);
        Ok(states)
    }
}
