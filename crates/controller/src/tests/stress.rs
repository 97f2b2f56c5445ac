//! Lost wake-up stress: adaptive mode, a host submitting and reaping
//! through the shadow doorbells with the need-event tests, random pauses on
//! both sides so the worker keeps going from polling to armed-and-asleep.
//! Progress never depends on a timeout: the watchdog only fails the test.

use std::sync::atomic::{AtomicU64, Ordering};

use vnvme_blockdev::{BlockError, NullDevice};

use super::*;

/// I/Os in the stress test.
const IOS: u64 = 1_000_000;

fn xorshift(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}

/// A null namespace whose flushes sometimes pause (spin or yield).
#[derive(Debug)]
struct Jittery {
    inner: NullDevice,
    seed: AtomicU64,
}

impl BlockDevice for Jittery {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), BlockError> {
        self.inner.write(offset, buf)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        self.inner.write_zeroes(offset, len)
    }
    fn flush(&self) -> Result<(), BlockError> {
        let mut s = self.seed.load(Ordering::Relaxed);
        let r = xorshift(&mut s);
        self.seed.store(s, Ordering::Relaxed);
        match r % 256 {
            0 => std::thread::yield_now(),
            1..=3 => {
                for _ in 0..(r >> 8) % 2000 {
                    std::hint::spin_loop();
                }
            }
            _ => {}
        }
        Ok(())
    }
}

#[test]
fn adaptive_mode_never_loses_a_wakeup() {
    let backend = Arc::new(Jittery {
        inner: NullDevice::new(NS_BLOCKS * 512),
        seed: AtomicU64::new(0x9E37_79B9_7F4A_7C15),
    });
    let config = ControllerConfig {
        // Short, so the worker dozes, arms EventIdx and sleeps often.
        idle_poll: Duration::from_micros(5),
        doze: Duration::from_micros(30),
        ..mode_config(DoorbellMode::Adaptive)
    };
    let mut h = Host::enabled_on(config, backend);
    h.enable_dbbuf();
    h.create_pair(1, 32);
    let mut flush = cmd(NvmOpcode::FLUSH.0);
    flush.nsid = U32::new(1);
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut done = 0u64;
    let mut host_traps = 0u64;
    let mut batch = 0u64;
    while done < IOS {
        let r = xorshift(&mut rng);
        let n = ((r % 8) + 1).min(IOS - done) as usize;
        h.spdk = batch % 2 == 1;
        let cids: Vec<u16> = (0..n).map(|_| h.push(1, flush)).collect();
        host_traps += u64::from(h.ring_sq(1));
        for (i, cid) in cids.into_iter().enumerate() {
            let waiting_since = Instant::now();
            let mut spins = 0u32;
            let cqe = loop {
                if let Some(c) = h.peek_cqe(1) {
                    break c;
                }
                spins += 1;
                if spins.is_multiple_of(64) {
                    std::thread::yield_now();
                    if spins.is_multiple_of(4096) {
                        let stuck = waiting_since.elapsed();
                        assert!(
                            stuck < Duration::from_secs(10),
                            "lost wake-up: I/O {done} (batch {batch}, entry {i}) never completed; stats {:?}",
                            h.ctrl.stats()
                        );
                    }
                } else {
                    std::hint::spin_loop();
                }
            };
            assert_eq!(cqe.cid(), cid);
            assert!(cqe.status().is_success());
            h.advance_head(1);
            done += 1;
        }
        host_traps += u64::from(h.ring_cq(1));
        // Host-side pauses: sometimes long enough for the worker to sleep.
        match (r >> 8) % 64 {
            0 => std::thread::sleep(Duration::from_micros((r >> 16) % 50)),
            1..=4 => std::thread::yield_now(),
            _ => {}
        }
        batch += 1;
    }
    let s = h.ctrl.stats();
    let q = s.queue(1);
    assert_eq!(q.commands, IOS);
    assert_eq!(q.errors, 0);
    assert_eq!(q.sq_doorbell_traps + q.cq_doorbell_traps, host_traps);
    // The worker did sleep and was woken by traps, many times.
    assert!(s.eventidx_arms > 0, "{s:?}");
    assert!(q.sq_doorbell_traps > 0, "{s:?}");
    eprintln!(
        "stress: {IOS} I/Os in {batch} batches, {} SQ traps, {} CQ traps, {} wake-ups, {} arms",
        q.sq_doorbell_traps, q.cq_doorbell_traps, s.worker_wakeups, s.eventidx_arms
    );
}
