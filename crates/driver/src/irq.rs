//! Which MSI-X vector each queue completes to, and waiting on a vector that
//! several queues share.
//!
//! With at least one vector per queue (admin + N I/O), I/O queue `qid` gets
//! vector `qid` and the admin queue vector 0 alone. With fewer, I/O queue
//! `qid` gets vector `(qid - 1) % vectors`: the admin queue shares vector 0
//! with I/O queue 1 (as the nvmewin fast-init patch does), and the others
//! wrap around.
//!
//! A vector is one eventfd whose counter the first reader consumes. When two
//! queues owned by two threads share it, a signal meant for one can be
//! consumed by the other, and a thread that checked its CQ just before and
//! then sleeps on the eventfd would sleep through its own completion. So a
//! shared vector (`SharedVector`) has one poller at a time, which bumps an
//! epoch under a lock after consuming a signal and wakes every sharer; a
//! sharer takes a ticket (`QueueIrq::ticket`) before checking its CQ and does
//! not sleep if the epoch moved since: it checks its CQ again instead.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::access::Interrupt;

/// The vector of I/O queue `qid` (1-based) when `queues` I/O queues share
/// `vectors` granted vectors; `None` (polled) without vectors.
pub fn io_vector(qid: u16, queues: u16, vectors: u16) -> Option<u16> {
    match vectors {
        0 => None,
        v if v > queues => Some(qid),
        v => Some(qid.saturating_sub(1) % v),
    }
}

/// The interrupt a queue waits on.
#[derive(Debug)]
pub(crate) enum QueueIrq {
    /// The queue's own vector.
    Own(Interrupt),
    /// A vector shared with other queues.
    Shared(Arc<SharedVector>),
}

/// One eventfd shared by several queues (see the module documentation).
#[derive(Debug)]
pub(crate) struct SharedVector {
    irq: Interrupt,
    state: Mutex<SharedState>,
    woken: Condvar,
}

#[derive(Debug, Default)]
struct SharedState {
    /// Signals consumed so far.
    epoch: u64,
    /// A sharer is inside `poll` on the eventfd.
    polling: bool,
}

impl QueueIrq {
    pub fn vector(&self) -> u16 {
        match self {
            Self::Own(irq) => irq.vector(),
            Self::Shared(s) => s.irq.vector(),
        }
    }

    pub fn is_shared(&self) -> bool {
        matches!(self, Self::Shared(_))
    }

    /// Taken before checking the CQ, handed to [`wait`](Self::wait) after.
    pub fn ticket(&self) -> u64 {
        match self {
            Self::Own(_) => 0,
            Self::Shared(s) => s.state.lock().epoch,
        }
    }

    /// Waits up to `timeout` for the vector. Returns true when the caller
    /// should check its CQ again: the interrupt fired, or (shared) a signal
    /// was consumed by any sharer since `ticket` was taken.
    pub fn wait(&self, ticket: u64, timeout: Duration) -> io::Result<bool> {
        match self {
            Self::Own(irq) => irq.wait(timeout),
            Self::Shared(s) => s.wait(ticket, timeout),
        }
    }
}

impl SharedVector {
    fn wait(&self, ticket: u64, timeout: Duration) -> io::Result<bool> {
        let mut st = self.state.lock();
        if st.epoch != ticket {
            return Ok(true);
        }
        if st.polling {
            // The poller bumps the epoch and notifies under this lock, so
            // the wake cannot fall between the check above and this wait.
            self.woken.wait_for(&mut st, timeout);
            return Ok(st.epoch != ticket);
        }
        st.polling = true;
        drop(st);
        let fired = self.irq.wait(timeout);
        let mut st = self.state.lock();
        st.polling = false;
        if matches!(fired, Ok(true)) {
            st.epoch = st.epoch.wrapping_add(1);
        }
        // Also when nothing fired: a waiter takes over polling.
        self.woken.notify_all();
        fired.map(|f| f || st.epoch != ticket)
    }
}

/// Gives each queue its interrupt: `vectors[0]` is the admin queue's, and
/// I/O queues `1..=queues` get [`io_vector`]. Returns the admin queue's
/// interrupt and the I/O queues' in qid order; vectors used by more than
/// one queue become [`QueueIrq::Shared`], unused ones are dropped.
pub(crate) fn assign(
    vectors: Vec<Interrupt>,
    queues: u16,
) -> (Option<QueueIrq>, Vec<Option<QueueIrq>>) {
    let n = u16::try_from(vectors.len()).unwrap_or(u16::MAX);
    let mut users = vec![0u32; vectors.len()];
    if let Some(u) = users.first_mut() {
        *u += 1;
    }
    for qid in 1..=queues {
        if let Some(u) = io_vector(qid, queues, n).and_then(|v| users.get_mut(usize::from(v))) {
            *u += 1;
        }
    }
    enum Slot {
        Own(Option<Interrupt>),
        Shared(Arc<SharedVector>),
    }
    let mut slots: Vec<Slot> = vectors
        .into_iter()
        .zip(&users)
        .map(|(irq, &u)| {
            if u > 1 {
                Slot::Shared(Arc::new(SharedVector {
                    irq,
                    state: Mutex::new(SharedState::default()),
                    woken: Condvar::new(),
                }))
            } else {
                Slot::Own(Some(irq))
            }
        })
        .collect();
    let mut take = |v: u16| -> Option<QueueIrq> {
        match slots.get_mut(usize::from(v))? {
            Slot::Own(irq) => irq.take().map(QueueIrq::Own),
            Slot::Shared(s) => Some(QueueIrq::Shared(Arc::clone(s))),
        }
    };
    let admin = take(0);
    let io = (1..=queues)
        .map(|qid| io_vector(qid, queues, n).and_then(&mut take))
        .collect();
    (admin, io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enough_vectors_give_each_queue_its_own() {
        assert_eq!(io_vector(1, 4, 5), Some(1));
        assert_eq!(io_vector(4, 4, 5), Some(4));
        assert_eq!(io_vector(1, 4, 0), None);
    }

    #[test]
    fn fewer_vectors_share_vector_0_with_io_queue_1() {
        let v: Vec<_> = (1..=6).map(|q| io_vector(q, 6, 4)).collect();
        assert_eq!(v, [0, 1, 2, 3, 0, 1].map(Some));
        assert_eq!(io_vector(3, 3, 1), Some(0));
    }

    #[test]
    fn assign_shares_only_vectors_with_several_users() {
        let vectors = (0..3).map(|v| Interrupt::new(v).unwrap()).collect();
        let (admin, io) = assign(vectors, 4);
        let admin = admin.unwrap();
        assert!(admin.is_shared());
        let io: Vec<_> = io.into_iter().map(Option::unwrap).collect();
        let shape: Vec<_> = io.iter().map(|q| (q.vector(), q.is_shared())).collect();
        // Vectors 1 and 2 have one queue each; 0 has the admin queue, 1 and 4.
        assert_eq!(shape, [(0, true), (1, false), (2, false), (0, true)]);
    }

    #[test]
    fn a_signal_consumed_by_one_sharer_wakes_the_other() {
        let vectors = vec![Interrupt::new(0).unwrap()];
        let (admin, io) = assign(vectors, 1);
        let (a, b) = (admin.unwrap(), io.into_iter().next().flatten().unwrap());
        let QueueIrq::Shared(s) = &a else {
            panic!("vector 0 is shared")
        };
        // b checked its CQ (empty) with this ticket, then a consumed the
        // signal meant for b: b must not sleep.
        let ticket = b.ticket();
        s.irq.signal().unwrap();
        assert!(a.wait(a.ticket(), Duration::from_secs(1)).unwrap());
        assert!(b.wait(ticket, Duration::from_secs(5)).unwrap());
    }

    #[test]
    fn both_sharers_asleep_are_woken_by_one_signal() {
        let vectors = vec![Interrupt::new(0).unwrap()];
        let (admin, io) = assign(vectors, 1);
        let (a, b) = (admin.unwrap(), io.into_iter().next().flatten().unwrap());
        let QueueIrq::Shared(s) = &a else {
            panic!("vector 0 is shared")
        };
        let s = Arc::clone(s);
        // Both checked their CQs before the signal; one polls the eventfd,
        // the other waits behind it (or starts late and sees the epoch).
        let (ta, tb) = (a.ticket(), b.ticket());
        std::thread::scope(|scope| {
            let wa = scope.spawn(|| a.wait(ta, Duration::from_secs(5)).unwrap());
            let wb = scope.spawn(|| b.wait(tb, Duration::from_secs(5)).unwrap());
            std::thread::sleep(Duration::from_millis(20));
            s.irq.signal().unwrap();
            assert!(wa.join().unwrap());
            assert!(wb.join().unwrap());
        });
    }
}
