//! The four doorbell modes, counted: traps per submission batch and per
//! reaped batch, EventIdx choices, the need-event tests.

use std::sync::atomic::{AtomicBool, Ordering};

use proptest::prelude::*;
use vnvme_blockdev::BlockError;

use super::*;
use crate::doorbell::behind;
use crate::{DoorbellPage, HeapDoorbellPage};

#[test]
fn doorbell_mode_names_round_trip() {
    for mode in DoorbellMode::ALL {
        assert_eq!(mode.to_string().parse::<DoorbellMode>(), Ok(mode));
    }
    assert_eq!(DoorbellMode::default(), DoorbellMode::Adaptive);
    assert!("mmap".parse::<DoorbellMode>().is_err());
}

#[test]
fn trap_mode_one_sq_trap_per_batch_and_one_cq_trap_per_reap() {
    let mut h = Host::with_mode(DoorbellMode::Trap);
    h.enable();
    h.create_pair(1, 16);
    assert_eq!(
        h.dbbuf_config(SHADOW, EVENTIDX).status(),
        Status::INVALID_OPCODE.with_dnr(true)
    );
    for _ in 0..4 {
        for _ in 0..3 {
            h.push(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0));
        }
        assert!(h.ring_sq(1));
        for c in h.reap_batch(1, 3) {
            assert!(c.status().is_success());
        }
    }
    let q = h.ctrl.stats().queue(1);
    assert_eq!(q.sq_doorbell_traps, 4);
    assert_eq!(q.cq_doorbell_traps, 4);
    assert_eq!(q.commands, 12);
    assert_eq!(q.shadow_reads, 0);
    assert_eq!(q.eventidx_writes, 0);
}

/// A namespace whose reads wait while the gate is closed: a busy controller.
#[derive(Debug)]
struct Gated {
    inner: RamDevice,
    closed: AtomicBool,
    entered: AtomicBool,
}

impl BlockDevice for Gated {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        self.entered.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.closed.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::yield_now();
        }
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), BlockError> {
        self.inner.write(offset, buf)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        self.inner.write_zeroes(offset, len)
    }
}

#[test]
fn shadow_mode_busy_controller_takes_many_submissions_for_one_trap() {
    let gated = Arc::new(Gated {
        inner: RamDevice::new(NS_BLOCKS * 512),
        closed: AtomicBool::new(true),
        entered: AtomicBool::new(false),
    });
    let mut h = Host::enabled_on(mode_config(DoorbellMode::Shadow), gated.clone());
    h.enable_dbbuf();
    h.create_pair(1, 16);
    // The first submission traps (EventIdx 0) and the worker blocks in it.
    h.push(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0));
    assert!(h.ring_sq(1));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !gated.entered.load(Ordering::SeqCst) && Instant::now() < deadline {
        std::thread::yield_now();
    }
    // Six more while it is busy: EventIdx is still behind them, no trap.
    for _ in 0..6 {
        h.push(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0));
        assert!(!h.ring_sq(1));
    }
    gated.closed.store(false, Ordering::SeqCst);
    // The worker publishes EventIdx, fences, re-reads the shadow: all 7 run.
    for c in h.reap_batch(1, 7) {
        assert!(c.status().is_success());
    }
    let q = h.ctrl.stats().queue(1);
    assert_eq!(q.sq_doorbell_traps, 1);
    assert_eq!(q.commands, 7);
    // QEMU's CQ EventIdx = head after posting: the reaped batch traps once.
    assert_eq!(q.cq_doorbell_traps, 1);
}

/// Adaptive mode whose I/O worker (worker 1, the only one) runs one round
/// at a time, when the test says so: the host's doorbell updates and the
/// worker's passes never overlap, so every count below is exact whatever
/// the host's speed. (Free-running, they race: the host may read EventIdx
/// after the worker has already seen its new tail and published one behind
/// it, and trap for nothing; `vnvme bench` measures that, and
/// `tests/stress.rs` that no wake-up is lost.)
fn adaptive_stepped(idle_poll: Duration, doze: Duration) -> Host {
    let mut h = Host::with(
        ControllerConfig {
            idle_poll,
            doze,
            ..mode_config(DoorbellMode::Adaptive)
        },
        512,
    );
    h.ctrl.worker_steps(1).start();
    h.enable();
    h.enable_dbbuf();
    h
}

#[test]
fn adaptive_mode_busy_worker_needs_no_traps() {
    for spdk in [false, true] {
        // A poll window far longer than the test: the worker never arms.
        let mut h = adaptive_stepped(Duration::from_secs(3600), Duration::ZERO);
        h.spdk = spdk;
        h.create_pair(1, 16);
        let mut traps = 0;
        let mut wraps = 0;
        for i in 0..100u32 {
            // Batches of 1..=4 across several ring wraps.
            let n = (i % 4 + 1) as usize;
            let before = h.rings[1].unwrap().tail;
            for _ in 0..n {
                h.push(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0));
            }
            wraps += u64::from(h.rings[1].unwrap().tail < before);
            traps += u32::from(h.ring_sq(1));
            // The worker's round: kicked by the first trap, then polling.
            h.ctrl.worker_steps(1).round();
            for c in h.reap_batch(1, n) {
                assert!(c.status().is_success());
            }
        }
        let s = h.ctrl.stats();
        let q = s.queue(1);
        assert!(wraps >= 10, "{wraps} wraps");
        // Only the first submission traps: EventIdx starts at 0 (zeroed at
        // creation). After it every pass publishes SQ EventIdx one behind
        // the tail it read before it posts a completion, and CQ EventIdx
        // one behind the head, so no later move, not even across a ring
        // wrap, passes either under Linux's or SPDK's need-event test.
        // Trap mode would trap 100 times here.
        assert_eq!(traps, 1, "spdk {spdk}: {wraps} wraps");
        assert_eq!(q.sq_doorbell_traps, 1, "spdk {spdk}");
        assert_eq!(q.cq_doorbell_traps, 0, "spdk {spdk}");
        assert_eq!(s.eventidx_arms, 0, "spdk {spdk}");
        assert_eq!(q.commands, 250);
        assert!(q.shadow_reads > 0);
    }
}

/// The polling knobs (`--idle-poll-us`, `--doze-us`) decide when a host at
/// queue depth 1 traps: with neither a poll window nor a doze the worker
/// arms EventIdx in its first round without work, so every submission
/// traps; with either it still polls when the next command comes, so only
/// the first does. (The admin worker arms too, in its own time: the
/// EventIdx slot shows this worker's choice. How often a free-running host beats the arming is a
/// matter of timing: `vnvme bench --qd 1 --idle-poll-us 0 --doze-us 0`
/// reports it as traps per I/O.)
#[test]
fn adaptive_mode_poll_window_and_doze_decide_when_a_qd1_host_traps() {
    const IOS: u64 = 20;
    let hour = Duration::from_secs(3600);
    let zero = Duration::ZERO;
    for (idle_poll, doze, every_io_traps) in
        [(zero, zero, true), (hour, zero, false), (zero, hour, false)]
    {
        let mut h = adaptive_stepped(idle_poll, doze);
        h.create_pair(1, 16);
        for i in 0..IOS {
            h.push(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0));
            let trapped = h.ring_sq(1);
            assert_eq!(
                trapped,
                i == 0 || every_io_traps,
                "I/O {i}, idle_poll {idle_poll:?}, doze {doze:?}"
            );
            // A round that runs the command, then one without work: armed
            // after it, EventIdx is the tail; still polling, one behind.
            h.ctrl.worker_steps(1).round();
            assert!(h.reap(1).status().is_success());
            h.ctrl.worker_steps(1).round();
            let tail = h.rings[1].unwrap().tail;
            let armed = if every_io_traps { tail } else { behind(tail) };
            assert_eq!(h.eventidx_slot(2), u32::from(armed), "I/O {i}");
        }
        let s = h.ctrl.stats();
        let traps = if every_io_traps { IOS } else { 1 };
        let case = format!("idle_poll {idle_poll:?}, doze {doze:?}");
        assert_eq!(s.queue(1).sq_doorbell_traps, traps, "{case}");
        assert_eq!(s.queue(1).cq_doorbell_traps, 0, "{case}");
        assert_eq!(s.queue(1).commands, IOS, "{case}");
    }
}

#[test]
fn adaptive_mode_idle_worker_arms_eventidx_then_a_trap_wakes_it() {
    // No poll window, no doze: the worker arms in its first round without
    // work (the knobs' test above shows the window and the doze delay it).
    let mut h = adaptive_stepped(Duration::ZERO, Duration::ZERO);
    h.create_pair(1, 16);
    // The first command traps on EventIdx 0; its round runs it, the next
    // finds no work and arms.
    h.push(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0));
    assert!(h.ring_sq(1));
    h.ctrl.worker_steps(1).round();
    assert!(h.reap(1).status().is_success());
    for round in 1..=3u32 {
        h.ctrl.worker_steps(1).round();
        let tail = u32::from(h.rings[1].unwrap().tail);
        assert_eq!(h.eventidx_slot(2), tail, "round {round}: armed");
        // Asleep in its mailbox until its back-off ends (the doorbell page
        // is offered, and a client ringing there never traps); the look
        // that follows finds nothing and leaves EventIdx armed.
        h.ctrl.worker_steps(1).round_asleep();
        h.ctrl.worker_steps(1).finish();
        assert_eq!(h.eventidx_slot(2), tail, "round {round}: still armed");
        h.push(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0));
        assert!(h.ring_sq(1), "round {round}: an armed worker needs a trap");
        // The trap's kick: the next round runs it.
        h.ctrl.worker_steps(1).round();
        assert!(h.reap(1).status().is_success());
    }
    let s = h.ctrl.stats();
    assert_eq!(s.queue(1).sq_doorbell_traps, 4);
    assert_eq!(s.queue(1).cq_doorbell_traps, 0);
    assert_eq!(s.queue(1).commands, 4);
}

#[test]
fn mmap_poll_mode_serves_the_page_without_traps() {
    let page = Arc::new(HeapDoorbellPage::default());
    let backend = Arc::new(RamDevice::new(NS_BLOCKS * 512));
    let ctrl = Controller::with_doorbell_page(
        ControllerConfig {
            idle_poll: Duration::from_micros(20),
            ..mode_config(DoorbellMode::MmapPoll)
        },
        vec![NamespaceConfig::new(1, 512, backend)],
        Some(page.clone()),
    )
    .unwrap();
    let mut h = Host::new();
    h.ctrl = ctrl;
    h.ctrl.attach(h.mem.clone(), h.irq.clone());
    h.enable();
    h.create_pair(1, 16);
    let admin_traps = h.ctrl.stats().sq_doorbell_traps;
    for i in 0..40u32 {
        let n = (i % 3 + 1) as usize;
        for _ in 0..n {
            h.push(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0));
        }
        // The guest's store to the mapped page.
        page.store(2, u32::from(h.rings[1].unwrap().tail));
        for _ in 0..n {
            assert!(h.wait_cqe(1).is_some_and(|c| c.status().is_success()));
            h.advance_head(1);
        }
        page.store(3, u32::from(h.rings[1].unwrap().head));
        // Sometimes let the worker back off to sleeping.
        if i % 8 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let s = h.ctrl.stats();
    assert_eq!(s.queue(1).sq_doorbell_traps, 0);
    assert_eq!(s.queue(1).cq_doorbell_traps, 0);
    assert_eq!(s.queue(1).commands, 79);
    assert_eq!(s.sq_doorbell_traps, admin_traps);
    // Register reads of doorbells read the page.
    assert_eq!(h.read32(0x1008), u32::from(h.rings[1].unwrap().tail));
    // OACS bit 8 is clear.
    assert!(h.admin(identify(1, 0, DATA)).status().is_success());
    let id = IdentifyController::read_from_bytes(&h.read_mem(DATA, 4096)).unwrap();
    assert_eq!(id.oacs.get() & (1 << 8), 0);
}

/// Ring positions a host can reach: it never has more than `size - 1`
/// entries the device has not seen (the device's head is at most `seen`).
fn ring_case() -> impl Strategy<Value = (u32, u32, u32, u32)> {
    (2u32..=65536).prop_flat_map(|size| {
        (Just(size), 0..size, 0..size)
            .prop_flat_map(|(size, seen, a)| (Just(size), Just(seen), Just(a), 0..size - a))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// With EventIdx kept at `seen - 1`, a host move from `old` (`a` ahead
    /// of `seen`) to `new` (`b` further) never traps with Linux's test, and
    /// with SPDK's at most when it fills the ring completely (not even then
    /// when `seen` is 0 and the ring is shorter than 2^16: `seen - 1` is
    /// 65535, beyond every ring position).
    #[test]
    fn eventidx_behind_never_needs_a_trap((size, seen, a, b) in ring_case()) {
        // A doorbell update moves the value (b = 0 rings nothing).
        prop_assume!(b > 0);
        let old = ((seen + a) % size) as u16;
        let new = ((seen + a + b) % size) as u16;
        let ei = behind(seen as u16);
        prop_assert!(!need_event_linux(ei, new, old));
        let full = a + b == size - 1;
        prop_assert!(!need_event_spdk(ei, new, old) || full);
        if full && (seen > 0 || size == 65536) {
            prop_assert!(need_event_spdk(ei, new, old));
        }
    }

    /// Armed (EventIdx = `seen`, the host at `seen`), the first move traps
    /// under both tests.
    #[test]
    fn eventidx_armed_always_traps_the_first_move((size, seen, _a, b) in ring_case()) {
        prop_assume!(b > 0);
        let old = seen as u16;
        let new = ((seen + b) % size) as u16;
        prop_assert!(need_event_linux(seen as u16, new, old));
        prop_assert!(need_event_spdk(seen as u16, new, old));
    }
}
