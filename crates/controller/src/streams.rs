//! Streams directive state (NVMe Base 2.0 §8.7.2): per namespace, whether
//! this controller's host enabled Streams, the stream resources it
//! allocated and the streams open. Bounded: one entry per active namespace
//! the host named, at most [`MSL`] streams each.

use std::collections::{BTreeMap, BTreeSet};

use vnvme_spec::directive::dtype;
use vnvme_spec::status::invalid_field;
use vnvme_spec::Status;

pub(crate) mod saved;

/// Max Streams Limit: stream resources of the whole NVM subsystem, shared
/// by its namespaces.
pub(crate) const MSL: u16 = 16;

/// One namespace's streams.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct NsStreams {
    pub enabled: bool,
    /// Namespace Streams Allocated (NSA): stream ids 1..=allocated are usable.
    pub allocated: u16,
    /// Open stream ids, each in 1..=allocated.
    pub open: BTreeSet<u16>,
}

/// Streams of every namespace, by NSID (a leaf lock in [`crate::state::Shared`]).
#[derive(Debug, Default)]
pub(crate) struct Streams {
    namespaces: BTreeMap<u32, NsStreams>,
}

impl Streams {
    /// Namespace `nsid`'s streams (all zero if never touched).
    pub fn namespace(&self, nsid: u32) -> NsStreams {
        self.namespaces.get(&nsid).cloned().unwrap_or_default()
    }

    pub fn enabled(&self, nsid: u32) -> bool {
        self.namespaces.get(&nsid).is_some_and(|s| s.enabled)
    }

    /// NVM Subsystem Streams Available (NSSA): not allocated to a namespace.
    pub fn available(&self) -> u16 {
        let allocated: u16 = self.namespaces.values().map(|s| s.allocated).sum();
        MSL.saturating_sub(allocated)
    }

    /// NVM Subsystem Streams Open (NSSO).
    pub fn open_count(&self) -> u16 {
        let open = self
            .namespaces
            .values()
            .map(|s| s.open.len())
            .sum::<usize>();
        u16::try_from(open).unwrap_or(u16::MAX)
    }

    /// Enable Directive for Streams: disabling releases the namespace's
    /// resources, which closes its streams. `nsid` must be active.
    pub fn set_enabled(&mut self, nsid: u32, enable: bool) {
        if enable {
            self.namespaces.entry(nsid).or_default().enabled = true;
        } else {
            self.namespaces.remove(&nsid);
        }
    }

    /// Allocate Resources: up to `nsr` of the streams still available;
    /// returns NAR. A namespace that already holds resources keeps them
    /// and gets none more (the host releases them first to change the
    /// count).
    pub fn allocate(&mut self, nsid: u32, nsr: u16) -> Result<u16, Status> {
        let available = self.available();
        let ns = self.enabled_mut(nsid)?;
        if ns.allocated == 0 {
            ns.allocated = nsr.min(available);
        }
        Ok(ns.allocated)
    }

    /// Release Resources: the namespace's streams are closed and its
    /// resources go back to the subsystem.
    pub fn release_resources(&mut self, nsid: u32) -> Result<(), Status> {
        let ns = self.enabled_mut(nsid)?;
        ns.allocated = 0;
        ns.open.clear();
        Ok(())
    }

    /// Release Identifier: closes stream `sid` (a stream not open is
    /// already released).
    pub fn release_identifier(&mut self, nsid: u32, sid: u16) -> Result<(), Status> {
        self.enabled_mut(nsid)?.open.remove(&sid);
        Ok(())
    }

    /// A write with directive `dtype` and DSPEC `dspec` to namespace
    /// `nsid`: only Streams may be named, when enabled, with a stream id
    /// among those allocated; the stream opens if it is not open.
    pub fn write(&mut self, nsid: u32, dtype: u8, dspec: u16) -> Result<(), Status> {
        if dtype != dtype::STREAMS {
            return Err(invalid_field());
        }
        let ns = self.enabled_mut(nsid)?;
        if dspec == 0 || dspec > ns.allocated {
            return Err(invalid_field());
        }
        ns.open.insert(dspec);
        Ok(())
    }

    /// Controller Level Reset: Streams is disabled, resources released.
    pub fn reset(&mut self) {
        self.namespaces.clear();
    }

    /// A directive not enabled is refused with Invalid Field (§8.7).
    fn enabled_mut(&mut self, nsid: u32) -> Result<&mut NsStreams, Status> {
        self.namespaces
            .get_mut(&nsid)
            .filter(|s| s.enabled)
            .ok_or_else(invalid_field)
    }
}
