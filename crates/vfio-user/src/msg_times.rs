//! How long the server takes over each kind of message of one connection,
//! said in one line when the client goes. A client that waits for every
//! reply (QEMU sends a guest's vIOMMU changes as synchronous DMA_MAP and
//! DMA_UNMAP messages, one or more per I/O) is only as fast as the round
//! trip; this tells the server's share of it from the rest (the socket,
//! the wake-ups, the client's own work).

use std::fmt::Write;
use std::time::{Duration, Instant};

use crate::wire::cmd;

/// Commands with a name (VERSION .. DEVICE_RESET); others count as one.
const KINDS: usize = 14;

#[derive(Debug)]
pub(crate) struct MessageTimes {
    since: Instant,
    count: [u64; KINDS],
    total: [Duration; KINDS],
    max: [Duration; KINDS],
}

impl Default for MessageTimes {
    fn default() -> Self {
        Self {
            since: Instant::now(),
            count: [0; KINDS],
            total: [Duration::ZERO; KINDS],
            max: [Duration::ZERO; KINDS],
        }
    }
}

impl MessageTimes {
    /// One message of `command` handled (reply sent) in `took`.
    pub fn add(&mut self, command: u16, took: Duration) {
        let k = usize::from(command).min(KINDS - 1);
        self.count[k] += 1;
        self.total[k] += took;
        self.max[k] = self.max[k].max(took);
    }

    /// The line for the log: per command, how many, the mean and the
    /// longest time to handle one; and the share of the connection's time
    /// spent handling messages at all.
    pub fn summary(&self) -> String {
        let connected = self.since.elapsed();
        let busy: Duration = self.total.iter().sum();
        let n: u64 = self.count.iter().sum();
        let mut out = format!(
            "{n} messages in {:.1} s, handled in {:.1} ms ({:.2}% of the time):",
            connected.as_secs_f64(),
            busy.as_secs_f64() * 1e3,
            100.0 * busy.as_secs_f64() / connected.as_secs_f64().max(1e-9)
        );
        for k in (0..KINDS).filter(|&k| self.count[k] > 0) {
            let mean = self.total[k].as_secs_f64() * 1e6 / self.count[k] as f64;
            let _ = write!(
                out,
                " {} {} (mean {mean:.1} us, max {:.0} us)",
                name(k as u16),
                self.count[k],
                self.max[k].as_secs_f64() * 1e6
            );
        }
        out
    }
}

fn name(command: u16) -> &'static str {
    match command {
        cmd::VERSION => "VERSION",
        cmd::DMA_MAP => "DMA_MAP",
        cmd::DMA_UNMAP => "DMA_UNMAP",
        cmd::DEVICE_GET_INFO => "DEVICE_GET_INFO",
        cmd::DEVICE_GET_REGION_INFO => "DEVICE_GET_REGION_INFO",
        cmd::DEVICE_GET_REGION_IO_FDS => "DEVICE_GET_REGION_IO_FDS",
        cmd::DEVICE_GET_IRQ_INFO => "DEVICE_GET_IRQ_INFO",
        cmd::DEVICE_SET_IRQS => "DEVICE_SET_IRQS",
        cmd::REGION_READ => "REGION_READ",
        cmd::REGION_WRITE => "REGION_WRITE",
        cmd::DMA_READ => "DMA_READ",
        cmd::DMA_WRITE => "DMA_WRITE",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_counts_each_command_and_folds_unknown_ones() {
        let mut t = MessageTimes::default();
        t.add(cmd::DMA_MAP, Duration::from_micros(2));
        t.add(cmd::DMA_MAP, Duration::from_micros(4));
        t.add(cmd::DMA_UNMAP, Duration::from_micros(1));
        t.add(999, Duration::from_micros(1));
        t.add(u16::MAX, Duration::from_micros(1));
        let s = t.summary();
        assert!(s.starts_with("5 messages in "), "{s}");
        assert!(s.contains("DMA_MAP 2 (mean 3.0 us, max 4 us)"), "{s}");
        assert!(s.contains("DMA_UNMAP 1 (mean 1.0 us, max 1 us)"), "{s}");
        assert!(s.contains("other 2 (mean 1.0 us, max 1 us)"), "{s}");
    }
}
