//! Which controllers of the NVM subsystem a namespace is attached to
//! (NVMe Base 2.0 §8.3.3): a namespace is active for a controller only
//! while attached to it. A private namespace has at most one; a shared one
//! (NMIC bit 0) any of the subsystem's controllers.

use std::collections::BTreeSet;

/// The CNTLIDs a namespace is attached to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Attached(BTreeSet<u16>);

impl Attached {
    /// Attached to controller `cntlid` only.
    pub fn only(cntlid: u16) -> Self {
        Self(BTreeSet::from([cntlid]))
    }

    /// Attached to `cntlid` when `attached`, else to none.
    pub fn only_if(attached: bool, cntlid: u16) -> Self {
        if attached {
            Self::only(cntlid)
        } else {
            Self::default()
        }
    }

    /// Attached to the controllers `cntlids`.
    pub fn of(cntlids: &[u16]) -> Self {
        Self(cntlids.iter().copied().collect())
    }

    pub fn contains(&self, cntlid: u16) -> bool {
        self.0.contains(&cntlid)
    }

    /// Attaches `cntlid`; `false` if it already was.
    pub fn insert(&mut self, cntlid: u16) -> bool {
        self.0.insert(cntlid)
    }

    /// Detaches `cntlid`; `false` if it was not attached.
    pub fn remove(&mut self, cntlid: u16) -> bool {
        self.0.remove(&cntlid)
    }

    /// The attached CNTLIDs, ascending (a Controller List's order).
    pub fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        self.0.iter().copied()
    }
}
