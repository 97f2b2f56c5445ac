//! A new child's restore of the client a dead one served: the newest
//! whole slot of the crash area ([`crash_area`](super::crash_area)) with
//! the queue positions stored since put over it, and the fds the
//! supervisor kept, become the client a live upgrade would have handed
//! over ([`TakenClient`]), which the child then serves on the same
//! connection.

use std::collections::HashMap;
use std::os::fd::OwnedFd;

use anyhow::{bail, Context, Result};

use vnvme_controller::crash_record::{CqPosition, CrashRecorded, Open, SqPosition};
use vnvme_controller::{GuestMemory, SavedState};
use vnvme_spec::regs::Doorbell;

use super::crash_area::{CrashArea, Kept, QueueWords};
use super::keeper;
use super::zone_room::ZoneRoom;
use crate::upgrade::{CrashedFds, TakenClient};

/// The client `fds` names, restored from `area`; `Err` says why it cannot
/// be (the supervisor then closes its connection).
pub fn client(
    area: &CrashArea,
    fds: CrashedFds,
    room: &ZoneRoom,
) -> Result<(TakenClient, Recorded)> {
    let kept = area.redo();
    let (message_id, message_fds) = fds.message;
    if let Some((msg_id, command)) = area.handling() {
        if let Err(why) = redo_fds(kept.as_ref(), (message_id, message_fds.len())) {
            bail!(
                "the dead server was handling vfio-user message {msg_id} (command {command}), \
                 {why}: its reply is owed, and whether it took effect is not known, so the \
                 connection cannot be resumed"
            );
        }
    }
    let redo = kept.map(|k| {
        let fds = if k.fds > 0 { message_fds } else { Vec::new() };
        (k.bytes, fds)
    });
    let (seq, payload) = area.newest().context("the crash area")?;

    let (slot, state) = keeper::decode(&payload)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("the crash area's slot {seq}"))?;
    if slot.serial != fds.serial {
        bail!(
            "the crash area's newest slot ({seq}) is of client {:#x}, the connection is client \
             {:#x}'s (the server died before it kept the new client)",
            slot.serial,
            fds.serial
        );
    }
    if slot.max_xfer != fds.max_xfer {
        bail!(
            "the crash area's slot says the client negotiated {} bytes per transfer, the \
             supervisor {}",
            slot.max_xfer,
            fds.max_xfer
        );
    }
    let words = Recorded {
        words: (0..=u16::MAX)
            .map(|qid| (qid, area.load(qid)))
            .filter(|(_, w)| w.sq.is_some() || w.cq.is_some())
            .collect(),
        doorbells: (0..=u16::MAX)
            .flat_map(|qid| [Doorbell::SqTail(qid), Doorbell::CqHead(qid)])
            .filter_map(|db| area.doorbell(db).map(|v| (db, v)))
            .collect(),
        open: state
            .positions()
            .0
            .iter()
            .map(|(qid, _)| (*qid, area.in_flight(*qid)))
            .filter(|(_, o)| !o.is_empty())
            .collect(),
        admin: area
            .in_flight(0)
            .iter()
            .filter_map(|o| Some(((o.cid, o.head), area.admin_command(o.cid, o.head)?)))
            .collect(),
        zones: room
            .places()
            .map(|(nsid, zone, i)| ((nsid, zone), area.zone(i)))
            .filter(|(_, (w, _))| *w != 0)
            .collect(),
        redo,
    };
    // The slot's maps name files by the supervisor's ids; the handover
    // indexes the files it passes.
    let ids: Vec<u64> = fds.files.iter().map(|(id, _)| *id).collect();
    let mut maps = slot.maps;
    for m in &mut maps {
        if let Some(id) = m.file {
            let Some(i) = ids.iter().position(|&x| x as usize == id) else {
                bail!(
                    "the map at IOVA {:#x} lies in file {id}, which the supervisor does not hold",
                    m.iova
                );
            };
            m.file = Some(i);
        }
    }
    let files: Vec<OwnedFd> = fds.files.into_iter().map(|(_, fd)| fd).collect();
    tracing::info!(
        "restoring the client from the crash area's slot {seq}: {} DMA maps, {} files",
        maps.len(),
        files.len()
    );
    let client = TakenClient {
        conn: fds.conn,
        max_xfer: fds.max_xfer,
        maps,
        files,
        irqs: fds.irqs,
        doorbells: fds.doorbells,
        function: slot.function,
        state,
    };
    Ok((client, words))
}

/// Whether the message marked in the crash area, `kept` there, can be
/// handled again with the fds held under `held` (id, count): it must be
/// kept, and its fds (if it has any) be those held.
pub fn redo_fds(kept: Option<&Kept>, held: (u64, usize)) -> Result<(), String> {
    match kept {
        None => Err("which cannot be handled again".into()),
        Some(k) if k.fds > 0 && (k.fds_id, k.fds) != held => Err(format!(
            "whose {} fds the supervisor does not hold (it holds {} under id {:#x}, the mark \
             names id {:#x})",
            k.fds, held.1, held.0, k.fds_id
        )),
        Some(_) => Ok(()),
    }
}

/// What the crash area kept, as the dead child left it: the queue words,
/// the doorbell values traps stored, the commands in flight by SQ, the
/// message it was handling (with its fds) if it may be handled again.
#[derive(Debug)]
pub struct Recorded {
    words: Vec<(u16, QueueWords)>,
    doorbells: Vec<(Doorbell, u32)>,
    open: Vec<(u16, Vec<Open>)>,
    /// The admin commands in flight kept to run again, by CID and head.
    admin: Vec<((u16, u32), [u8; 64])>,
    /// The zones' words stored, by NSID and zone.
    zones: HashMap<(u32, u32), (u64, u64)>,
    redo: Option<(Vec<u8>, Vec<OwnedFd>)>,
}

impl CrashRecorded for Recorded {
    fn sq(&self, qid: u16) -> Option<SqPosition> {
        self.words.iter().find(|(q, _)| *q == qid)?.1.sq
    }

    fn cq(&self, qid: u16) -> Option<CqPosition> {
        self.words.iter().find(|(q, _)| *q == qid)?.1.cq
    }

    fn open(&self, qid: u16) -> Vec<Open> {
        self.open
            .iter()
            .find(|(q, _)| *q == qid)
            .map(|(_, o)| o.clone())
            .unwrap_or_default()
    }

    fn admin_command(&self, cid: u16, head: u32) -> Option<[u8; 64]> {
        let kept = self.admin.iter().find(|(k, _)| *k == (cid, head));
        kept.map(|(_, sqe)| *sqe)
    }

    fn doorbell(&self, db: Doorbell) -> Option<u32> {
        self.doorbells
            .iter()
            .find(|(d, _)| *d == db)
            .map(|(_, v)| *v)
    }

    fn zone(&self, nsid: u32, zone: u32) -> (u64, u64) {
        self.zones.get(&(nsid, zone)).copied().unwrap_or_default()
    }
}

impl Recorded {
    /// The message the dead child was handling and its fds, to handle
    /// again first (`vnvme_vfio_user::handover::Marked::redo`).
    pub fn take_redo(&mut self) -> Option<(Vec<u8>, Vec<OwnedFd>)> {
        self.redo.take()
    }

    /// Puts them over `state`, read against the guest's memory `mem`
    /// ([`SavedState::put_positions`]): the commands in flight at the
    /// crash are completed with Command Interrupted.
    pub fn apply(&self, state: &mut SavedState, mem: &dyn GuestMemory) -> Result<()> {
        let interrupted = state
            .put_positions(self, mem)
            .map_err(anyhow::Error::msg)
            .context("the queue positions at the crash")?;
        let (sqs, cqs) = state.positions();
        tracing::info!(
            "queue positions at the crash: {}; {}",
            sqs.iter()
                .map(|(q, p)| format!("SQ {q} head {} tail {}", p.head, p.tail))
                .collect::<Vec<_>>()
                .join(", "),
            cqs.iter()
                .map(|(q, p)| format!(
                    "CQ {q} head {} tail {} phase {}",
                    p.head,
                    p.tail,
                    u8::from(p.phase)
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
        if state.reruns() > 0 {
            tracing::info!(
                "{} admin commands in flight at the crash run again once the crash record is                  attached (their effect is in no slot)",
                state.reruns()
            );
        }
        if !interrupted.is_empty() {
            tracing::info!(
                "{} commands in flight at the crash completed with Command Interrupted (the \
                 host retries them): {}",
                interrupted.len(),
                interrupted
                    .iter()
                    .map(|(sq, cid)| format!("SQ {sq} CID {cid}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        Ok(())
    }
}
