//! Namespaces as the driver sees them: discovery (Identify, readiness),
//! what was skipped and why, and the set the I/O queues use, which a rescan
//! replaces.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use vnvme_spec::identify::nvm::{pif, ExtendedLbaFormat, IdentifyNamespaceNvm};
use vnvme_spec::identify::{dps, Cns, IdentifyNamespace, IdentifyNsIndependent, IDENTIFY_SIZE};
use zerocopy::FromBytes;

use crate::access::DmaBuffer;
use crate::admin::{self, is_retryable_not_ready, AdminQueue};
use crate::error::Error;
use crate::pi::NsProtection;

/// A namespace the driver can do I/O to.
#[derive(Debug, Clone)]
pub struct Namespace {
    pub nsid: u32,
    /// NSZE: size in logical blocks.
    pub blocks: u64,
    /// NCAP: capacity in logical blocks.
    pub capacity: u64,
    /// Bytes per logical block of the format in use.
    pub lba_size: u32,
    /// End-to-end protection, on a namespace formatted with PI: reads and
    /// writes of the block API set PRACT, so the controller generates and
    /// checks the PI (NVM Command Set 1.0 §5.3.2); where the metadata is
    /// more than the tuple it moves through a buffer of the queue's (see
    /// [`crate::IoQueue::write`]).
    pub protection: Option<NsProtection>,
    /// The Identify Namespace data it was built from.
    pub identify: Arc<IdentifyNamespace>,
}

/// Why a namespace from the active list is not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// NSZE is zero: the controller reported the namespace as inactive.
    Inactive,
    /// The format carries metadata without protection information, or
    /// less than its tuple, which this driver does not transfer.
    Metadata,
    /// Extended LBAs whose metadata is more than the PI tuple: the block
    /// API would have to interleave metadata into every data buffer.
    ExtendedMetadata,
    /// A PI format other than the 16-bit guard and the 64-bit guard without
    /// storage tag (ELBAF.PIF, STS).
    PiFormat { pif: u8, sts: u8 },
    /// LBADS outside 512 B ..= 64 KiB.
    LbaSize(u8),
}

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Skip::Inactive => f.write_str("inactive (NSZE is 0)"),
            Skip::Metadata => f.write_str("unsupported LBA format: metadata"),
            Skip::ExtendedMetadata => {
                f.write_str("unsupported LBA format: extended LBAs with more metadata than PI")
            }
            Skip::PiFormat { pif, sts } => write!(
                f,
                "unsupported LBA format: protection information format {pif}, storage tag {sts} bits"
            ),
            Skip::LbaSize(lbads) => write!(f, "unsupported LBA format: LBADS {lbads}"),
        }
    }
}

/// Where a namespace stands with the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NsState {
    /// Identified, supported and ready: I/O queues can use it.
    Ready,
    /// Still Namespace Not Ready (or NSTAT not ready) when the readiness
    /// timeout ran out: picked up later by [`Controller::poll_events`]
    /// or [`Controller::rescan`].
    ///
    /// [`Controller::poll_events`]: crate::Controller::poll_events
    /// [`Controller::rescan`]: crate::Controller::rescan
    NotReady,
    /// Not usable, without retry: Invalid Namespace or Format, any status
    /// with DNR set, another error, or a format the driver does not support.
    Skipped,
}

impl fmt::Display for NsState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NsState::Ready => "ready",
            NsState::NotReady => "not-ready",
            NsState::Skipped => "skipped",
        })
    }
}

/// One namespace of the active list and what the driver made of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceState {
    pub nsid: u32,
    pub state: NsState,
    /// Why it is not ready or skipped.
    pub reason: Option<String>,
}

/// The outcome of probing one NSID.
#[derive(Debug)]
pub(crate) enum Probe {
    Ready(Namespace),
    NotReady(String),
    Skipped(String),
}

impl Probe {
    pub fn state(&self, nsid: u32) -> NamespaceState {
        let (state, reason) = match self {
            Probe::Ready(_) => (NsState::Ready, None),
            Probe::NotReady(r) => (NsState::NotReady, Some(r.clone())),
            Probe::Skipped(r) => (NsState::Skipped, Some(r.clone())),
        };
        NamespaceState {
            nsid,
            state,
            reason,
        }
    }
}

/// How [`probe`] talks to the controller.
pub(crate) struct ProbeCtx<'a> {
    pub admin: &'a mut AdminQueue,
    /// One Identify page.
    pub buf: &'a DmaBuffer,
    pub timeout: Duration,
    /// Retries of Namespace Not Ready stop here; `None` means no retry.
    pub deadline: Option<Instant>,
    /// Identify CNS 08h exists (NVMe 2.0): NSTAT tells readiness.
    pub nstat: bool,
}

/// Identify `nsid` (CNS 00h), check its format, then (NVMe 2.0) its NSTAT
/// (CNS 08h). Namespace Not Ready (generic 0x82, DNR clear) and NSTAT not
/// ready are retried with backoff until the deadline; anything else is a
/// skip with the reason, without retry. Only transport errors are `Err`.
pub(crate) fn probe(cx: &mut ProbeCtx<'_>, nsid: u32) -> Result<Probe, Error> {
    let mut backoff = Duration::from_millis(1);
    let id = loop {
        cx.buf.fill(0, IDENTIFY_SIZE, 0)?;
        match cx.admin.execute(
            admin::identify(Cns::NAMESPACE, nsid),
            Some(cx.buf),
            cx.timeout,
        ) {
            Ok(_) => {
                break IdentifyNamespace::read_from_bytes(&cx.buf.to_vec())
                    // A size mismatch, all the error can say.
                    .map_err(|_| Error::Unsupported("short identify data".into()))?;
            }
            Err(Error::AdminCommand { status, .. }) if is_retryable_not_ready(status) => {
                if !pause(cx.deadline, &mut backoff) {
                    return Ok(Probe::NotReady(format!("identify: {status}")));
                }
            }
            Err(Error::AdminCommand { status, .. }) => {
                return Ok(Probe::Skipped(format!("identify: {status}")))
            }
            Err(e) => return Err(e),
        }
    };
    let elbaf = if id.dps & dps::PIT_MASK != 0 {
        match extended_lba_format(cx, nsid, id.format_index())? {
            Ok(e) => Some(e),
            Err(why) => return Ok(Probe::Skipped(why)),
        }
    } else {
        None
    };
    let ns = match Namespace::from_identify_with(nsid, id, elbaf) {
        Ok(ns) => ns,
        Err(why) => return Ok(Probe::Skipped(why.to_string())),
    };
    if !cx.nstat {
        return Ok(Probe::Ready(ns));
    }
    loop {
        cx.buf.fill(0, IDENTIFY_SIZE, 0)?;
        let why = match cx.admin.execute(
            admin::identify(Cns::NS_INDEPENDENT, nsid),
            Some(cx.buf),
            cx.timeout,
        ) {
            Ok(_) => {
                let ind = IdentifyNsIndependent::read_from_bytes(&cx.buf.to_vec())
                    // A size mismatch, all the error can say.
                    .map_err(|_| Error::Unsupported("short identify data".into()))?;
                if ind.nstat & 1 != 0 {
                    return Ok(Probe::Ready(ns));
                }
                "NSTAT: not ready".to_string()
            }
            Err(Error::AdminCommand { status, .. }) if is_retryable_not_ready(status) => {
                format!("identify (CNS 08h): {status}")
            }
            Err(Error::AdminCommand { status, .. }) => {
                return Ok(Probe::Skipped(format!("identify (CNS 08h): {status}")))
            }
            Err(e) => return Err(e),
        };
        if !pause(cx.deadline, &mut backoff) {
            return Ok(Probe::NotReady(why));
        }
    }
}

/// The Extended LBA Format of format `index` of `nsid` (Identify CNS 05h,
/// NVM command set), asked only of namespaces with protection information.
fn extended_lba_format(
    cx: &mut ProbeCtx<'_>,
    nsid: u32,
    index: usize,
) -> Result<Result<ExtendedLbaFormat, String>, Error> {
    cx.buf.fill(0, IDENTIFY_SIZE, 0)?;
    match cx.admin.execute(
        admin::identify(Cns::NAMESPACE_IOCS, nsid),
        Some(cx.buf),
        cx.timeout,
    ) {
        Ok(_) => {
            let nvm = IdentifyNamespaceNvm::read_from_bytes(&cx.buf.to_vec())
                // A size mismatch, all the error can say.
                .map_err(|_| Error::Unsupported("short identify data".into()))?;
            let elbaf = nvm.elbaf.get(index).map_or(0, |e| e.get());
            Ok(Ok(ExtendedLbaFormat::from(elbaf)))
        }
        Err(Error::AdminCommand { status, .. }) => Ok(Err(format!("identify (CNS 05h): {status}"))),
        Err(e) => Err(e),
    }
}

/// Sleeps `backoff` (doubling, up to 50 ms) if that ends before `deadline`;
/// false when it would not (time to give up).
fn pause(deadline: Option<Instant>, backoff: &mut Duration) -> bool {
    let Some(deadline) = deadline else {
        return false;
    };
    if Instant::now() + *backoff >= deadline {
        return false;
    }
    std::thread::sleep(*backoff);
    *backoff = (*backoff * 2).min(Duration::from_millis(50));
    true
}

/// The namespaces I/O queues may use. A rescan replaces the list and bumps
/// the version; a queue compares the version (one atomic load) before each
/// read or write and takes the new list when it moved.
#[derive(Debug, Default)]
pub(crate) struct NamespaceSet {
    version: AtomicU64,
    list: RwLock<Arc<[Namespace]>>,
}

impl NamespaceSet {
    pub fn new(list: Vec<Namespace>) -> Self {
        Self {
            version: AtomicU64::new(0),
            list: RwLock::new(list.into()),
        }
    }

    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    pub fn snapshot(&self) -> (u64, Arc<[Namespace]>) {
        let list = self.list.read();
        (self.version(), Arc::clone(&list))
    }

    /// Replaces the list (kept in NSID order).
    pub fn replace(&self, mut list: Vec<Namespace>) {
        list.sort_by_key(|n| n.nsid);
        let mut guard = self.list.write();
        *guard = list.into();
        self.version.fetch_add(1, Ordering::Release);
    }
}

impl Namespace {
    /// Validates an Identify Namespace structure. The device is not trusted:
    /// the format index and sizes are checked, not assumed.
    pub fn from_identify(nsid: u32, id: IdentifyNamespace) -> Result<Self, Skip> {
        Self::from_identify_with(nsid, id, None)
    }

    /// As [`Self::from_identify`], with the Extended LBA Format of the
    /// format in use (CNS 05h) for a namespace with protection
    /// information: without it the guard is taken as 16-bit.
    pub fn from_identify_with(
        nsid: u32,
        id: IdentifyNamespace,
        elbaf: Option<ExtendedLbaFormat>,
    ) -> Result<Self, Skip> {
        if id.nsze.get() == 0 {
            return Err(Skip::Inactive);
        }
        let format = id.current_format();
        if !(9..=16).contains(&format.lbads) {
            return Err(Skip::LbaSize(format.lbads));
        }
        let ms = format.ms.get();
        let protection = match id.dps & dps::PIT_MASK {
            pit @ 1..=3 => {
                let elbaf = elbaf.unwrap_or_default();
                let guard_64 = match (elbaf.pif(), elbaf.sts()) {
                    (pif::GUARD_16B, 0) => false,
                    (pif::GUARD_64B, 0) => true,
                    (pif, sts) => return Err(Skip::PiFormat { pif, sts }),
                };
                Some(NsProtection {
                    pit,
                    guard_64,
                    first: id.dps & dps::FIRST != 0,
                    ms,
                    extended: id.extended_lba(),
                })
            }
            _ => None,
        };
        // Metadata moves only with PI: the driver knows what to put there.
        match protection {
            None if ms != 0 => return Err(Skip::Metadata),
            Some(pi) if ms < pi.tuple_size() => return Err(Skip::Metadata),
            Some(pi) if pi.extended && !pi.stripped() => return Err(Skip::ExtendedMetadata),
            _ => {}
        }
        Ok(Self {
            nsid,
            blocks: id.nsze.get(),
            capacity: id.ncap.get(),
            lba_size: 1 << format.lbads,
            protection,
            identify: Arc::new(id),
        })
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.blocks.saturating_mul(u64::from(self.lba_size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_with_metadata_or_odd_lba_size_is_skipped() {
        let mut id = IdentifyNamespace::new_boxed();
        assert_eq!(
            Namespace::from_identify(1, (*id).clone()).unwrap_err(),
            Skip::Inactive
        );
        id.nsze = 100.into();
        id.lbaf[0].lbads = 12;
        let ns = Namespace::from_identify(1, (*id).clone()).unwrap();
        assert_eq!(
            (ns.blocks, ns.lba_size, ns.size_bytes()),
            (100, 4096, 409_600)
        );
        id.lbaf[0].ms = 8.into();
        assert_eq!(
            Namespace::from_identify(1, (*id).clone()).unwrap_err(),
            Skip::Metadata
        );
        // PI whose tuple is the whole metadata: usable with PRACT.
        id.dps = 1;
        let ns = Namespace::from_identify(1, (*id).clone()).unwrap();
        let pi = NsProtection {
            pit: 1,
            guard_64: false,
            first: false,
            ms: 8,
            extended: false,
        };
        assert_eq!(ns.protection, Some(pi));
        // 16 bytes of metadata, 8 of them PI, last (PIP clear).
        id.lbaf[0].ms = 16.into();
        let pi = Namespace::from_identify(1, (*id).clone())
            .unwrap()
            .protection;
        assert_eq!(pi.map(|p| (p.ms, p.tuple_offset())), Some((16, 8)));
        id.dps = 1 | dps::FIRST;
        let pi = Namespace::from_identify(1, (*id).clone())
            .unwrap()
            .protection;
        assert_eq!(pi.map(|p| (p.first, p.tuple_offset())), Some((true, 0)));
        let guard_64 = ExtendedLbaFormat::new().with_pif(pif::GUARD_64B);
        let ns = Namespace::from_identify_with(1, (*id).clone(), Some(guard_64)).unwrap();
        assert_eq!(ns.protection.map(|p| p.guard_64), Some(true));
        // A 64-bit guard tuple does not fit 8 bytes of metadata.
        id.lbaf[0].ms = 8.into();
        assert_eq!(
            Namespace::from_identify_with(1, (*id).clone(), Some(guard_64)).unwrap_err(),
            Skip::Metadata
        );
        let storage_tag = guard_64.with_sts(16);
        id.lbaf[0].ms = 16.into();
        assert_eq!(
            Namespace::from_identify_with(1, (*id).clone(), Some(storage_tag)).unwrap_err(),
            Skip::PiFormat { pif: 2, sts: 16 }
        );
        // Extended LBAs: only the tuple alone, which PRACT strips.
        id.set_format_index(0, true);
        assert_eq!(
            Namespace::from_identify(1, (*id).clone()).unwrap_err(),
            Skip::ExtendedMetadata
        );
        id.lbaf[0].ms = 8.into();
        let pi = Namespace::from_identify(1, (*id).clone())
            .unwrap()
            .protection;
        assert_eq!(pi.map(|p| p.extended), Some(true));
        id.set_format_index(0, false);
        id.dps = 0;
        id.lbaf[0].ms = 0.into();
        id.lbaf[0].lbads = 40;
        assert_eq!(
            Namespace::from_identify(1, (*id).clone()).unwrap_err(),
            Skip::LbaSize(40)
        );
    }
}
