//! Asymmetric Namespace Access (NVMe Base 2.0 §8.1): each namespace is in
//! an ANA group, and each group has a state per controller, which says how
//! well (or whether) that controller reaches the group's namespaces. Here
//! every namespace is its own group (ANAGRPID = NSID), so a path can be
//! failed one namespace at a time, or for all of them at once.
//!
//! Every state starts optimized; the operator changes them
//! (`Controller::ana_set`). I/O through a controller on which the
//! namespace's group is inaccessible, in persistent loss or changing gets
//! the Path Related status the spec gives each (§8.1.3), which tells the
//! host to use another path.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
pub use vnvme_spec::ana::AnaState;
use vnvme_spec::Status;

use crate::saved_check::{inconsistent, InvalidState};

/// ANATT: seconds a controller stays in the change state at most (Linux
/// resets the controller after twice this without a new state).
pub(crate) const ANATT: u8 = 10;
/// ANACAP: optimized, non-optimized, inaccessible, persistent loss and
/// change reported (bits 4:0); ANAGRPID does not change while the
/// namespace is attached (bit 6).
pub(crate) const ANACAP: u8 = 0x1F | 1 << 6;

/// The subsystem's ANA states, shared by its controllers.
#[derive(Debug, Default)]
pub(crate) struct Ana {
    /// Some group is in a state that stops I/O on some controller: while
    /// clear, a command's ANA check is this one relaxed load.
    restricted: AtomicBool,
    inner: RwLock<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The log's Change Count: one more at each change.
    change_count: u64,
    /// States other than optimized, by (CNTLID, ANAGRPID), with the
    /// change count when each was set.
    states: BTreeMap<(u16, u32), (AnaState, u64)>,
}

impl Ana {
    /// Whether I/O to group `grpid` may go through controller `cntlid`,
    /// else the Path Related status it gets.
    pub fn check_io(&self, cntlid: u16, grpid: u32) -> Result<(), Status> {
        // Relaxed: a state change races with commands in flight anyway;
        // the next command sees it.
        if !self.restricted.load(Ordering::Relaxed) {
            return Ok(());
        }
        match self.state(cntlid, grpid).io_status() {
            Some(status) => Err(status.with_dnr(false)),
            None => Ok(()),
        }
    }

    /// Group `grpid`'s state on controller `cntlid`.
    pub fn state(&self, cntlid: u16, grpid: u32) -> AnaState {
        self.inner
            .read()
            .states
            .get(&(cntlid, grpid))
            .map_or(AnaState::Optimized, |&(s, _)| s)
    }

    /// Sets groups `grpids` to `state` on controller `cntlid`; whether any
    /// changed.
    pub fn set(&self, cntlid: u16, grpids: &[u32], state: AnaState) -> bool {
        let mut inner = self.inner.write();
        let mut changed = false;
        for &g in grpids {
            if inner
                .states
                .get(&(cntlid, g))
                .map_or(AnaState::Optimized, |s| s.0)
                == state
            {
                continue;
            }
            changed = true;
            inner.change_count = inner.change_count.wrapping_add(1);
            let count = inner.change_count;
            if state == AnaState::Optimized {
                inner.states.remove(&(cntlid, g));
            } else {
                inner.states.insert((cntlid, g), (state, count));
            }
        }
        let restricted = inner.states.values().any(|(s, _)| s.io_status().is_some());
        self.restricted.store(restricted, Ordering::Relaxed);
        changed
    }

    /// The ANA log page (0Ch, §5.16.1.12) for controller `cntlid`: a
    /// descriptor per group in `groups` (ANAGRPID and the NSIDs of its
    /// namespaces attached to the controller), without the NSIDs when
    /// `rgo` (Return Groups Only, LSP bit 0).
    pub fn log_page(&self, cntlid: u16, groups: &[(u32, Vec<u32>)], rgo: bool) -> Vec<u8> {
        let inner = self.inner.read();
        let mut page = Vec::with_capacity(16 + groups.len() * 36);
        page.extend_from_slice(&inner.change_count.to_le_bytes());
        let n = u16::try_from(groups.len()).unwrap_or(u16::MAX);
        page.extend_from_slice(&n.to_le_bytes());
        page.extend_from_slice(&[0; 6]);
        for (grpid, nsids) in groups.iter().take(usize::from(n)) {
            let (state, count) = inner
                .states
                .get(&(cntlid, *grpid))
                .copied()
                .unwrap_or((AnaState::Optimized, 0));
            let listed: &[u32] = if rgo { &[] } else { nsids };
            page.extend_from_slice(&grpid.to_le_bytes());
            let nnsid = u32::try_from(listed.len()).unwrap_or(u32::MAX);
            page.extend_from_slice(&nnsid.to_le_bytes());
            page.extend_from_slice(&count.to_le_bytes());
            page.push(state.code());
            page.extend_from_slice(&[0; 15]);
            for nsid in listed {
                page.extend_from_slice(&nsid.to_le_bytes());
            }
        }
        page
    }
}

/// The ANA states in a saved state (docs/state-format.md,
/// `subsystem.ana`): the subsystem's, saved once for all its controllers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SavedAna {
    /// The log's Change Count.
    pub change_count: u64,
    /// Each state other than optimized: `[cntlid, grpid, state, change
    /// count when set]`, the state by its `ana_set` name.
    pub states: Vec<(u16, u32, String, u64)>,
}

impl Ana {
    pub fn save(&self) -> SavedAna {
        let inner = self.inner.read();
        SavedAna {
            change_count: inner.change_count,
            states: (inner.states.iter())
                .map(|(&(c, g), &(s, n))| (c, g, s.to_string(), n))
                .collect(),
        }
    }

    /// Takes the saved states, each checked first (a state name this
    /// build does not know, a group twice, a count past the log's).
    pub fn restore(&self, saved: &SavedAna) -> Result<(), InvalidState> {
        let mut states = BTreeMap::new();
        for (cntlid, grpid, name, count) in &saved.states {
            // The parse error only repeats the name, which the message gives.
            let state: AnaState = name.parse().map_err(|_| {
                inconsistent(format!(
                    "ANA group {grpid} on controller {cntlid}: {name:?} is not an ANA state"
                ))
            })?;
            if state == AnaState::Optimized {
                return Err(inconsistent(format!(
                    "ANA group {grpid} on controller {cntlid}: optimized is never listed"
                )));
            }
            if *count > saved.change_count {
                return Err(inconsistent(format!(
                    "ANA group {grpid} on controller {cntlid}: set at change {count}, after the \
                     log's {}",
                    saved.change_count
                )));
            }
            if states.insert((*cntlid, *grpid), (state, *count)).is_some() {
                return Err(inconsistent(format!(
                    "ANA group {grpid} on controller {cntlid} is saved twice"
                )));
            }
        }
        let restricted = states.values().any(|(s, _)| s.io_status().is_some());
        *self.inner.write() = Inner {
            change_count: saved.change_count,
            states,
        };
        self.restricted.store(restricted, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_runs_until_a_group_is_made_inaccessible_on_that_controller_only() {
        let ana = Ana::default();
        assert_eq!(ana.check_io(1, 1), Ok(()));
        assert!(ana.set(1, &[1], AnaState::Inaccessible));
        assert_eq!(
            ana.check_io(1, 1),
            Err(Status::ASYMMETRIC_ACCESS_INACCESSIBLE.with_dnr(false))
        );
        assert_eq!(ana.check_io(2, 1), Ok(()));
        assert_eq!(ana.check_io(1, 2), Ok(()));
        assert!(!ana.set(1, &[1], AnaState::Inaccessible), "no change");
        assert!(ana.set(1, &[1], AnaState::NonOptimized));
        assert_eq!(ana.check_io(1, 1), Ok(()));
        assert!(!ana.restricted.load(Ordering::Relaxed));
    }

    #[test]
    fn log_page_has_a_descriptor_per_group_with_its_state_and_nsids() {
        let ana = Ana::default();
        ana.set(2, &[2], AnaState::PersistentLoss);
        let groups = [(1, vec![1]), (2, vec![2])];
        let page = ana.log_page(2, &groups, false);
        assert_eq!(page.len(), 16 + 2 * (32 + 4));
        assert_eq!(u64::from_le_bytes(page[0..8].try_into().unwrap()), 1);
        assert_eq!(u16::from_le_bytes([page[8], page[9]]), 2);
        // First descriptor: group 1, one NSID, optimized.
        assert_eq!(&page[16..20], &1u32.to_le_bytes());
        assert_eq!(&page[20..24], &1u32.to_le_bytes());
        assert_eq!(page[32], 0x01);
        assert_eq!(&page[48..52], &1u32.to_le_bytes());
        // Second: group 2, persistent loss, change count 1.
        assert_eq!(&page[52..56], &2u32.to_le_bytes());
        assert_eq!(u64::from_le_bytes(page[60..68].try_into().unwrap()), 1);
        assert_eq!(page[68], 0x04);
        // Return Groups Only: no NSIDs.
        let page = ana.log_page(2, &groups, true);
        assert_eq!(page.len(), 16 + 2 * 32);
        assert_eq!(&page[20..24], &0u32.to_le_bytes());
    }

    #[test]
    fn states_parse_from_their_names() {
        for name in AnaState::NAMES {
            let s: AnaState = name.parse().unwrap();
            assert_eq!(&s.to_string(), name);
        }
        assert!("degraded".parse::<AnaState>().is_err());
    }
}
