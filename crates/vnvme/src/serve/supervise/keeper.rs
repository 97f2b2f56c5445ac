//! The supervised child's side of the crash area ([`crash_area`](super::crash_area)): keeps
//! in it, as they change, what the next child needs to serve the same
//! client after a crash.
//!
//! * The saved client (DMA maps, PCI function, the controller's saved
//!   state) is written again into the other slot at a *checkpoint*, on the
//!   thread serving the client, between two messages, whenever something
//!   other than a queue position may have changed: the client's maps or
//!   interrupts, a write to config space, the MSI-X table or BAR0's
//!   registers, a reset ([`NvmeDevice::state_writes`]), or an admin command
//!   (the admin worker counts them and wakes the thread). A checkpoint
//!   pauses the workers for the save (bounded by [`CHECKPOINT_DRAIN`];
//!   with a command still in flight it is tried again after a back-off,
//!   [`RETRY_FIRST`] doubling to [`RETRY_MOST`], or at the next message if
//!   one comes first: a client ringing through the doorbell page or
//!   shadow doorbells may send none for as long as it likes).
//! * A command the guest sees complete is in the slot first: the workers
//!   owe an admin command's completion (and the admin queue's answers and
//!   events) instead of posting it (`vnvme_controller`'s `queue::owed`);
//!   the checkpoint saves them with the state, stores them in flight again
//!   in the new generation, writes the slot, then releases them
//!   ([`Controller::release_owed`](vnvme_controller::Controller::release_owed))
//!   and the workers post them. A crash before the slot restores the
//!   previous one and completes the command with Command Interrupted; one
//!   after restores the slot, which posts each still in flight once. A
//!   checkpoint that fails releases them all the same (logged): the guest
//!   is not kept waiting for a slot that may not come.
//! * The queue positions are stored by the workers after each round
//!   ([`CrashRecord`]), as single words; the commands that go in flight
//!   and come back, and the doorbell values traps store, as they happen.
//! * A zoned namespace's zones are stored as they change, a word each (and
//!   one per write not yet completed), where [`ZoneRoom`] places them.
//! * The message being handled is a word, set before and cleared after.

use std::io::Write;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use vnvme_controller::crash_record::{CqPosition, CrashRecord, SqPosition, ZoneRecorder};
use vnvme_controller::SavedState;
use vnvme_device::{FunctionState, NvmeDevice};
use vnvme_spec::regs::Doorbell;
use vnvme_vfio_user::handover::{HandedMap, Marked};
use vnvme_vfio_user::ReplyPipe;

use super::crash_area::{CrashArea, CrashAreaError};
use super::zone_room::ZoneRoom;

/// Most time a checkpoint lets the commands in flight complete before it
/// gives up (and tries again after a back-off, see [`RETRY_FIRST`]).
pub const CHECKPOINT_DRAIN: Duration = Duration::from_millis(100);

/// The first wait before a failed checkpoint is tried again without a
/// message; each failure in a row doubles it, up to [`RETRY_MOST`]. A
/// failure paused the workers for up to [`CHECKPOINT_DRAIN`], so the
/// back-off keeps a storage that stays slow from being paused most of
/// the time.
pub const RETRY_FIRST: Duration = Duration::from_millis(10);
/// The longest wait between two tries of a failed checkpoint.
pub const RETRY_MOST: Duration = Duration::from_secs(1);

/// The client part of a slot (JSON): which client, its negotiated
/// transfer size, its maps (each [`HandedMap::file`] the id the supervisor
/// holds the file under) and the PCI function.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotClient {
    /// The client's serial, as its `client` note to the supervisor said.
    pub serial: u64,
    pub max_xfer: usize,
    pub maps: Vec<HandedMap>,
    pub function: FunctionState,
}

/// A slot's payload: the JSON's length (u32, little endian), the JSON,
/// then the controller's saved state (docs/state-format.md).
pub fn encode(client: &SlotClient, state: &[u8]) -> Vec<u8> {
    let json = serde_json::to_vec(client).unwrap_or_default();
    let mut out = Vec::with_capacity(4 + json.len() + state.len());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(state);
    out
}

/// A slot's payload read back, or why it does not parse.
pub fn decode(payload: &[u8]) -> Result<(SlotClient, SavedState), String> {
    let len = payload
        .get(..4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or("a slot shorter than its length word")?;
    let json = payload
        .get(4..4 + len)
        .ok_or("a slot shorter than its client part")?;
    let client: SlotClient =
        serde_json::from_slice(json).map_err(|e| format!("the slot's client part: {e}"))?;
    let state = SavedState::decode(&payload[4 + len..])
        .map_err(|e| format!("the slot's saved state: {e}"))?;
    Ok((client, state))
}

/// The child's keeper of the crash area.
#[derive(Debug)]
pub struct Keeper {
    area: CrashArea,
    /// Where replies wait until the message's mark is cleared.
    replies: Option<Arc<ReplyPipe>>,
    client: Mutex<Option<SlotClient>>,
    /// The client part changed since the last slot.
    dirty: AtomicBool,
    /// Admin commands run, and how many the last slot saw.
    admin: AtomicU64,
    kept_admin: AtomicU64,
    /// [`NvmeDevice::state_writes`] at the last slot.
    kept_writes: AtomicU64,
    /// The next slot's sequence number.
    seq: AtomicU64,
    /// Where each zoned namespace's zones are in the area.
    zones: ZoneRoom,
    /// Wakes the thread serving the client (the upgrade requests' wake
    /// socket) after an admin command, for its checkpoint.
    waker: UnixStream,
    /// Why the last checkpoint failed, logged once per reason.
    failed: Mutex<Option<String>>,
    /// A try after a failed checkpoint is on its way (a thread sleeping
    /// its back-off, then waking the client's thread with `waker`).
    retry_due: Arc<AtomicBool>,
    /// The next back-off.
    retry_wait: Mutex<Duration>,
}

impl Keeper {
    /// The keeper of the area in `fd`, waking the client's thread with
    /// `waker`, its replies staged in the pipe `replies` (read and write
    /// ends) if the supervisor made one.
    pub fn new(
        fd: BorrowedFd<'_>,
        waker: UnixStream,
        replies: Option<(OwnedFd, OwnedFd)>,
        zones: ZoneRoom,
    ) -> Result<Self, CrashAreaError> {
        let area = CrashArea::open(fd)?;
        let replies = replies
            .map(|(rx, tx)| ReplyPipe::new(rx, tx).map(Arc::new))
            .transpose()
            .map_err(CrashAreaError::Replies)?;
        let seq = area.next_seq();
        // The tables' entries are the dead child's (read by the restore
        // before this): void from here on.
        area.next_generation();
        Ok(Self {
            area,
            zones,
            replies,
            client: Mutex::new(None),
            dirty: AtomicBool::new(false),
            admin: AtomicU64::new(0),
            kept_admin: AtomicU64::new(0),
            kept_writes: AtomicU64::new(0),
            seq: AtomicU64::new(seq),
            waker,
            failed: Mutex::new(None),
            retry_due: Arc::default(),
            retry_wait: Mutex::new(RETRY_FIRST),
        })
    }

    /// A client negotiated (or was adopted): `client` is kept from the next
    /// checkpoint on.
    pub fn set_client(&self, client: SlotClient) {
        *self.client.lock() = Some(client);
        self.dirty.store(true, Ordering::Release);
    }

    /// The client's maps changed.
    pub fn set_maps(&self, maps: Vec<HandedMap>) {
        if let Some(c) = self.client.lock().as_mut() {
            c.maps = maps;
        }
        self.dirty.store(true, Ordering::Release);
    }

    /// The interrupts changed (their eventfds are the supervisor's table;
    /// the function state may have changed with them).
    pub fn touch(&self) {
        self.dirty.store(true, Ordering::Release);
    }

    /// The serial of the client kept, if any.
    pub fn serial(&self) -> Option<u64> {
        self.client.lock().as_ref().map(|c| c.serial)
    }

    /// The client went: nothing is kept for it any more.
    pub fn clear_client(&self) {
        *self.client.lock() = None;
    }

    /// The message being handled, its fds forwarded under `fds_id` (see
    /// [`CrashArea::set_handling`]).
    pub fn handling(&self, msg: Option<Marked<'_>>, fds_id: u64) {
        self.area.set_handling(msg, fds_id);
    }

    /// The pipe replies wait in (`vnvme_vfio_user::ReplyPipe`).
    pub fn replies(&self) -> Option<Arc<ReplyPipe>> {
        self.replies.clone()
    }

    /// Writes a slot if something other than a queue position may have
    /// changed since the last (see the module docs); between two messages.
    pub fn checkpoint(&self, device: &NvmeDevice) {
        let writes = device.state_writes();
        let admin = self.admin.load(Ordering::Acquire);
        if !self.dirty.load(Ordering::Acquire)
            && writes == self.kept_writes.load(Ordering::Relaxed)
            && admin == self.kept_admin.load(Ordering::Relaxed)
        {
            return;
        }
        let client = self.client.lock();
        let Some(c) = client.as_ref() else {
            // No client to keep (it went): nothing waits for a slot.
            device.controller().release_owed();
            return;
        };
        // Before the save: a change during it is kept by the next one.
        self.dirty.store(false, Ordering::Release);
        let ctrl = device.controller();
        ctrl.pause_draining(CHECKPOINT_DRAIN);
        let result = ctrl
            .save_state()
            .map_err(|e| format!("the controller cannot be saved now: {e}"))
            .and_then(|state| self.write_slot(c, device, &state));
        // Kept or not: a failed checkpoint does not hold the guest's
        // commands until a slot that may not come (a crash before the
        // next slot then forgets them, as the warning below says).
        let released = ctrl.release_owed();
        if let Err(e) = ctrl.resume() {
            tracing::error!("resuming the workers after a crash-state checkpoint: {e}");
        }
        if let (Err(why), 1..) = (&result, released) {
            tracing::warn!(
                "{released} commands completed without a slot holding their effect ({why}): a \
                 crash before the next slot forgets them"
            );
        }
        match result {
            Ok(()) => {
                self.kept_writes.store(writes, Ordering::Relaxed);
                self.kept_admin.store(admin, Ordering::Relaxed);
                *self.retry_wait.lock() = RETRY_FIRST;
                if self.failed.lock().take().is_some() {
                    tracing::info!("the crash state is kept again");
                }
            }
            Err(why) => {
                self.dirty.store(true, Ordering::Release);
                let mut failed = self.failed.lock();
                if failed.as_deref() != Some(why.as_str()) {
                    tracing::warn!(
                        "keeping the crash state: {why}; tried again shortly (a crash meanwhile \
                         restores the state kept before)"
                    );
                    *failed = Some(why);
                }
                drop(failed);
                self.retry_later();
            }
        }
    }

    /// Keeps `state`, saved by a live upgrade with the workers paused, as
    /// a slot (`vnvme ctl upgrade` under `--supervise`): the new process
    /// restores the same state and posts the completions it owes, so a
    /// crash of the new process before its first checkpoint finds their
    /// effect kept (a new child's keeper starts a new generation, so they
    /// are not posted twice). The completions are released, for this
    /// process to post if the upgrade fails. `Err`: why it was not kept
    /// (the upgrade is refused then).
    pub fn keep_paused(&self, device: &NvmeDevice, state: &SavedState) -> Result<(), String> {
        let client = self.client.lock();
        let Some(c) = client.as_ref() else {
            return Ok(());
        };
        self.write_slot(c, device, state)?;
        device.controller().release_owed();
        self.kept_writes
            .store(device.state_writes(), Ordering::Relaxed);
        self.kept_admin
            .store(self.admin.load(Ordering::Acquire), Ordering::Relaxed);
        Ok(())
    }

    /// Writes `state` of client `c` as the next slot, the words first.
    fn write_slot(
        &self,
        c: &SlotClient,
        device: &NvmeDevice,
        state: &SavedState,
    ) -> Result<(), String> {
        let mut c = c.clone();
        c.function = device.function_state();
        // The words first: a crash before the slot is whole pairs
        // the previous slot with the positions of now.
        let (sqs, cqs) = state.positions();
        // The outstanding AERs taken since the last slot: in
        // flight again in the new generation, or a crash before
        // this slot is whole would forget them.
        let aers: Vec<(u16, u32)> = (state.outstanding_aers().into_iter())
            .filter_map(|cid| Some((cid, self.area.open_head(0, cid)?)))
            .collect();
        // Saved with none in flight: the tables' entries are void.
        self.area.clear_words();
        self.area.next_generation();
        for (qid, p) in sqs {
            self.area.store_sq(qid, p);
        }
        for (qid, p) in cqs {
            self.area.store_cq(qid, p);
        }
        // The completions owed: in flight again in this
        // generation, before the slot that owes them (a crash
        // after it posts each once, see `vnvme_controller::queue::owed`).
        for (qid, o) in state.owed() {
            self.area.store_open(qid, o.cid, o.head);
        }
        for (cid, head) in aers {
            self.area.store_open(0, cid, head);
        }
        // The admin commands a restore runs again and the admin worker
        // has not yet: the slot lacks their effect and the list.
        for (cid, head, sqe) in state.rerun_commands() {
            self.area.store_admin_command(cid, head, &sqe);
            self.area.store_open(0, cid, head);
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        self.area
            .write_slot(seq, &encode(&c, &state.encode()))
            .map_err(|e| e.to_string())
    }

    /// Wakes the client's thread for another checkpoint after the
    /// back-off, unless a wake is on its way already. A short-lived
    /// thread: failures are rare, and a keeper that never fails keeps no
    /// thread for them.
    fn retry_later(&self) {
        if self.retry_due.swap(true, Ordering::AcqRel) {
            return;
        }
        let wait = {
            let mut next = self.retry_wait.lock();
            let wait = *next;
            *next = (wait * 2).min(RETRY_MOST);
            wait
        };
        let due = Arc::clone(&self.retry_due);
        let spawned = self.waker.try_clone().and_then(|waker| {
            std::thread::Builder::new()
                .name("vnvme-keep-retry".into())
                .spawn(move || {
                    std::thread::sleep(wait);
                    // Cleared first: the checkpoint this wakes may fail
                    // again and must be able to ask for the next try.
                    due.store(false, Ordering::Release);
                    // A full socket already wakes the thread.
                    let _ = (&waker).write(&[1]);
                })
        });
        if let Err(e) = spawned {
            self.retry_due.store(false, Ordering::Release);
            tracing::warn!(
                "cannot schedule the next crash-state checkpoint ({e}): at the next message"
            );
        }
    }

    /// The area, for tests of what was kept.
    #[cfg(test)]
    pub fn area(&self) -> &CrashArea {
        &self.area
    }
}

impl CrashRecord for Keeper {
    fn sq(&self, qid: u16, pos: SqPosition) {
        self.area.store_sq(qid, pos);
    }

    fn cq(&self, qid: u16, pos: CqPosition) {
        self.area.store_cq(qid, pos);
    }

    fn fetched(&self, qid: u16, cid: u16, pos: SqPosition) {
        self.area.store_fetched(qid, cid, pos);
    }

    fn completed(&self, qid: u16, cid: u16) {
        self.area.store_completed(qid, cid);
    }

    fn admin_command(&self, cid: u16, head: u32, sqe: &[u8; 64]) {
        self.area.store_admin_command(cid, head, sqe);
    }

    fn doorbell(&self, db: Doorbell, value: u32) {
        self.area.store_doorbell(db, value);
    }

    fn admin_done(&self) {
        self.admin.fetch_add(1, Ordering::AcqRel);
        // A full socket already wakes the thread.
        let _ = (&self.waker).write(&[1]);
    }
}

impl ZoneRecorder for Keeper {
    fn zone(&self, nsid: u32, zone: u32, word: u64) {
        if let Some(i) = self.zones.index(nsid, zone) {
            self.area.store_zone(i, false, word);
        }
    }

    fn zone_write(&self, nsid: u32, zone: u32, word: u64) {
        if let Some(i) = self.zones.index(nsid, zone) {
            self.area.store_zone(i, true, word);
        }
    }
}
