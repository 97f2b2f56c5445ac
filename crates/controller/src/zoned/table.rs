//! The zone state machine (ZNS 1.1 §2.1.1, Figure 7): each zone's state
//! and write pointer, and the open and active resources they hold.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;

use vnvme_spec::status::invalid_field;
use vnvme_spec::zns::{za, zone_state, zrasf, zsa, ZoneDescriptor};
use vnvme_spec::Status;

use super::{ZoneChange, ZoneOpError};

/// A zone state (§2.1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// ZSE: nothing written since the last reset.
    Empty,
    /// ZSIO: opened by a write; the controller may close it for another.
    ImplicitlyOpened,
    /// ZSEO: opened by Zone Management Send Open.
    ExplicitlyOpened,
    /// ZSC: partly written, holding an active resource, not open.
    Closed,
    /// ZSF: written to its capacity, or finished.
    Full,
    /// ZSRO: readable, never writable again.
    ReadOnly,
    /// ZSO: neither readable nor writable.
    Offline,
}

impl State {
    pub(super) fn zs(self) -> u8 {
        match self {
            State::Empty => zone_state::EMPTY,
            State::ImplicitlyOpened => zone_state::IMPLICITLY_OPENED,
            State::ExplicitlyOpened => zone_state::EXPLICITLY_OPENED,
            State::Closed => zone_state::CLOSED,
            State::Full => zone_state::FULL,
            State::ReadOnly => zone_state::READ_ONLY,
            State::Offline => zone_state::OFFLINE,
        }
    }

    pub(super) fn is_open(self) -> bool {
        matches!(self, State::ImplicitlyOpened | State::ExplicitlyOpened)
    }

    pub(super) fn is_active(self) -> bool {
        self.is_open() || self == State::Closed
    }

    /// As the control socket's errors name it.
    fn name(self) -> &'static str {
        match self {
            State::Empty => "empty",
            State::ImplicitlyOpened => "implicitly opened",
            State::ExplicitlyOpened => "explicitly opened",
            State::Closed => "closed",
            State::Full => "full",
            State::ReadOnly => "read only",
            State::Offline => "offline",
        }
    }
}

/// One zone.
#[derive(Debug, Clone, Copy)]
pub(super) struct Zone {
    pub state: State,
    /// Blocks written from the zone's start: the write pointer is ZSLBA
    /// plus this.
    pub written: u64,
    /// Zone Attributes ([`za`]).
    pub za: u8,
}

impl Zone {
    /// Whether a Report Zones filter (ZRASF) lists this zone.
    pub fn matches(&self, filter: u8) -> bool {
        let want = match filter {
            zrasf::ALL => return true,
            zrasf::EMPTY => State::Empty,
            zrasf::IMPLICITLY_OPENED => State::ImplicitlyOpened,
            zrasf::EXPLICITLY_OPENED => State::ExplicitlyOpened,
            zrasf::CLOSED => State::Closed,
            zrasf::FULL => State::Full,
            zrasf::READ_ONLY => State::ReadOnly,
            zrasf::OFFLINE => State::Offline,
            _ => return false,
        };
        self.state == want
    }

    pub fn descriptor(&self, zslba: u64, zcap: u64) -> ZoneDescriptor {
        let mut d = ZoneDescriptor::new(self.state.zs(), zslba, zcap, zslba + self.written);
        d.za = self.za;
        d
    }
}

/// Zone Management Send actions this controller takes (§3.4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ZoneAction {
    Close,
    Finish,
    Open,
    Reset,
    Offline,
}

impl ZoneAction {
    /// The action of a ZSA value; Invalid Field for Set Zone Descriptor
    /// Extension (taken apart: it carries data, see `Table::set_extension`),
    /// Flush Explicit ZRWA Range (no ZRWA) and reserved values.
    pub fn parse(zsa: u8) -> Result<Self, Status> {
        Ok(match zsa {
            zsa::CLOSE => ZoneAction::Close,
            zsa::FINISH => ZoneAction::Finish,
            zsa::OPEN => ZoneAction::Open,
            zsa::RESET => ZoneAction::Reset,
            zsa::OFFLINE => ZoneAction::Offline,
            _ => return Err(invalid_field()),
        })
    }

    /// Whether Select All applies the action to a zone in `state` (the
    /// states §3.4.3 lists for each action); the others are left alone.
    fn selects(self, state: State) -> bool {
        match self {
            ZoneAction::Close => state.is_open(),
            ZoneAction::Finish => state.is_active(),
            ZoneAction::Open => state == State::Closed,
            ZoneAction::Reset => state.is_active() || state == State::Full,
            ZoneAction::Offline => state == State::ReadOnly,
        }
    }
}

/// What bounds a write and the resources.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub zcap: u64,
    /// MOR and MAR as counts (`None`: no limit).
    pub mor: Option<u32>,
    pub mar: Option<u32>,
}

#[derive(Debug)]
pub(super) struct Table {
    pub(super) zones: Vec<Zone>,
    /// Zones open (implicitly or explicitly), and active (open or closed).
    pub(super) open: u32,
    pub(super) active: u32,
    /// The implicitly opened zones, oldest first: the one closed when a
    /// zone must open and the open resources are used up.
    pub(super) implicit: VecDeque<usize>,
    /// Zone descriptor extensions, `ext_size` bytes per zone (none when
    /// ZDES is 0); meaningful where the zone's ZDEV attribute is set.
    pub(super) ext: Vec<u8>,
    pub(super) ext_size: usize,
    /// Under a crash record (`record.rs`): the zones changed since their
    /// words were last stored, and the writes not yet completed, by zone
    /// (their first block and end in it). Empty without one.
    pub(super) recording: bool,
    pub(super) dirty: Vec<usize>,
    pub(super) writes: HashMap<usize, (u64, u64)>,
}

fn status(s: Status) -> Status {
    s.with_dnr(true)
}

impl Table {
    pub fn new(count: u64, read_only: u32, zcap: u64, ext_size: usize) -> Self {
        let empty = Zone {
            state: State::Empty,
            written: 0,
            za: 0,
        };
        let mut zones = vec![empty; count as usize];
        let first_ro = zones.len().saturating_sub(read_only as usize);
        for z in zones.iter_mut().skip(first_ro) {
            // Worn out at the end of use: written to capacity.
            *z = Zone {
                state: State::ReadOnly,
                written: zcap,
                za: 0,
            };
        }
        // Zeroed pages are mapped as they are touched: extensions that are
        // never set cost nothing (Zones::new bounds the total).
        let ext = vec![0; zones.len() * ext_size];
        Self {
            zones,
            open: 0,
            active: 0,
            implicit: VecDeque::new(),
            ext,
            ext_size,
            recording: false,
            dirty: Vec::new(),
            writes: HashMap::new(),
        }
    }

    /// Zone `i` changed: its word is stored once the step is done.
    fn touch(&mut self, i: usize) {
        if self.recording {
            self.dirty.push(i);
        }
    }

    /// Zone `i`'s descriptor extension (empty with ZDES 0).
    pub fn extension(&self, i: usize) -> &[u8] {
        let at = i * self.ext_size;
        self.ext.get(at..at + self.ext_size).unwrap_or_default()
    }

    /// Set Zone Descriptor Extension (§3.4.3.6, ZSA 10h) on zone `i`:
    /// only an empty zone takes one, and becomes closed, so it holds an
    /// active resource (Too Many Active Zones past MAR); Invalid Zone
    /// State Transition in any other state.
    pub fn set_extension(&mut self, i: usize, data: &[u8], l: Limits) -> Result<(), Status> {
        let zone = *self.zones.get(i).ok_or(status(Status::LBA_OUT_OF_RANGE))?;
        if zone.state != State::Empty {
            return Err(status(Status::INVALID_ZONE_STATE_TRANSITION));
        }
        if l.mar.is_some_and(|mar| self.active >= mar) {
            return Err(status(Status::TOO_MANY_ACTIVE_ZONES));
        }
        let at = i * self.ext_size;
        let slot = self
            .ext
            .get_mut(at..at + self.ext_size)
            .ok_or(status(Status::INVALID_FIELD))?;
        let n = data.len().min(slot.len());
        slot[..n].copy_from_slice(&data[..n]);
        slot[n..].fill(0);
        self.set_state(i, State::Closed);
        if let Some(z) = self.zones.get_mut(i) {
            z.za |= za::ZDEV;
        }
        Ok(())
    }

    /// The controller changes zone `i` by itself (§2.1.1.4): read only or
    /// offline as a worn device's zones go, giving back their resources;
    /// an open or closed zone finished (ZSF, attribute ZFC); a finish or a
    /// reset recommended (FZR, RZR). `Ok(false)`: it already was so. An
    /// offline zone never comes back, so it cannot become read only.
    pub fn change(&mut self, i: usize, change: ZoneChange, zcap: u64) -> Result<bool, ZoneOpError> {
        let zone = *self.zones.get(i).ok_or(ZoneOpError::OutOfRange(i as u64))?;
        let inapplicable = |applies| ZoneOpError::Inapplicable {
            change: change.name(),
            applies,
            state: zone.state.name(),
        };
        let (to, attr) = match change {
            ZoneChange::ReadOnly if zone.state == State::Offline => {
                return Err(ZoneOpError::AlreadyOffline)
            }
            ZoneChange::ReadOnly => (State::ReadOnly, 0),
            ZoneChange::Offline => (State::Offline, 0),
            ZoneChange::Finished if zone.state.is_active() => (State::Full, za::ZFC),
            // Already finished by the controller: nothing to do.
            ZoneChange::Finished if zone.za & za::ZFC != 0 => return Ok(false),
            ZoneChange::Finished => return Err(inapplicable("open or closed")),
            ZoneChange::FinishRecommended if zone.state.is_active() => (zone.state, za::FZR),
            ZoneChange::FinishRecommended => return Err(inapplicable("open or closed")),
            ZoneChange::ResetRecommended if zone.state.is_active() || zone.state == State::Full => {
                (zone.state, za::RZR)
            }
            ZoneChange::ResetRecommended => return Err(inapplicable("open, closed or full")),
        };
        if zone.state == to && zone.za & attr == attr {
            return Ok(false);
        }
        self.set_state(i, to);
        if let Some(z) = self.zones.get_mut(i) {
            z.za |= attr;
            if change == ZoneChange::Finished {
                z.written = zcap;
            }
        }
        Ok(true)
    }

    pub fn zones(&self) -> &[Zone] {
        &self.zones
    }

    #[cfg(test)]
    pub fn resources(&self) -> (u32, u32) {
        (self.open, self.active)
    }

    pub fn offline(&self) -> u32 {
        let n = self.zones.iter().filter(|z| z.state == State::Offline);
        n.count() as u32
    }

    /// Zone Is Offline if any zone of `zones` is.
    pub fn check_online(&self, zones: Range<usize>) -> Result<(), Status> {
        let slice = self.zones.get(zones).unwrap_or_default();
        if slice.iter().any(|z| z.state == State::Offline) {
            return Err(status(Status::ZONE_IS_OFFLINE));
        }
        Ok(())
    }

    /// Writes `nlb` blocks to zone `i`: at block `at` of it (a write,
    /// which must be at the write pointer), or at the write pointer (an
    /// append). Returns the block of the zone written at.
    pub fn write(&mut self, i: usize, at: Option<u64>, nlb: u64, l: Limits) -> Result<u64, Status> {
        let zone = *self.zones.get(i).ok_or(status(Status::LBA_OUT_OF_RANGE))?;
        match zone.state {
            State::Full => return Err(status(Status::ZONE_IS_FULL)),
            State::ReadOnly => return Err(status(Status::ZONE_IS_READ_ONLY)),
            State::Offline => return Err(status(Status::ZONE_IS_OFFLINE)),
            _ => {}
        }
        let start = zone.written;
        if at.is_some_and(|at| at != start) {
            return Err(status(Status::ZONE_INVALID_WRITE));
        }
        let end = start.saturating_add(nlb);
        if end > l.zcap {
            return Err(status(Status::ZONE_BOUNDARY_ERROR));
        }
        match zone.state {
            State::Empty | State::Closed => self.open_zone(i, State::ImplicitlyOpened, l)?,
            _ => {}
        }
        self.set_written(i, end, l);
        Ok(start)
    }

    /// Moves zone `i`'s write pointer to `written` blocks: Full at its
    /// capacity, which frees its resources.
    fn set_written(&mut self, i: usize, written: u64, l: Limits) {
        self.touch(i);
        if written >= l.zcap {
            self.set_state(i, State::Full);
        }
        if let Some(z) = self.zones.get_mut(i) {
            z.written = written;
        }
    }

    /// Opens zone `i` (Empty or Closed) into `to`, taking an active
    /// resource (from Empty) and an open one, closing the oldest
    /// implicitly opened zone when the open ones are used up (§2.1.1.4.1).
    fn open_zone(&mut self, i: usize, to: State, l: Limits) -> Result<(), Status> {
        let Some(zone) = self.zones.get(i).copied() else {
            return Err(status(Status::LBA_OUT_OF_RANGE));
        };
        if zone.state == State::Empty && l.mar.is_some_and(|mar| self.active >= mar) {
            return Err(status(Status::TOO_MANY_ACTIVE_ZONES));
        }
        if l.mor.is_some_and(|mor| self.open >= mor) {
            let Some(victim) = self.implicit.front().copied() else {
                return Err(status(Status::TOO_MANY_OPEN_ZONES));
            };
            self.set_state(victim, State::Closed);
        }
        self.set_state(i, to);
        Ok(())
    }

    /// Puts zone `i` in `to`, keeping the resource counts and the
    /// implicitly opened list in step, and dropping the attributes the
    /// new state does not keep: a finish is recommended only to active
    /// zones, a reset not to empty, read only or offline ones; an empty
    /// zone has none (no extension, not finished by the controller).
    fn set_state(&mut self, i: usize, to: State) {
        self.touch(i);
        let Some(zone) = self.zones.get_mut(i) else {
            return;
        };
        if !to.is_active() {
            zone.za &= !za::FZR;
        }
        if matches!(to, State::Empty | State::ReadOnly | State::Offline) {
            zone.za &= !za::RZR;
        }
        if to == State::Empty {
            zone.za = 0;
        }
        let from = std::mem::replace(&mut zone.state, to);
        if from.is_open() {
            self.open = self.open.saturating_sub(1);
        }
        if from.is_active() {
            self.active = self.active.saturating_sub(1);
        }
        if to.is_open() {
            self.open += 1;
        }
        if to.is_active() {
            self.active += 1;
        }
        if from == State::ImplicitlyOpened {
            self.implicit.retain(|&z| z != i);
        }
        if to == State::ImplicitlyOpened {
            self.implicit.push_back(i);
        }
    }

    /// Takes `action` on `zones`: each must be in a state the action
    /// applies to, or (`select_all`) those that are not are skipped.
    /// Zones reset that held data are pushed to `reset`.
    pub fn act(
        &mut self,
        action: ZoneAction,
        zones: Range<usize>,
        select_all: bool,
        l: Limits,
        reset: &mut Vec<usize>,
    ) -> Result<(), Status> {
        for i in zones {
            let Some(zone) = self.zones.get(i).copied() else {
                break;
            };
            if select_all && !action.selects(zone.state) {
                continue;
            }
            self.act_on(action, i, zone, l, reset)?;
        }
        Ok(())
    }

    /// One zone's transition (§3.4.3.1 to §3.4.3.5): states already where
    /// the action leads succeed without change; states it cannot leave
    /// are Invalid Zone State Transition.
    fn act_on(
        &mut self,
        action: ZoneAction,
        i: usize,
        zone: Zone,
        l: Limits,
        reset: &mut Vec<usize>,
    ) -> Result<(), Status> {
        let invalid = || Err(status(Status::INVALID_ZONE_STATE_TRANSITION));
        match (action, zone.state) {
            (ZoneAction::Open, State::ExplicitlyOpened) => {}
            (ZoneAction::Open, State::ImplicitlyOpened) => {
                self.set_state(i, State::ExplicitlyOpened);
            }
            (ZoneAction::Open, State::Empty | State::Closed) => {
                self.open_zone(i, State::ExplicitlyOpened, l)?;
            }
            (ZoneAction::Close, State::Closed) => {}
            (ZoneAction::Close, s) if s.is_open() => self.set_state(i, State::Closed),
            (ZoneAction::Finish, State::Full) => {}
            (ZoneAction::Finish, State::Empty) => {
                // Passes through the active states on its way (§2.1.1.4.4).
                if l.mar.is_some_and(|mar| self.active >= mar) {
                    return Err(status(Status::TOO_MANY_ACTIVE_ZONES));
                }
                self.set_written(i, l.zcap, l);
            }
            (ZoneAction::Finish, s) if s.is_active() => self.set_written(i, l.zcap, l),
            (ZoneAction::Reset, State::Empty) => {}
            (ZoneAction::Reset, s) if s.is_active() || s == State::Full => {
                self.set_state(i, State::Empty);
                // An empty zone has no extension (§3.4.3.4): ZDEV off, and
                // the old data not shown by a later extended report.
                if let Some(z) = self.zones.get_mut(i) {
                    z.written = 0;
                    z.za = 0;
                }
                let at = i * self.ext_size;
                if let Some(ext) = self.ext.get_mut(at..at + self.ext_size) {
                    ext.fill(0);
                }
                reset.push(i);
            }
            (ZoneAction::Offline, State::Offline) => {}
            (ZoneAction::Offline, State::ReadOnly) => self.set_state(i, State::Offline),
            _ => return invalid(),
        }
        Ok(())
    }
}
