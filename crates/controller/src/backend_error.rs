//! Backend failures: the NVMe status a command gets for one, and the
//! rate-limited log that keeps its cause (the counters are in
//! [`crate::stats`]).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use vnvme_spec::Status;

/// What a command asked of its backend when the backend failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BackendOp {
    /// Read, Compare, or a vendor command reading blocks.
    Read,
    /// Write (with its flush when FUA or the write cache is off).
    Write,
    /// Write Zeroes (with its flush when FUA or the write cache is off).
    WriteZeroes,
    /// Write Zeroes with DEAC, or Dataset Management deallocate.
    Deallocate,
    /// Flush, or Set Features Volatile Write Cache turning the cache off.
    Flush,
    /// Format NVM erasing the namespace.
    Format,
    /// A sanitize operation erasing the namespace.
    Sanitize,
}

impl BackendOp {
    /// The status of the command (NVM Command Set §3.2: a read that fails
    /// on the medium is Unrecovered Read Error, a write Write Fault; a
    /// flush or format has no media error status of its own).
    pub fn status(self) -> Status {
        match self {
            BackendOp::Read => Status::UNRECOVERED_READ_ERROR,
            BackendOp::Write | BackendOp::WriteZeroes | BackendOp::Deallocate => {
                Status::WRITE_FAULT
            }
            BackendOp::Flush | BackendOp::Format | BackendOp::Sanitize => Status::INTERNAL_ERROR,
        }
        .with_dnr(true)
    }

    /// Whether the failure counts in SMART Media and Data Integrity Errors.
    pub fn is_media_error(self) -> bool {
        !matches!(
            self,
            BackendOp::Flush | BackendOp::Format | BackendOp::Sanitize
        )
    }
}

impl fmt::Display for BackendOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendOp::Read => "read",
            BackendOp::Write => "write",
            BackendOp::WriteZeroes => "write zeroes",
            BackendOp::Deallocate => "deallocate",
            BackendOp::Flush => "flush",
            BackendOp::Format => "format",
            BackendOp::Sanitize => "sanitize",
        })
    }
}

/// An error and its sources, `top: cause: root cause`: a log line's
/// `Display` of the error alone would stop at "backend I/O error".
pub(crate) struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(e) = source {
            write!(f, ": {e}")?;
            source = e.source();
        }
        Ok(())
    }
}

/// Lets one log line through per interval and counts those it holds
/// back: a backend failing every I/O, which a guest can drive at its own
/// rate, must not flood the log. Lock-free, so workers can share one.
#[derive(Debug)]
pub(crate) struct LogLimit {
    interval: Duration,
    epoch: Instant,
    /// Nanoseconds after `epoch` before which nothing more is let through.
    next: AtomicU64,
    held_back: AtomicU64,
}

impl LogLimit {
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            epoch: Instant::now(),
            next: AtomicU64::new(0),
            held_back: AtomicU64::new(0),
        }
    }

    /// `Some(n)`: log now, `n` lines having been held back since the last
    /// one logged; `None`: hold this one back.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let now = nanos(now.saturating_duration_since(self.epoch));
        let next = self.next.load(Relaxed);
        // Of workers failing at once, the one whose exchange wins logs.
        if now >= next
            && self
                .next
                .compare_exchange(
                    next,
                    now.saturating_add(nanos(self.interval)),
                    Relaxed,
                    Relaxed,
                )
                .is_ok()
        {
            return Some(self.held_back.swap(0, Relaxed));
        }
        self.held_back.fetch_add(1, Relaxed);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_limit_admits_one_per_interval_and_counts_the_rest() {
        let limit = LogLimit::new(Duration::from_secs(1));
        let t0 = limit.epoch;
        assert_eq!(limit.admit_at(t0), Some(0));
        assert_eq!(limit.admit_at(t0 + Duration::from_millis(10)), None);
        assert_eq!(limit.admit_at(t0 + Duration::from_millis(999)), None);
        assert_eq!(limit.admit_at(t0 + Duration::from_secs(1)), Some(2));
        assert_eq!(limit.admit_at(t0 + Duration::from_millis(1500)), None);
        assert_eq!(limit.admit_at(t0 + Duration::from_secs(5)), Some(1));
    }

    #[test]
    fn chain_shows_every_source() {
        let err = vnvme_blockdev::BlockError::Io(std::io::Error::other("disk on fire"));
        assert_eq!(Chain(&err).to_string(), "backend I/O error: disk on fire");
    }
}
