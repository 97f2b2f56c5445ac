//! FUA and the Volatile Write Cache reach the backend: what the host asks
//! to be durable is written with `write_fua` or followed by a flush.

use std::sync::atomic::{AtomicU64, Ordering};

use vnvme_blockdev::BlockError;

use super::*;
use crate::memory::GuestAddress;

/// A RAM namespace with a volatile cache that records how it was written.
#[derive(Debug)]
struct Recording {
    inner: RamDevice,
    writes: AtomicU64,
    fua_writes: AtomicU64,
    flushes: AtomicU64,
}

impl Recording {
    fn counts(&self) -> (u64, u64, u64) {
        (
            self.writes.load(Ordering::Relaxed),
            self.fua_writes.load(Ordering::Relaxed),
            self.flushes.load(Ordering::Relaxed),
        )
    }
}

impl BlockDevice for Recording {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn volatile_cache(&self) -> bool {
        true
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), BlockError> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.inner.write(offset, buf)
    }
    fn write_fua(&self, offset: u64, buf: &[u8]) -> Result<(), BlockError> {
        self.fua_writes.fetch_add(1, Ordering::Relaxed);
        self.inner.write(offset, buf)
    }
    fn flush(&self) -> Result<(), BlockError> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        self.inner.write_zeroes(offset, len)
    }
}

fn host_with_recording() -> (Host, Arc<Recording>) {
    let backend = Arc::new(Recording {
        inner: RamDevice::new(NS_BLOCKS * 512),
        writes: AtomicU64::new(0),
        fua_writes: AtomicU64::new(0),
        flushes: AtomicU64::new(0),
    });
    let mut h = Host::enabled_on(config(), backend.clone());
    h.create_pair(1, 16);
    (h, backend)
}

const FUA: u32 = 1 << 30;

#[test]
fn fua_write_is_passed_down_as_write_fua() {
    let (mut h, backend) = host_with_recording();
    let plain = rw(NvmOpcode::WRITE, 1, 0, 8, DATA, 0);
    assert!(h.submit(1, plain).status().is_success());
    assert_eq!(backend.counts(), (1, 0, 0));
    let mut fua = plain;
    fua.cdw12 = U32::new(fua.cdw12.get() | FUA);
    assert!(h.submit(1, fua).status().is_success());
    assert_eq!(backend.counts(), (1, 1, 0));
    let mut flush = cmd(NvmOpcode::FLUSH.0);
    flush.nsid = U32::new(1);
    assert!(h.submit(1, flush).status().is_success());
    assert_eq!(backend.counts(), (1, 1, 1));
}

#[test]
fn vwc_is_reported_and_disabling_it_makes_every_write_durable() {
    let (mut h, backend) = host_with_recording();
    assert!(h.admin(identify(1, 0, DATA)).status().is_success());
    let id = IdentifyController::read_from_bytes(&h.read_mem(DATA, 4096)).unwrap();
    assert_eq!(id.vwc & 1, 1, "VWC present");

    // Set Features VWC (06h) = 0: the cache is flushed, and from then on
    // plain writes and Write Zeroes are durable before they complete.
    assert!(h.admin(set_features(0x06, 0)).status().is_success());
    assert_eq!(backend.counts(), (0, 0, 1));
    assert!(h
        .submit(1, rw(NvmOpcode::WRITE, 1, 0, 8, DATA, 0))
        .status()
        .is_success());
    assert_eq!(backend.counts(), (0, 1, 1));
    assert!(h
        .submit(1, rw(NvmOpcode::WRITE_ZEROES, 1, 0, 8, 0, 0))
        .status()
        .is_success());
    assert_eq!(backend.counts(), (0, 1, 2));

    // Get Features reads WCE back: 0 now, 1 by default (SEL 01b).
    let wce = |h: &mut Host, sel| {
        let c = h.admin(get_features(0x06, sel, DATA));
        assert!(c.status().is_success(), "SEL {sel}");
        c.dw0.get()
    };
    assert_eq!((wce(&mut h, 0), wce(&mut h, 1)), (0, 1));

    // Re-enabled: plain writes stay in the cache.
    assert!(h.admin(set_features(0x06, 1)).status().is_success());
    assert_eq!(wce(&mut h, 0), 1);
    assert!(h
        .submit(1, rw(NvmOpcode::WRITE, 1, 0, 8, DATA, 0))
        .status()
        .is_success());
    assert_eq!(backend.counts(), (1, 1, 2));
}

#[test]
fn write_zeroes_with_fua_flushes() {
    let (mut h, backend) = host_with_recording();
    let mut wz = rw(NvmOpcode::WRITE_ZEROES, 1, 0, 8, 0, 0);
    assert!(h.submit(1, wz).status().is_success());
    assert_eq!(backend.counts().2, 0);
    wz.cdw12 = U32::new(wz.cdw12.get() | FUA);
    assert!(h.submit(1, wz).status().is_success());
    assert_eq!(backend.counts().2, 1);
}

#[test]
fn verify_with_fua_flushes_and_copy_with_fua_writes_durably() {
    let (mut h, backend) = host_with_recording();
    let mut verify = rw(NvmOpcode::VERIFY, 1, 0, 8, 0, 0);
    assert!(h.submit(1, verify).status().is_success());
    assert_eq!(backend.counts(), (0, 0, 0));
    verify.cdw12 = U32::new(verify.cdw12.get() | FUA);
    assert!(h.submit(1, verify).status().is_success());
    assert_eq!(backend.counts(), (0, 0, 1), "flushed before reading");
    // One source range entry (zeroes: LBA 0, one block) at DATA.
    h.mem.zero(GuestAddress(DATA), 32).unwrap();
    let mut copy = cmd(NvmOpcode::COPY.0);
    copy.nsid = U32::new(1);
    copy.prp1 = U64::new(DATA);
    copy.set_slba(100);
    assert!(h.submit(1, copy).status().is_success());
    assert_eq!(backend.counts(), (1, 0, 1));
    copy.cdw12 = U32::new(FUA);
    assert!(h.submit(1, copy).status().is_success());
    assert_eq!(backend.counts(), (1, 1, 1));
}

#[test]
fn a_ram_namespace_reports_no_volatile_write_cache() {
    let mut h = Host::new();
    h.enable();
    assert!(h.admin(identify(1, 0, DATA)).status().is_success());
    let id = IdentifyController::read_from_bytes(&h.read_mem(DATA, 4096)).unwrap();
    assert_eq!(id.vwc & 1, 0);
    // Nothing to enable or disable, nor to read: without a volatile write
    // cache, Set Features and Get Features for the Volatile Write Cache
    // feature abort with Invalid Field in Command (NVMe Base 1.4, Identify
    // Controller VWC; 2.x, Volatile Write Cache feature), whatever SEL asks.
    assert_eq!(
        h.admin(set_features(0x06, 0)).status(),
        Status::INVALID_FIELD.with_dnr(true)
    );
    for sel in 0..4 {
        assert_eq!(
            h.admin(get_features(0x06, sel, DATA)).status(),
            Status::INVALID_FIELD.with_dnr(true),
            "Get Features 06h SEL {sel}"
        );
    }
}
