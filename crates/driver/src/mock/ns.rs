//! The mock's namespaces beyond the basics: scripted Identify answers,
//! formats with metadata, NSTAT (CNS 08h), asynchronous events and the
//! Changed Namespace List log, and namespaces attached or made ready later.

use std::collections::VecDeque;

use vnvme_spec::command::Command;
use vnvme_spec::identify::{IdentifyNamespace, IdentifyNsIndependent};
use vnvme_spec::log::async_event;
use vnvme_spec::{AdminOpcode, Status};
use zerocopy::IntoBytes;

use super::{MockDevice, State};

/// Outstanding Asynchronous Event Requests and events waiting for one.
#[derive(Debug, Default)]
pub(super) struct Events {
    aers: VecDeque<u16>,
    pending: VecDeque<u32>,
    changed: Vec<u32>,
}

impl State {
    /// Identify Namespace (CNS 00h): scripted statuses first, then the data.
    pub(super) fn identify_ns(&mut self, nsid: u32) -> Result<Vec<u8>, Status> {
        if let Some(next) = self
            .cfg
            .statuses
            .get_mut(&nsid)
            .and_then(|s| (!s.is_empty()).then(|| s.remove(0)))
        {
            return Err(next);
        }
        if let Some(left) = self.cfg.not_ready.get_mut(&nsid) {
            if *left > 0 {
                *left -= 1;
                return Err(Status::NAMESPACE_NOT_READY);
            }
        }
        if self.cfg.invalid.contains(&nsid) || !self.cfg.nsids.contains(&nsid) {
            return Err(Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true));
        }
        let mut id = IdentifyNamespace::new_boxed();
        id.nsze = self.cfg.blocks.into();
        id.ncap = self.cfg.blocks.into();
        id.lbaf[0].lbads = 9;
        if self.cfg.metadata.contains(&nsid) {
            id.lbaf[0].ms = 8.into();
        }
        Ok(id.as_bytes().to_vec())
    }

    /// I/O Command Set Independent Identify Namespace (CNS 08h): NSTAT.
    pub(super) fn identify_ns_independent(&mut self, nsid: u32) -> Result<Vec<u8>, Status> {
        if !self.cfg.nsids.contains(&nsid) {
            return Err(Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true));
        }
        let mut id = IdentifyNsIndependent::new_boxed();
        id.nstat = 1;
        if let Some(left) = self.cfg.nstat_not_ready.get_mut(&nsid) {
            if *left > 0 {
                *left -= 1;
                id.nstat = 0;
            }
        }
        Ok(id.as_bytes().to_vec())
    }

    /// An Asynchronous Event Request completes only when there is an event.
    /// Returns true when `cmd` was such a request (no completion now).
    pub(super) fn defer_admin(&mut self, cmd: &Command) -> bool {
        if AdminOpcode(cmd.opcode()) != AdminOpcode::ASYNC_EVENT_REQUEST {
            return false;
        }
        self.stats.admin_opcodes.push(cmd.opcode());
        self.events.aers.push_back(cmd.cid());
        self.deliver_events();
        true
    }

    fn deliver_events(&mut self) {
        while !self.events.pending.is_empty() && !self.events.aers.is_empty() {
            let (Some(dw0), Some(cid)) = (
                self.events.pending.pop_front(),
                self.events.aers.pop_front(),
            ) else {
                return;
            };
            let head = self.sqs.get(&0).map_or(0, |s| s.head);
            let cmd = Command::new(AdminOpcode::ASYNC_EVENT_REQUEST.0, cid);
            self.post(0, 0, head, &cmd, Status::SUCCESS, dw0);
        }
    }

    /// Get Log Page: the Changed Namespace List (04h), cleared by reading it.
    pub(super) fn get_log_page(&mut self, cmd: &Command) -> (Status, u32) {
        if cmd.cdw10.get() & 0xFF != 0x04 {
            return (Status::INVALID_FIELD.with_dnr(true), 0);
        }
        let mut page = vec![0u8; 4096];
        for (slot, nsid) in page.chunks_exact_mut(4).zip(self.events.changed.drain(..)) {
            slot.copy_from_slice(&nsid.to_le_bytes());
        }
        let Some(segs) = self.prp_segments(cmd, 4096) else {
            return (Status::DATA_TRANSFER_ERROR, 0);
        };
        let mut at = 0;
        for (addr, len) in segs {
            self.write(addr, &page[at..at + len]);
            at += len;
        }
        (Status::SUCCESS, 0)
    }
}

impl MockDevice {
    /// Raises Namespace Attribute Changed for `nsids`.
    pub fn notice_ns_changed(&self, nsids: &[u32]) {
        let mut s = self.state.lock();
        s.events.changed.extend_from_slice(nsids);
        s.events.pending.push_back(async_event::dword0(
            async_event::TYPE_NOTICE,
            async_event::NOTICE_NS_ATTRIBUTE_CHANGED,
            0x04,
        ));
        s.deliver_events();
    }

    /// Attaches `nsid` (it joins the active list) and raises the notice.
    pub fn attach(&self, nsid: u32) {
        {
            let mut s = self.state.lock();
            if !s.cfg.nsids.contains(&nsid) {
                s.cfg.nsids.push(nsid);
                s.cfg.nsids.sort_unstable();
                let bytes = s.cfg.blocks as usize * super::LBA;
                s.data.insert(nsid, vec![0; bytes]);
            }
        }
        self.notice_ns_changed(&[nsid]);
    }

    /// Makes `nsid` ready (Identify and NSTAT) and raises the notice.
    pub fn make_ready(&self, nsid: u32) {
        {
            let mut s = self.state.lock();
            s.cfg.not_ready.remove(&nsid);
            s.cfg.nstat_not_ready.remove(&nsid);
        }
        self.notice_ns_changed(&[nsid]);
    }

    /// Identify commands received with `cns`.
    pub fn identify_count(&self, cns: u8) -> usize {
        self.state
            .lock()
            .identify_cns
            .iter()
            .filter(|&&c| c == cns)
            .count()
    }
}
