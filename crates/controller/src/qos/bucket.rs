//! A token bucket that counts in integers and is driven by the caller's
//! clock (nanoseconds since an epoch), so tests step time by hand.
//!
//! The bucket holds at most `burst` tokens and refills at `rate` tokens a
//! second. A command takes its cost at once, even if that leaves the bucket
//! in debt; it then waits until the debt is paid. Commands are so served in
//! the order they arrive (the next one's debt includes the previous
//! one's), a command costlier than the whole burst still runs, and how late
//! a worker wakes changes no command's start after it: the schedule is the
//! bucket's, not the worker's.

/// Token fractions per token: a refill of 1 ns at 3 tokens/s is exact.
const NANO: i128 = 1_000_000_000;

/// The most a command waits: deeper debt (a queue deeper than this many
/// seconds of the rate) is forgiven, so a hostile or mistaken command cost
/// cannot park a queue for years.
pub const MAX_WAIT_NS: u64 = 600 * 1_000_000_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// Tokens a second, more than 0.
    rate: u64,
    /// Bucket size in tokens, more than 0.
    burst: u64,
    /// Tokens x [`NANO`]; negative: debt.
    level: i128,
    /// When `level` was last brought up to date.
    last_ns: u64,
}

impl Bucket {
    /// A full bucket at `now_ns`. `rate` and `burst` are checked by
    /// [`Rate::validate`](super::Rate::validate); 0 is taken as 1.
    pub fn new(rate: u64, burst: u64, now_ns: u64) -> Self {
        let burst = burst.max(1);
        Self {
            rate: rate.max(1),
            burst,
            level: i128::from(burst) * NANO,
            last_ns: now_ns,
        }
    }

    /// Tokens now (rounded down; negative: debt).
    #[cfg(test)]
    pub fn tokens(&self) -> i64 {
        i64::try_from(self.level / NANO).unwrap_or(i64::MIN)
    }

    fn refill(&mut self, now_ns: u64) {
        // A clock read earlier by another worker may arrive later: time
        // never runs backwards for the bucket.
        let elapsed = now_ns.saturating_sub(self.last_ns);
        self.last_ns = self.last_ns.max(now_ns);
        let full = i128::from(self.burst) * NANO;
        let gained = i128::from(elapsed) * i128::from(self.rate);
        self.level = self.level.saturating_add(gained).min(full);
    }

    /// Takes `cost` tokens at `now_ns`: how many nanoseconds the command
    /// waits (0: it runs now).
    pub fn take(&mut self, cost: u64, now_ns: u64) -> u64 {
        self.refill(now_ns);
        let floor = -(i128::from(MAX_WAIT_NS) * i128::from(self.rate));
        self.level = self
            .level
            .saturating_sub(i128::from(cost) * NANO)
            .max(floor);
        if self.level >= 0 {
            return 0;
        }
        let debt = -self.level;
        let rate = i128::from(self.rate);
        // Round up: the command starts once the debt is paid, not before.
        u64::try_from((debt + rate - 1) / rate).unwrap_or(MAX_WAIT_NS)
    }
}
