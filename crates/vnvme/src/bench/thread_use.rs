//! What the calling thread has used so far, from Linux's per-thread
//! accounting: CPU time (`/proc/thread-self/schedstat`, nanoseconds) and
//! voluntary context switches (`/proc/thread-self/status`), i.e. the times
//! it went to sleep. Over a benchmark point, divided by its I/Os, they say
//! what one command costs the submitting thread and how often it slept for
//! a completion, figures that the host's load moves far less than IOPS.

/// A reading of the calling thread's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadUse {
    /// Time on a CPU, in nanoseconds.
    pub cpu_ns: u64,
    /// Times the thread gave up the CPU to wait (a sleep in `poll`, a futex).
    pub sleeps: u64,
}

impl ThreadUse {
    /// The calling thread's counters; `None` where /proc does not have them.
    pub fn now() -> Option<Self> {
        let schedstat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
        let status = std::fs::read_to_string("/proc/thread-self/status").ok()?;
        Self::parse(&schedstat, &status)
    }

    fn parse(schedstat: &str, status: &str) -> Option<Self> {
        // "run time, wait time, timeslices": the first field.
        let cpu_ns = schedstat.split_whitespace().next()?.parse().ok()?;
        let sleeps = status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))?
            .trim()
            .parse()
            .ok()?;
        Some(Self { cpu_ns, sleeps })
    }

    /// What was used between `earlier` and `self`.
    pub fn since(self, earlier: Self) -> Self {
        Self {
            cpu_ns: self.cpu_ns.saturating_sub(earlier.cpu_ns),
            sleeps: self.sleeps.saturating_sub(earlier.sleeps),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_schedstat_and_status() {
        let status = "Name:\tx\nvoluntary_ctxt_switches:\t42\nnonvoluntary_ctxt_switches:\t7\n";
        assert_eq!(
            ThreadUse::parse("150615 22973 3\n", status),
            Some(ThreadUse {
                cpu_ns: 150_615,
                sleeps: 42
            })
        );
        assert_eq!(ThreadUse::parse("", status), None);
        assert_eq!(ThreadUse::parse("1 2 3", "Name:\tx\n"), None);
    }

    #[test]
    fn a_sleeping_thread_counts_its_sleeps() {
        let before = ThreadUse::now().expect("Linux /proc");
        for _ in 0..3 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let used = ThreadUse::now().expect("Linux /proc").since(before);
        assert_eq!(used.sleeps, 3);
    }
}
