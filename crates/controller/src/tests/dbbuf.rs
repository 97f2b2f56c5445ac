//! Doorbell Buffer Config (§5.8): validation, seeding, zeroing at queue
//! creation, traps copied to the shadow, reset, unreachable buffers.

use std::ops::Range;

use parking_lot::Mutex;

use super::*;
use crate::memory::DmaError;
use crate::memory::GuestAddress;

#[test]
fn dbbuf_config_invalid_buffers_are_invalid_field() {
    let mut h = Host::with_mode(DoorbellMode::Shadow);
    h.enable();
    let beyond = MEM_SIZE as u64;
    for (what, prp1, prp2) in [
        ("unaligned prp1", SHADOW + 4, EVENTIDX),
        ("unaligned prp2", SHADOW, EVENTIDX + 0x800),
        ("prp1 == prp2", SHADOW, SHADOW),
        ("unmapped prp1", beyond, EVENTIDX),
        ("unmapped prp2", SHADOW, beyond + 0x1000),
    ] {
        let c = h.dbbuf_config(prp1, prp2);
        assert_eq!(c.status(), Status::INVALID_FIELD.with_dnr(true), "{what}");
    }
    assert_eq!(h.ctrl.stats().dbbuf_configs, 0);
    // Still usable after the failures.
    h.enable_dbbuf();
    assert_eq!(h.ctrl.stats().dbbuf_configs, 1);
}

#[test]
fn dbbuf_is_advertised_only_in_shadow_modes() {
    for mode in DoorbellMode::ALL {
        let mut h = Host::with_mode(mode);
        h.enable();
        let c = h.admin(identify(1, 0, DATA));
        assert!(c.status().is_success());
        let id = IdentifyController::read_from_bytes(&h.read_mem(DATA, 4096)).unwrap();
        let advertised = id.oacs.get() & (1 << 8) != 0;
        assert_eq!(advertised, mode.uses_dbbuf(), "{mode}");
        let c = h.dbbuf_config(SHADOW, EVENTIDX);
        let expect = if mode.uses_dbbuf() {
            Status::SUCCESS
        } else {
            Status::INVALID_OPCODE.with_dnr(true)
        };
        assert_eq!(c.status(), expect, "{mode}");
    }
}

#[test]
fn dbbuf_after_io_queues_exist_seeds_current_values() {
    let mut h = Host::with_mode(DoorbellMode::Shadow);
    h.enable();
    h.create_pair(1, 16);
    for _ in 0..3 {
        assert!(h
            .submit(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0))
            .status()
            .is_success());
    }
    h.enable_dbbuf();
    // SQ 1 tail and CQ 1 head are 3; EventIdx equal so the next move traps.
    assert_eq!(h.shadow_slot(2), 3);
    assert_eq!(h.shadow_slot(3), 3);
    assert_eq!(h.eventidx_slot(2), 3);
    assert_eq!(h.eventidx_slot(3), 3);
    let before = h.ctrl.stats().queue(1);
    assert!(h
        .submit(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0))
        .status()
        .is_success());
    let after = h.ctrl.stats().queue(1);
    assert_eq!(after.sq_doorbell_traps - before.sq_doorbell_traps, 1);
    assert!(after.shadow_reads > 0);
    assert!(after.eventidx_writes > 0);
}

#[test]
fn queue_creation_zeroes_stale_shadow_slots() {
    let mut h = Host::with_mode(DoorbellMode::Shadow);
    h.enable();
    h.enable_dbbuf();
    for index in [2, 3] {
        h.mem
            .store_u32(GuestAddress(SHADOW + index * 4), 0x1234)
            .unwrap();
        h.mem
            .store_u32(GuestAddress(EVENTIDX + index * 4), 0x5678)
            .unwrap();
    }
    h.create_pair(1, 16);
    for index in [2, 3] {
        assert_eq!(h.shadow_slot(index), 0, "shadow {index}");
        assert_eq!(h.eventidx_slot(index), 0, "eventidx {index}");
    }
    for _ in 0..20 {
        assert!(h
            .submit(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0))
            .status()
            .is_success());
    }
}

#[test]
fn traps_on_the_admin_queue_update_its_shadow_slots() {
    let mut h = Host::with_mode(DoorbellMode::Adaptive);
    h.enable();
    h.enable_dbbuf();
    // The admin queue keeps using the registers (like Linux).
    for _ in 0..3 {
        assert!(h.admin(identify(1, 0, DATA)).status().is_success());
    }
    let r = h.rings[0].unwrap();
    assert_eq!(h.shadow_slot(0), u32::from(r.tail));
    assert_eq!(h.shadow_slot(1), u32::from(r.head));
}

#[test]
fn reset_drops_the_buffers() {
    let mut h = Host::with_mode(DoorbellMode::Shadow);
    h.enable();
    h.enable_dbbuf();
    h.create_pair(1, 16);
    assert!(h
        .submit(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0))
        .status()
        .is_success());
    h.write32(offset::CC, 0);
    assert!(!h.csts().rdy());
    h.dbbuf = None;
    h.mem.zero(GuestAddress(ACQ), 4096).unwrap();
    h.enable();
    // Stale values in the old buffers: the controller no longer touches them.
    h.mem.store_u32(GuestAddress(SHADOW + 8), 0xAB).unwrap();
    h.mem.store_u32(GuestAddress(EVENTIDX + 8), 0xCD).unwrap();
    h.create_pair(1, 16);
    assert_eq!(h.shadow_slot(2), 0xAB);
    assert_eq!(h.eventidx_slot(2), 0xCD);
    // A shadow-only tail update is not seen; the register write is.
    h.push(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0));
    h.mem.store_u32(GuestAddress(SHADOW + 8), 1).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert!(
        h.peek_cqe(1).is_none(),
        "shadow write without trap is not seen"
    );
    let reads = h.ctrl.stats().queue(1).shadow_reads;
    h.ring_sq(1);
    assert!(h.reap(1).status().is_success());
    assert_eq!(h.ctrl.stats().queue(1).shadow_reads, reads);
}

/// Guest memory with a hole the test can open: the client unmapped it.
#[derive(Debug)]
struct HoleyMemory {
    inner: Arc<VecMemory>,
    hole: Mutex<Option<Range<u64>>>,
}

impl HoleyMemory {
    fn check(&self, addr: GuestAddress, len: u64) -> Result<(), DmaError> {
        let a = addr.raw();
        match &*self.hole.lock() {
            Some(h) if a < h.end && a.saturating_add(len) > h.start => {
                Err(DmaError::Unmapped { addr, len })
            }
            _ => Ok(()),
        }
    }
}

impl GuestMemory for HoleyMemory {
    fn read(&self, addr: GuestAddress, buf: &mut [u8]) -> Result<(), DmaError> {
        self.check(addr, buf.len() as u64)?;
        self.inner.read(addr, buf)
    }
    fn write(&self, addr: GuestAddress, buf: &[u8]) -> Result<(), DmaError> {
        self.check(addr, buf.len() as u64)?;
        self.inner.write(addr, buf)
    }
    fn zero(&self, addr: GuestAddress, len: u64) -> Result<(), DmaError> {
        self.check(addr, len)?;
        self.inner.zero(addr, len)
    }
    fn load_u32(&self, addr: GuestAddress) -> Result<u32, DmaError> {
        self.check(addr, 4)?;
        self.inner.load_u32(addr)
    }
    fn store_u32(&self, addr: GuestAddress, value: u32) -> Result<(), DmaError> {
        self.check(addr, 4)?;
        self.inner.store_u32(addr, value)
    }
}

#[test]
fn unmapped_shadow_buffers_never_crash_or_hang() {
    for mode in [DoorbellMode::Shadow, DoorbellMode::Adaptive] {
        let mut h = Host::with_mode(mode);
        let holey = Arc::new(HoleyMemory {
            inner: h.mem.clone(),
            hole: Mutex::new(None),
        });
        h.ctrl.attach(holey.clone(), h.irq.clone());
        h.enable();
        h.enable_dbbuf();
        h.create_pair(1, 16);
        assert!(h
            .submit(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0))
            .status()
            .is_success());
        // The client unmaps both buffers.
        *holey.hole.lock() = Some(SHADOW..EVENTIDX + 0x1000);
        // The host's shadow writes fail too: ring the register directly.
        h.push(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0));
        h.write32(0x1008, 2);
        std::thread::sleep(Duration::from_millis(20));
        assert!(h.peek_cqe(1).is_none(), "{mode}: no new work seen");
        let s = h.ctrl.stats();
        assert!(s.shadow_errors > 0, "{mode}");
        assert!(!h.csts().cfs(), "{mode}: no fatal status");
        // The admin queue reads its (unreachable) shadow too; a reset, by
        // register, recovers everything.
        h.dbbuf = None;
        h.write32(offset::CC, 0);
        assert!(!h.csts().rdy());
        *holey.hole.lock() = None;
        h.mem.zero(GuestAddress(ACQ), 4096).unwrap();
        h.enable();
        h.create_pair(1, 16);
        assert!(h
            .submit(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0))
            .status()
            .is_success());
    }
}
