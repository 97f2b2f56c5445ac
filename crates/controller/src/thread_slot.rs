//! A small number for each thread that counts, unique among the threads
//! alive: a counter kept in one slot per thread ([`crate::stats`]'s
//! namespace counters) is then added to by one thread only, with a plain
//! load and store instead of a locked add.
//!
//! A thread takes its number on first use and gives it back when it ends,
//! so threads that come and go (a controller's workers after a reset) reuse
//! numbers instead of running past [`SLOTS`]. Numbers go back through a
//! mutex, so the thread that takes a number next sees every store its last
//! holder made.

use std::sync::Mutex;

/// Slots a per-thread counter keeps; threads beyond these count in a shared
/// slot with locked adds.
pub(crate) const SLOTS: usize = 32;

/// Numbers given back by threads that ended, and the next never given.
static NUMBERS: Mutex<Numbers> = Mutex::new(Numbers::new());

struct Numbers {
    free: Vec<usize>,
    next: usize,
}

impl Numbers {
    const fn new() -> Self {
        Numbers {
            free: Vec::new(),
            next: 0,
        }
    }

    /// A number no holder has, the latest given back first.
    fn take(&mut self) -> Option<usize> {
        if let Some(i) = self.free.pop() {
            return Some(i);
        }
        (self.next < SLOTS).then(|| {
            self.next += 1;
            self.next - 1
        })
    }

    fn give_back(&mut self, i: usize) {
        self.free.push(i);
    }
}

fn numbers() -> std::sync::MutexGuard<'static, Numbers> {
    // A panic while holding this lock left the list whole (push and pop
    // only), so a poisoned lock is still good.
    NUMBERS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The number a thread holds, given back when its thread ends.
struct Lease(Option<usize>);

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(i) = self.0 {
            numbers().give_back(i);
        }
    }
}

thread_local! {
    static LEASE: Lease = Lease(numbers().take());
}

/// This thread's slot, below [`SLOTS`]; `None` when every slot is held by
/// a living thread (or this thread is ending).
#[inline]
pub(crate) fn current() -> Option<usize> {
    LEASE.try_with(|l| l.0).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_given_once_until_given_back_then_none_past_the_slots() {
        let mut n = Numbers::new();
        let all: Vec<_> = (0..SLOTS).map(|_| n.take()).collect();
        assert_eq!(all, (0..SLOTS).map(Some).collect::<Vec<_>>());
        assert_eq!(n.take(), None, "every slot held");
        n.give_back(5);
        assert_eq!(n.take(), Some(5));
        assert_eq!(n.take(), None);
    }

    #[test]
    fn two_living_threads_hold_different_slots() {
        let mine = current();
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            tx.send(current()).unwrap();
            // Stay alive until compared, so the slot cannot be reused.
            done_rx.recv().ok();
        });
        let theirs = rx.recv().unwrap();
        assert_eq!(current(), mine, "a thread keeps its slot");
        if mine.is_some() {
            assert_ne!(theirs, mine);
        }
        drop(done_tx);
        other.join().unwrap();
    }
}
