//! Interrupt batching of the polling modes (`ControllerConfig::irq_batch`):
//! counted interrupts for a host that reaps before it submits again and for
//! one that keeps the queue deep.

use super::*;

/// Adaptive, shadow doorbells on, a worker that keeps polling (or arms and
/// sleeps at once, with `idle_poll` zero), interrupts held up to `hold`.
fn batching(hold: Duration, idle_poll: Duration) -> Host {
    let mut h = Host::with(
        ControllerConfig {
            idle_poll,
            doze: Duration::ZERO,
            irq_batch: hold,
            ..mode_config(DoorbellMode::Adaptive)
        },
        512,
    );
    h.enable();
    h.enable_dbbuf();
    h.create_pair(1, 64);
    h
}

/// Submits one read on queue 1 and waits until the controller ran it,
/// without reaping its completion.
fn submit_unreaped(h: &mut Host) {
    let before = h.ctrl.stats().queue(1).commands;
    h.push(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0));
    h.ring_sq(1);
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.ctrl.stats().queue(1).commands == before && Instant::now() < deadline {
        std::thread::yield_now();
    }
    assert_eq!(h.ctrl.stats().queue(1).commands, before + 1, "command run");
}

/// Waits until vector 1 (CQ 1's, see `create_pair`) has signalled `n`
/// times in all; returns the count then (or after 5 s).
fn wait_irqs(h: &Host, n: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.irq.count(1) < n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(100));
    }
    h.irq.count(1)
}

#[test]
fn queue_depth_one_gets_an_interrupt_per_completion() {
    // A hold longer than the test: an interrupt held would never come.
    let mut h = batching(Duration::from_secs(3600), Duration::from_secs(3600));
    let before = h.irq.count(1);
    for i in 1..=20 {
        assert!(h
            .submit(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0))
            .status()
            .is_success());
        assert_eq!(wait_irqs(&h, before + i), before + i, "completion {i}");
    }
}

#[test]
fn a_deep_queue_shares_interrupts() {
    let mut h = batching(Duration::from_secs(3600), Duration::from_secs(3600));
    // The first completion is signalled at once; the host submits again
    // before it reaps it: the queue counts as deep, and the next fifteen
    // completions share one interrupt, raised at the sixteenth.
    for _ in 0..16 {
        submit_unreaped(&mut h);
    }
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(h.irq.count(1), 1, "fifteen held");
    submit_unreaped(&mut h);
    assert_eq!(wait_irqs(&h, 2), 2, "the sixteenth raises");
    // The host reaps everything, then submits with nothing signalled left
    // unreaped: the queue stops counting as deep at the fourth such
    // submission, whose interrupt takes the three held before it.
    h.reap_batch(1, 17);
    for _ in 0..3 {
        submit_unreaped(&mut h);
    }
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(h.irq.count(1), 2, "three held");
    submit_unreaped(&mut h);
    assert_eq!(wait_irqs(&h, 3), 3);
}

#[test]
fn a_held_interrupt_comes_after_the_batch_time_even_asleep() {
    for idle_poll in [Duration::from_secs(3600), Duration::ZERO] {
        let mut h = batching(Duration::from_millis(500), idle_poll);
        for _ in 0..10 {
            submit_unreaped(&mut h);
        }
        // An interrupt for the first, then the other nine wait, at most
        // 500 ms, whether the worker polls or sleeps (its coalescing
        // timer).
        assert_eq!(h.irq.count(1), 1, "idle_poll {idle_poll:?}");
        assert_eq!(wait_irqs(&h, 2), 2, "idle_poll {idle_poll:?}");
        let cqes = h.reap_batch(1, 10);
        assert!(cqes.iter().all(|c| c.status().is_success()));
    }
}

#[test]
fn zero_batch_time_raises_for_every_pass() {
    let mut h = batching(Duration::ZERO, Duration::from_secs(3600));
    for i in 1..=10 {
        submit_unreaped(&mut h);
        assert_eq!(wait_irqs(&h, i), i);
    }
}
