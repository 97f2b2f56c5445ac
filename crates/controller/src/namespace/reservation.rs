//! A namespace's reservations (NVMe Base 2.0 §8.19): its registrants
//! (host identifier and reservation key), the reservation held on it (type
//! and holder), the generation counter and Persist Through Power Loss.
//! The rules of Register, Acquire and Release live here as changes of
//! [`State`]; the commands that parse and answer them are in
//! `io/reservation.rs`.
//!
//! A host is its Host Identifier (feature 81h): the subsystem's
//! controllers with the same identifier are one host, and the state is one
//! per namespace, shared by every controller. Reservation Report lists a
//! registered host once per live controller with its identifier, or once
//! with CNTLID FFFFh (not associated with a controller) if it has none.
//!
//! The I/O path looks at one word first ([`Reservations::check`]): while
//! the namespace has no registrant, a command pays a plain load and no
//! lock. The same word counts Preempt and Abort actions (the epoch): a
//! command keeps the value it was admitted with ([`Admitted`]) and, when
//! it completes, is aborted if a Preempt and Abort has since removed its
//! host's registration ([`Reservations::aborted`]). While the namespace
//! has registrants, a command is also counted in its epoch until it is
//! done, and a Preempt and Abort completes only once the commands of the
//! epochs before it are ([`fence`]); a lock is taken only while a
//! reservation is held. A command admitted while the namespace had no
//! registrant is neither aborted nor waited for, and pays no second load:
//! its host was no registrant then.
//!
//! **Persistence (PTPL).** With PTPL set, the state is kept in a sidecar
//! file next to the namespace's image (`IMAGE.reservations`), rewritten
//! (temporary file, fsync, rename) before a change is answered, and
//! removed when PTPL is cleared. A sidecar rather than reserved space in
//! the image: every byte of an existing image stays user data at the
//! offset it had, NSZE does not change with the feature, and the file can
//! be read or removed by hand.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use vnvme_spec::reservation::{notification, ReservationType};
use vnvme_spec::status::invalid_field;
use vnvme_spec::Status;

pub(crate) mod fence;
pub(crate) mod saved;

use fence::Pending;
pub(crate) use fence::{Admitted, Fence};

/// Registrants kept at most: a host can present any number of
/// identifiers (one per controller reset), each registering.
pub(crate) const MAX_REGISTRANTS: usize = 64;

/// The reservation word's bits: a reservation is held; the namespace has
/// registrants; above them, the Preempt and Abort actions so far.
const HELD: u64 = 1;
const REGISTERED: u64 = 2;
const ABORTS_SHIFT: u32 = 2;

/// The Preempt and Abort epoch of a reservation word.
fn epoch(word: u64) -> u64 {
    word >> ABORTS_SHIFT
}

/// The first line of a sidecar file.
const MAGIC: &str = "vnvme-reservations 1";

/// A Host Identifier (81h), 64-bit ones in the first 8 bytes.
pub(crate) type HostId = [u8; 16];

/// The host a command comes from: its identifier and whether it was set
/// as 128 bits (EXHID), which Reservation Report's EDS must match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Host {
    pub id: HostId,
    pub extended: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Registrant {
    pub host: Host,
    pub key: u64,
}

/// The reservation held on the namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    pub rtype: ReservationType,
    /// The holder; `None` for the All Registrants types, which every
    /// registrant holds.
    pub holder: Option<HostId>,
}

/// A Reservation Notification (log page 80h) owed to a host: its
/// type ([`notification`]).
///
/// [`notification`]: vnvme_spec::reservation::notification
pub(crate) type Notice = (HostId, u8);

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct State {
    /// GEN: counts successful Register actions, Preempts and Clears.
    pub generation: u32,
    /// Persist Through Power Loss.
    pub ptpl: bool,
    /// In registration order (Reservation Report lists them so).
    pub registrants: Vec<Registrant>,
    pub held: Option<Held>,
    /// Preempt and Abort actions that removed a registration. Not
    /// persisted: no command outlives the process.
    pub aborts: u64,
    /// Hosts a Preempt and Abort removed, each with the value of `aborts`
    /// it was removed at (its latest); at most [`MAX_REGISTRANTS`].
    pub aborted: Vec<(HostId, u64)>,
}

fn conflict() -> Status {
    Status::RESERVATION_CONFLICT.with_dnr(true)
}

impl State {
    pub fn registrant(&self, host: &HostId) -> Option<&Registrant> {
        self.registrants.iter().find(|r| &r.host.id == host)
    }

    /// Whether `host` holds the reservation (every registrant does for
    /// the All Registrants types).
    pub fn holds(&self, host: &HostId) -> bool {
        match self.held {
            Some(Held {
                holder: Some(h), ..
            }) => &h == host,
            Some(Held { holder: None, .. }) => self.registrant(host).is_some(),
            None => false,
        }
    }

    /// Command Behavior in the Presence of a Reservation (§8.19.1): a
    /// read or write command from `host`.
    pub fn allows(&self, host: &HostId, write: bool) -> bool {
        let Some(held) = self.held else {
            return true;
        };
        if self.holds(host) {
            return true;
        }
        let registrant = self.registrant(host).is_some();
        match held.rtype {
            ReservationType::WRITE_EXCLUSIVE => !write,
            ReservationType::EXCLUSIVE_ACCESS => false,
            t if t.write_exclusive() => !write || registrant,
            _ => registrant,
        }
    }

    /// `host`'s registration if `crkey` is its key (or `iekey`), else
    /// Reservation Conflict (as for a host that is not registered).
    fn checked(&self, host: &HostId, crkey: u64, iekey: bool) -> Result<usize, Status> {
        let i = self
            .registrants
            .iter()
            .position(|r| &r.host.id == host)
            .ok_or_else(conflict)?;
        if !iekey && self.registrants[i].key != crkey {
            return Err(conflict());
        }
        Ok(i)
    }

    /// Register action 000b (§8.19.3): a new registrant with `nrkey`; the
    /// same key again is no change.
    pub fn register(&mut self, host: Host, nrkey: u64) -> Result<(), Status> {
        if let Some(r) = self.registrant(&host.id) {
            return if r.key == nrkey {
                Ok(())
            } else {
                Err(conflict())
            };
        }
        // A zero key is no key (as SCSI and SPDK have it).
        if nrkey == 0 || self.registrants.len() >= MAX_REGISTRANTS {
            return Err(invalid_field());
        }
        self.registrants.push(Registrant { host, key: nrkey });
        self.generation = self.generation.wrapping_add(1);
        Ok(())
    }

    /// Unregister action 001b (§8.19.4): a holder that leaves releases the
    /// reservation; an All Registrants one goes with the last registrant.
    /// A Registrants Only reservation released so is a Reservation
    /// Released notice to the other registrants.
    pub fn unregister(
        &mut self,
        host: &HostId,
        crkey: u64,
        iekey: bool,
    ) -> Result<Vec<Notice>, Status> {
        let i = self.checked(host, crkey, iekey)?;
        let held_by_it = matches!(self.held, Some(Held { holder: Some(h), .. }) if &h == host);
        let rtype = self.held.map(|h| h.rtype);
        self.registrants.remove(i);
        if held_by_it || self.registrants.is_empty() {
            self.held = None;
        }
        self.generation = self.generation.wrapping_add(1);
        let released = held_by_it && rtype.is_some_and(ReservationType::registrants_only);
        Ok(if released {
            self.others(host, notification::RESERVATION_RELEASED)
        } else {
            Vec::new()
        })
    }

    /// A notice of `kind` to every registrant but `host`.
    pub fn others(&self, host: &HostId, kind: u8) -> Vec<Notice> {
        let others = self.registrants.iter().filter(|r| &r.host.id != host);
        others.map(|r| (r.host.id, kind)).collect()
    }

    /// Replace action 010b: a registrant's new key.
    pub fn replace(
        &mut self,
        host: &HostId,
        crkey: u64,
        nrkey: u64,
        iekey: bool,
    ) -> Result<(), Status> {
        let i = self.checked(host, crkey, iekey)?;
        if nrkey == 0 {
            return Err(invalid_field());
        }
        self.registrants[i].key = nrkey;
        self.generation = self.generation.wrapping_add(1);
        Ok(())
    }

    /// Acquire action 000b (§8.19.5): a registrant takes a reservation no
    /// one holds, or already holds one of that type.
    pub fn acquire(
        &mut self,
        host: &HostId,
        crkey: u64,
        iekey: bool,
        rtype: ReservationType,
    ) -> Result<(), Status> {
        self.checked(host, crkey, iekey)?;
        match self.held {
            None => {
                let holder = (!rtype.all_registrants()).then_some(*host);
                self.held = Some(Held { rtype, holder });
                Ok(())
            }
            Some(held) if held.rtype == rtype && self.holds(host) => Ok(()),
            Some(_) => Err(conflict()),
        }
    }

    /// Preempt action 001b (§8.19.7). PRKEY names the registrants to
    /// remove (never the issuer): the holder's key (or 0h under an All
    /// Registrants reservation) also moves the reservation to the issuer
    /// as `rtype`; any other key only unregisters, and a key no other
    /// registrant has is a Reservation Conflict. With `abort` (Preempt and
    /// Abort, 010b) the removed hosts' commands in flight are aborted
    /// (see [`Reservations::aborted`]). Returns the hosts removed.
    pub fn preempt(
        &mut self,
        host: &HostId,
        crkey: u64,
        prkey: u64,
        iekey: bool,
        rtype: ReservationType,
        abort: bool,
    ) -> Result<Vec<HostId>, Status> {
        self.checked(host, crkey, iekey)?;
        let holder_key = match self.held {
            Some(Held {
                holder: Some(h), ..
            }) => self.registrant(&h).map(|r| r.key),
            _ => None,
        };
        let all_registrants = matches!(self.held, Some(Held { holder: None, .. }));
        let takes = if all_registrants {
            prkey == 0
        } else {
            holder_key == Some(prkey)
        };
        if !takes && prkey == 0 {
            return Err(invalid_field());
        }
        let mut removed = Vec::new();
        self.registrants.retain(|r| {
            let keep = &r.host.id == host || !(takes && all_registrants || r.key == prkey);
            if !keep {
                removed.push(r.host.id);
            }
            keep
        });
        if takes {
            let holder = (!rtype.all_registrants()).then_some(*host);
            self.held = Some(Held { rtype, holder });
        } else if removed.is_empty() {
            return Err(conflict());
        }
        if abort && !removed.is_empty() {
            self.aborts += 1;
            for id in &removed {
                self.aborted.retain(|(h, _)| h != id);
                if self.aborted.len() >= MAX_REGISTRANTS {
                    // The oldest goes: its commands are long done.
                    self.aborted.remove(0);
                }
                self.aborted.push((*id, self.aborts));
            }
        }
        self.generation = self.generation.wrapping_add(1);
        Ok(removed)
    }

    /// The reservation word of this state (see [`Reservations::check`]).
    fn word(&self) -> u64 {
        let held = if self.held.is_some() { HELD } else { 0 };
        let registered = if self.registrants.is_empty() {
            0
        } else {
            REGISTERED
        };
        held | registered | self.aborts << ABORTS_SHIFT
    }

    /// Release action 000b (§8.19.6): the holder gives the reservation up,
    /// naming its type; anyone else's release does nothing. Releasing a
    /// type other than Write Exclusive and Exclusive Access is a
    /// Reservation Released notice to the other registrants.
    pub fn release(
        &mut self,
        host: &HostId,
        crkey: u64,
        iekey: bool,
        rtype: ReservationType,
    ) -> Result<Vec<Notice>, Status> {
        self.checked(host, crkey, iekey)?;
        match self.held {
            Some(held) if self.holds(host) => {
                if held.rtype != rtype {
                    return Err(invalid_field());
                }
                self.held = None;
                let told = held.rtype.registrants_only() || held.rtype.all_registrants();
                Ok(if told {
                    self.others(host, notification::RESERVATION_RELEASED)
                } else {
                    Vec::new()
                })
            }
            _ => Ok(Vec::new()),
        }
    }

    /// Clear action 001b (§8.19.8): no reservation and no registrants; a
    /// Reservation Preempted notice to every other registrant.
    pub fn clear(&mut self, host: &HostId, crkey: u64, iekey: bool) -> Result<Vec<Notice>, Status> {
        self.checked(host, crkey, iekey)?;
        let notices = self.others(host, notification::RESERVATION_PREEMPTED);
        self.held = None;
        self.registrants.clear();
        self.generation = self.generation.wrapping_add(1);
        Ok(notices)
    }

    /// The sidecar file's text (see [`State::decode`]).
    fn encode(&self) -> String {
        let mut s = format!("{MAGIC}\ngeneration {}\n", self.generation);
        for r in &self.registrants {
            let width = if r.host.extended { 16 } else { 8 };
            s += &format!("registrant {} {width} {:016x}\n", hex(&r.host.id), r.key);
        }
        if let Some(h) = self.held {
            let holder = h.holder.map_or_else(|| "all".to_string(), |id| hex(&id));
            s += &format!("reservation {} {holder}\n", h.rtype.0);
        }
        s
    }

    /// Parses a sidecar file: the magic line, then `generation N`,
    /// `registrant HOSTID 8|16 KEY` lines and at most one `reservation
    /// TYPE HOLDER|all` (hex, as [`State::encode`] writes them).
    fn decode(text: &str) -> Result<Self, String> {
        let mut lines = text.lines().enumerate();
        if lines.next().map(|(_, l)| l) != Some(MAGIC) {
            return Err(format!("line 1: expected '{MAGIC}'"));
        }
        let mut state = State {
            ptpl: true,
            ..State::default()
        };
        for (i, line) in lines {
            let at = |m: &str| format!("line {}: {m}: '{line}'", i + 1);
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                [] => {}
                ["generation", n] => {
                    state.generation = n.parse().map_err(|e| at(&format!("bad number ({e})")))?
                }
                ["registrant", id, width, key] => {
                    let id = unhex(id).ok_or_else(|| at("bad host id"))?;
                    let extended = match *width {
                        "8" => false,
                        "16" => true,
                        _ => return Err(at("width must be 8 or 16")),
                    };
                    let key =
                        u64::from_str_radix(key, 16).map_err(|e| at(&format!("bad key ({e})")))?;
                    if state.registrant(&id).is_some() || state.registrants.len() >= MAX_REGISTRANTS
                    {
                        return Err(at("duplicate or too many registrants"));
                    }
                    let host = Host { id, extended };
                    state.registrants.push(Registrant { host, key });
                }
                ["reservation", rtype, holder] if state.held.is_none() => {
                    let rtype = rtype.parse().map_err(|e| at(&format!("bad type ({e})")))?;
                    let rtype = ReservationType(rtype);
                    let holder = match *holder {
                        "all" => None,
                        h => Some(unhex(h).ok_or_else(|| at("bad holder"))?),
                    };
                    let fits = rtype.is_valid()
                        && holder.is_none() == rtype.all_registrants()
                        && holder.is_none_or(|h| state.registrant(&h).is_some());
                    if !fits {
                        return Err(at("type and holder do not fit the registrants"));
                    }
                    state.held = Some(Held { rtype, holder });
                }
                _ => return Err(at("unknown line")),
            }
        }
        Ok(state)
    }
}

fn hex(id: &HostId) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<HostId> {
    let mut id = [0u8; 16];
    if s.len() != 32 || !s.is_ascii() {
        return None;
    }
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(id)
}

/// One namespace's reservations, shared by its copies across attach,
/// detach and Format NVM (which leave reservations as they are).
#[derive(Debug, Default)]
pub(crate) struct Reservations {
    /// [`State::word`]: held, registered, Preempt and Abort count. Changed
    /// only under the lock; read without it by the I/O path (a host orders
    /// its I/O after an Acquire only by waiting for its completion, posted
    /// after the lock was released).
    word: AtomicU64,
    /// Commands running, by epoch ([`fence`]).
    pending: Pending,
    state: Mutex<State>,
    /// The sidecar file, for a namespace whose keys can persist (PTPLS).
    file: Option<PathBuf>,
}

impl Reservations {
    /// Reservations kept in `file` (if any) while PTPL is set: loaded from
    /// it if it exists.
    pub fn open(file: Option<PathBuf>) -> Result<Self, String> {
        let state = match &file {
            Some(path) if path.exists() => {
                let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
                State::decode(&text)?
            }
            _ => State::default(),
        };
        Ok(Self {
            word: AtomicU64::new(state.word()),
            pending: Pending::default(),
            state: Mutex::new(state),
            file,
        })
    }

    /// PTPLS: keys can persist through power loss (a sidecar file exists).
    pub fn can_persist(&self) -> bool {
        self.file.is_some()
    }

    /// Whether a read (`write` false) or write command from `host` may
    /// run; Reservation Conflict if not. What it saw goes with the command
    /// to its completion ([`Reservations::aborted`]), counted while it
    /// runs if the namespace has registrants (see [`fence`]).
    #[inline]
    pub fn check(
        self: &Arc<Self>,
        host: impl FnOnce() -> HostId,
        write: bool,
    ) -> Result<Admitted, Status> {
        let word = self.word.load(Ordering::Acquire);
        if word & (HELD | REGISTERED) == 0 {
            return Ok(Admitted::free(word));
        }
        self.check_registered(word, host, write)
    }

    /// [`Reservations::check`] with registrants: counted in its epoch,
    /// then judged under the lock if a reservation is held.
    fn check_registered(
        self: &Arc<Self>,
        mut word: u64,
        host: impl FnOnce() -> HostId,
        write: bool,
    ) -> Result<Admitted, Status> {
        let admitted = loop {
            self.pending.enter(epoch(word));
            let now = self.word.load(Ordering::SeqCst);
            if epoch(now) == epoch(word) {
                break Admitted::counted(now, self);
            }
            // A Preempt and Abort came between: count it in the new epoch.
            self.pending.leave(epoch(word));
            word = now;
            if word & (HELD | REGISTERED) == 0 {
                return Ok(Admitted::free(word));
            }
        };
        if admitted.word & HELD == 0 {
            return Ok(admitted);
        }
        let host = host();
        if self.state.lock().allows(&host, write) {
            Ok(admitted)
        } else {
            Err(conflict())
        }
    }

    /// Whether a command of `host` admitted as `admitted` is to complete
    /// with Command Aborted due to Preempt and Abort: a Preempt and Abort
    /// removed `host`'s registration since. A command admitted with no
    /// registrant on the namespace costs no load.
    #[inline]
    pub fn aborted(&self, admitted: &Admitted, host: impl FnOnce() -> HostId) -> bool {
        if admitted.word & REGISTERED == 0 {
            return false;
        }
        let since = epoch(admitted.word);
        if epoch(self.word.load(Ordering::Acquire)) == since {
            return false;
        }
        let host = host();
        let state = self.state.lock();
        state
            .aborted
            .iter()
            .any(|(h, at)| *h == host && *at > since)
    }

    /// After a Preempt and Abort that removed registrations: the fence its
    /// completion waits for, or `None` if no command admitted before it
    /// is left.
    pub fn fence(self: &Arc<Self>) -> Option<Fence> {
        let now = epoch(self.word.load(Ordering::SeqCst));
        let fence = Fence::new(self.clone(), now);
        (!fence.ready()).then_some(fence)
    }

    /// Commands counted running, all epochs (tests).
    #[cfg(test)]
    pub fn pending_total(&self) -> u64 {
        self.pending.total()
    }

    /// A copy of the state (Reservation Report, Get Features 83h).
    pub fn snapshot(&self) -> State {
        self.state.lock().clone()
    }

    /// Applies `change` to a copy of the state; if it succeeds and PTPL is
    /// (or was) set, the sidecar file is rewritten (or removed) before the
    /// copy becomes the state. A file that cannot be written fails the
    /// command with Internal Error and changes nothing.
    pub fn update<T>(
        &self,
        change: impl FnOnce(&mut State) -> Result<T, Status>,
    ) -> Result<T, Status> {
        let mut state = self.state.lock();
        let mut next = state.clone();
        let out = change(&mut next)?;
        if next.ptpl && !self.can_persist() {
            return Err(invalid_field());
        }
        if next == *state {
            return Ok(out);
        }
        if let Some(path) = self.file.as_deref().filter(|_| state.ptpl || next.ptpl) {
            persist(path, &next).map_err(|e| {
                tracing::warn!(path = %path.display(), "reservations not saved: {e}");
                Status::INTERNAL_ERROR.with_dnr(true)
            })?;
        }
        // Sequentially consistent: a command counting itself meanwhile
        // sees the new epoch, or the fence sees its count (see [`fence`]).
        self.word.store(next.word(), Ordering::SeqCst);
        *state = next;
        Ok(out)
    }
}

/// Writes `state` to `path` durably (or removes the file without PTPL).
fn persist(path: &Path, state: &State) -> std::io::Result<()> {
    use std::io::Write;
    if !state.ptpl {
        return match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    let tmp = path.with_extension("reservations.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(state.encode().as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sidecar_text_round_trips_and_bad_files_are_refused() {
        let a = Host {
            id: [1; 16],
            extended: true,
        };
        let mut s = State {
            ptpl: true,
            ..State::default()
        };
        s.register(a, 0xABCD).unwrap();
        s.acquire(&a.id, 0xABCD, false, ReservationType(3)).unwrap();
        assert_eq!(State::decode(&s.encode()), Ok(s.clone()));
        let bad = s.encode().replace("reservation 3", "reservation 5");
        assert!(State::decode(&bad).unwrap_err().contains("do not fit"));
        assert!(State::decode("vnvme-reservations 1\nregistrant zz 8 1\n").is_err());
        assert!(State::decode("something else\n").is_err());
    }
}
