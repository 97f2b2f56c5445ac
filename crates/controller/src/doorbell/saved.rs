//! The doorbells' saved form (docs/state-format.md, `doorbells`): where
//! Doorbell Buffer Config put the shadow doorbell and EventIdx buffers,
//! and each open doorbell's register value with what the device knows of
//! its shadow slot. The buffers' contents are guest memory: not saved.
//!
//! Restored after the queues reopened their doorbells (slots zeroed, the
//! doorbell page untouched): each value goes back to its slot, and to a
//! fresh doorbell page; a page handed over by a live upgrade keeps what
//! the host wrote there, which may be newer than the save.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use vnvme_spec::regs::Doorbell;

use super::shadow::Dbbuf;
use super::Doorbells;
use crate::memory::{GuestAddress, GuestMemory};
use crate::saved_check::{at_most, inconsistent, InvalidState};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedDbbuf {
    /// Guest address of the shadow doorbell buffer (PRP1).
    pub shadow: u64,
    /// Guest address of the EventIdx buffer (PRP2).
    pub event_idx: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedDoorbell {
    /// Doorbell index: 2 x qid for a SQ tail, 2 x qid + 1 for a CQ head.
    pub index: u32,
    /// The register's value (the doorbell page's, where offered).
    pub value: u32,
    /// The value the device last stored in this queue's shadow slot.
    pub shadow_dev: u32,
    /// The host writes the shadow slot itself: traps no longer copy.
    pub shadow_host: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedDoorbells {
    pub dbbuf: Option<SavedDbbuf>,
    /// The open doorbells, by index.
    pub registers: Vec<SavedDoorbell>,
}

fn doorbell(index: u32) -> Doorbell {
    let qid = (index / 2) as u16;
    if index.is_multiple_of(2) {
        Doorbell::SqTail(qid)
    } else {
        Doorbell::CqHead(qid)
    }
}

impl Doorbells {
    pub fn save(&self) -> SavedDoorbells {
        let dbbuf = self.dbbuf.read().as_ref().map(|d| SavedDbbuf {
            shadow: d.shadow.raw(),
            event_idx: d.event_idx.raw(),
        });
        let registers = (self.slots.iter().enumerate())
            .filter(|(_, s)| s.limit.load(Ordering::Acquire) != 0)
            .map(|(i, s)| {
                let index = i as u32;
                SavedDoorbell {
                    index,
                    value: self.register_value(doorbell(index)),
                    shadow_dev: s.shadow_dev.load(Ordering::Relaxed),
                    shadow_host: s.shadow_host.load(Ordering::Relaxed),
                }
            })
            .collect();
        SavedDoorbells { dbbuf, registers }
    }

    /// Applies `saved` to the doorbells the queues opened; the shadow
    /// buffers (if configured) are read and written through `mem`.
    pub fn restore(
        &self,
        saved: &SavedDoorbells,
        mem: &Arc<dyn GuestMemory>,
    ) -> Result<(), InvalidState> {
        for r in &saved.registers {
            let slot = self.slots.get(r.index as usize);
            let Some(slot) = slot.filter(|s| s.limit.load(Ordering::Acquire) != 0) else {
                return Err(inconsistent(format!(
                    "doorbell {} is saved, its queue is not",
                    r.index
                )));
            };
            let limit = u64::from(slot.limit.load(Ordering::Acquire)) - 1;
            at_most(
                format!("doorbell {}'s value", r.index),
                u64::from(r.value),
                limit,
            )?;
        }
        if let Some(d) = &saved.dbbuf {
            let page = 4096;
            if !d.shadow.is_multiple_of(page)
                || !d.event_idx.is_multiple_of(page)
                || d.shadow == d.event_idx
            {
                return Err(inconsistent(
                    "the shadow doorbell buffers are not page aligned, or are one buffer",
                ));
            }
        }
        for r in &saved.registers {
            let Some(slot) = self.slots.get(r.index as usize) else {
                continue;
            };
            slot.value.store(r.value, Ordering::Release);
            slot.shadow_dev.store(r.shadow_dev, Ordering::Relaxed);
            slot.shadow_host.store(r.shadow_host, Ordering::Relaxed);
            if let Some(p) = self.page.as_ref().filter(|p| !p.kept()) {
                p.store(r.index, r.value);
            }
        }
        *self.dbbuf.write() = saved.dbbuf.as_ref().map(|d| Dbbuf {
            shadow: GuestAddress(d.shadow),
            event_idx: GuestAddress(d.event_idx),
            mem: Arc::clone(mem),
            warned: AtomicBool::new(false),
        });
        self.dbbuf_on
            .store(saved.dbbuf.is_some(), Ordering::Release);
        Ok(())
    }
}
