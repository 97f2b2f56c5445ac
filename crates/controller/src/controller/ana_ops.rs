//! The operator's hand on Asymmetric Namespace Access: the state of an
//! ANA group (one per namespace, ANAGRPID = NSID) on one controller of the
//! subsystem, set from any of its controllers (the control socket's
//! `ana_set`).

use super::Controller;
use crate::faults::AnaFault;
use crate::subsystem::ana::AnaState;

/// Why an ANA state could not be set.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AnaError {
    #[error(
        "the subsystem has one controller, so it reports no ANA states (serve it with several \
         --socket to have paths)"
    )]
    NotReported,
    #[error("the subsystem has no controller {cntlid} (its controllers: {controllers:?})")]
    NoSuchController { cntlid: u16, controllers: Vec<u16> },
    #[error("no ANA group {0}: each namespace is its own group, numbered by its NSID")]
    NoSuchGroup(u32),
}

impl Controller {
    /// Sets ANA group `group` (every group when `None`) to `state` on
    /// controller `cntlid` of this controller's subsystem; that
    /// controller's host gets an ANA Change notice if a state changed.
    /// Returns whether one did.
    pub fn ana_set(
        &self,
        cntlid: u16,
        group: Option<u32>,
        state: AnaState,
    ) -> Result<bool, AnaError> {
        let shared = &*self.shared;
        if !shared.ana_reporting() {
            return Err(AnaError::NotReported);
        }
        let namespaces = &shared.subsystem.namespaces;
        let controllers = namespaces.controllers();
        if !controllers.contains(&cntlid) {
            return Err(AnaError::NoSuchController {
                cntlid,
                controllers,
            });
        }
        let groups = match group {
            Some(g) if namespaces.get(g).is_some() => vec![g],
            Some(g) => return Err(AnaError::NoSuchGroup(g)),
            None => namespaces.ids_after(0, false, usize::MAX),
        };
        let changed = namespaces.table().ana.set(cntlid, &groups, state);
        if changed {
            namespaces.notify_ana([cntlid]);
        }
        tracing::info!(cntlid, ?group, %state, changed, "ANA state set by the operator");
        Ok(changed)
    }

    /// An `ana` fault: the path's groups go to the fault's state now and,
    /// after its duration, back to the state each had, unless someone set
    /// it again meanwhile (the later setting wins).
    pub(super) fn ana_fault(&self, fault: AnaFault) -> Result<(), AnaError> {
        let before: Vec<(u32, AnaState)> = self
            .ana_states()
            .into_iter()
            .filter(|&(c, g, _)| c == fault.controller && fault.group.is_none_or(|f| f == g))
            .map(|(_, g, s)| (g, s))
            .collect();
        self.ana_set(fault.controller, fault.group, fault.state)?;
        let Some(d) = fault.duration else {
            return Ok(());
        };
        self.fault_end("vnvme-ana-fault", d, move |shared| {
            let namespaces = &shared.subsystem.namespaces;
            let ana = &namespaces.table().ana;
            let mut changed = false;
            for (g, was) in before {
                if ana.state(fault.controller, g) == fault.state {
                    changed |= ana.set(fault.controller, &[g], was);
                }
            }
            if changed {
                namespaces.notify_ana([fault.controller]);
            }
            tracing::info!(cntlid = fault.controller, changed, "ana fault over");
        });
        Ok(())
    }

    /// Every ANA group's state on every controller of the subsystem:
    /// (CNTLID, ANAGRPID, state), or none when ANA is not reported.
    pub fn ana_states(&self) -> Vec<(u16, u32, AnaState)> {
        let shared = &*self.shared;
        if !shared.ana_reporting() {
            return Vec::new();
        }
        let namespaces = &shared.subsystem.namespaces;
        let groups = namespaces.ids_after(0, false, usize::MAX);
        let ana = &namespaces.table().ana;
        namespaces
            .controllers()
            .into_iter()
            .flat_map(|c| groups.iter().map(move |&g| (c, g, ana.state(c, g))))
            .collect()
    }

    /// The counters of controller `cntlid` of this controller's subsystem
    /// (this one's included), with the namespaces' (the subsystem's);
    /// `None` if the subsystem has no such live controller.
    pub fn stats_of(&self, cntlid: u16) -> Option<crate::ControllerStats> {
        if cntlid == self.cntlid() {
            return Some(self.stats());
        }
        let mut s = self.shared.subsystem.namespaces.member(cntlid)?.stats();
        s.namespaces = self.stats().namespaces;
        Some(s)
    }

    /// The counters of every live controller of this controller's
    /// subsystem, ascending by CNTLID (this one alone when it is the
    /// only one), each with the namespaces' (the subsystem's).
    pub fn subsystem_stats(&self) -> Vec<crate::ControllerStats> {
        let cntlids = self.shared.subsystem.namespaces.controllers();
        let each = cntlids.into_iter().filter_map(|c| self.stats_of(c));
        each.collect()
    }

    /// This controller's CNTLID.
    pub fn cntlid(&self) -> u16 {
        self.shared.subsystem.namespaces.cntlid()
    }
}
