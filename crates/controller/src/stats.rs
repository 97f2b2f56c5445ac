//! Counters: incremented on the hot path with relaxed atomics, read as a
//! serde snapshot by [`Controller::stats`](crate::Controller::stats).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use serde::Serialize;
use vnvme_blockdev::BlockError;
use vnvme_spec::{AdminOpcode, NvmOpcode, Status};

use crate::backend_error::{BackendOp, Chain, LogLimit};
use crate::thread_slot;

/// At most one backend error logged per this interval, per controller.
const BACKEND_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// A counter that one thread at a time adds to: the worker that owns the
/// queue it belongs to. A plain load and store, where `fetch_add` would be
/// a locked instruction per command (with four of them, a tenth of a 4 KiB
/// read's time in the embedded bench). Two threads adding at once would
/// lose counts, never memory.
#[derive(Debug, Default)]
pub(crate) struct Owned(AtomicU64);

impl Owned {
    /// Adds `n`; gives the value before.
    #[inline]
    pub fn add(&self, n: u64) -> u64 {
        let v = self.0.load(Relaxed);
        self.0.store(v.wrapping_add(n), Relaxed);
        v
    }

    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// I/O opcodes counted per queue ([`Owned`]); the vendor-specific ones
/// (80h and up) in the controller's shared table.
const OWNED_IO_OPS: usize = 0x80;

/// Counters of one queue id (its SQ and its CQ).
#[derive(Debug)]
pub(crate) struct QueueCounters {
    pub sq_doorbell_traps: AtomicU64,
    pub cq_doorbell_traps: AtomicU64,
    pub shadow_reads: AtomicU64,
    pub eventidx_writes: AtomicU64,
    /// Commands fetched from the SQ, by its worker.
    pub commands: Owned,
    /// I/O commands fetched, by opcode below [`OWNED_IO_OPS`].
    io_ops: [Owned; OWNED_IO_OPS],
    /// Reads and writes completed, and their 512-byte units (SMART /
    /// Health), by the SQ's worker.
    reads: Owned,
    writes: Owned,
    read_512: Owned,
    written_512: Owned,
    /// Successful completions posted (the others are counted by status
    /// in the controller's table).
    successes: Owned,
    pub errors: AtomicU64,
    pub interrupts: AtomicU64,
    pub invalid_doorbell_writes: AtomicU64,
    /// Latency of one command in [`LATENCY_SAMPLE`] fetched from this SQ.
    pub latency: LatencyCounters,
}

impl Default for QueueCounters {
    fn default() -> Self {
        Self {
            sq_doorbell_traps: AtomicU64::new(0),
            cq_doorbell_traps: AtomicU64::new(0),
            shadow_reads: AtomicU64::new(0),
            eventidx_writes: AtomicU64::new(0),
            commands: Owned::default(),
            io_ops: std::array::from_fn(|_| Owned::default()),
            reads: Owned::default(),
            writes: Owned::default(),
            read_512: Owned::default(),
            written_512: Owned::default(),
            successes: Owned::default(),
            errors: AtomicU64::new(0),
            interrupts: AtomicU64::new(0),
            invalid_doorbell_writes: AtomicU64::new(0),
            latency: LatencyCounters::default(),
        }
    }
}

/// One command in this many per queue has its latency measured (fetch to
/// completion posted): two clock reads per sample, none for the others.
pub const LATENCY_SAMPLE: u64 = 64;

/// Upper bounds of the latency histogram's buckets, in nanoseconds (the
/// last bucket, +Inf, is implied).
pub const LATENCY_BOUNDS_NS: [u64; 13] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    100_000_000,
    1_000_000_000,
];

/// A latency histogram: non-cumulative bucket counts, sum and count.
#[derive(Debug, Default)]
pub(crate) struct LatencyCounters {
    buckets: [AtomicU64; LATENCY_BOUNDS_NS.len() + 1],
    sum_ns: AtomicU64,
}

impl LatencyCounters {
    fn record(&self, ns: u64) {
        let i = LATENCY_BOUNDS_NS.partition_point(|&b| b < ns);
        if let Some(b) = self.buckets.get(i) {
            b.fetch_add(1, Relaxed);
        }
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    fn snapshot(&self) -> LatencyHistogram {
        let mut h = LatencyHistogram {
            sum_ns: self.sum_ns.load(Relaxed),
            ..LatencyHistogram::default()
        };
        let mut total = 0;
        for b in &self.buckets {
            total += b.load(Relaxed);
            h.cumulative.push(total);
        }
        h
    }
}

/// A namespace's I/O: the reads and writes it completed and their bytes
/// (logical block data and metadata). Kept per counting thread
/// ([`thread_slot`]): a namespace is shared by every controller of the
/// subsystem, and two locked adds per command on its one line were 4% of a
/// QD 128 read's samples in `perf` (`docs/benchmarks.md`, "Where a 4 KiB
/// read's time goes"). Summed when read.
#[derive(Debug)]
pub(crate) struct NamespaceCounters {
    slots: Box<[Slot]>,
    /// For threads past [`thread_slot::SLOTS`]: locked adds.
    shared: Slot,
}

/// One thread's counts, on a cache line of its own.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Slot {
    read_commands: AtomicU64,
    write_commands: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
}

impl Default for NamespaceCounters {
    fn default() -> Self {
        NamespaceCounters {
            slots: (0..thread_slot::SLOTS).map(|_| Slot::default()).collect(),
            shared: Slot::default(),
        }
    }
}

impl NamespaceCounters {
    pub fn read(&self, bytes: u64) {
        self.add(|s| (&s.read_commands, &s.bytes_read), bytes);
    }

    pub fn written(&self, bytes: u64) {
        self.add(|s| (&s.write_commands, &s.bytes_written), bytes);
    }

    #[inline]
    fn add(&self, pick: impl Fn(&Slot) -> (&AtomicU64, &AtomicU64), bytes: u64) {
        match thread_slot::current().and_then(|i| self.slots.get(i)) {
            Some(slot) => {
                // This thread is the slot's only writer.
                let (commands, b) = pick(slot);
                commands.store(commands.load(Relaxed) + 1, Relaxed);
                b.store(b.load(Relaxed) + bytes, Relaxed);
            }
            None => {
                let (commands, b) = pick(&self.shared);
                commands.fetch_add(1, Relaxed);
                b.fetch_add(bytes, Relaxed);
            }
        }
    }

    pub fn snapshot(&self, nsid: u32) -> NamespaceStats {
        let sum = |f: fn(&Slot) -> &AtomicU64| {
            self.slots
                .iter()
                .chain([&self.shared])
                .map(|s| f(s).load(Relaxed))
                .sum()
        };
        NamespaceStats {
            nsid,
            read_commands: sum(|s| &s.read_commands),
            write_commands: sum(|s| &s.write_commands),
            bytes_read: sum(|s| &s.bytes_read),
            bytes_written: sum(|s| &s.bytes_written),
        }
    }
}

/// Number of distinct status codes (SCT 3 bits, SC 8 bits).
const STATUS_CODES: usize = 0x800;

/// Where `status` is counted in [`Stats`]'s table of statuses.
fn status_index(status: Status) -> usize {
    usize::from(status.raw() & 0x7FF)
}

#[derive(Debug)]
pub(crate) struct Stats {
    /// Indexed by queue id, `0..=max_io_queues`.
    pub queues: Vec<QueueCounters>,
    admin_ops: Vec<AtomicU64>,
    io_ops: Vec<AtomicU64>,
    statuses: Vec<AtomicU64>,
    /// Doorbell writes naming a queue id beyond the controller's limit.
    pub invalid_doorbell_writes_no_queue: AtomicU64,
    /// Register accesses with a bad size or alignment.
    pub invalid_register_accesses: AtomicU64,
    pub controller_resets: AtomicU64,
    pub enables: AtomicU64,
    pub fatal_errors: AtomicU64,
    /// Shadow doorbell / EventIdx accesses that failed (buffer unmapped).
    pub shadow_errors: AtomicU64,
    /// Queue workers going from asleep to running.
    pub worker_wakeups: AtomicU64,
    /// Adaptive mode: times a worker armed EventIdx to go to sleep.
    pub eventidx_arms: AtomicU64,
    /// Doorbell Buffer Config commands that succeeded.
    pub dbbuf_configs: AtomicU64,
    /// I/O commands whose data pointer is an SGL.
    pub sgl_commands: AtomicU64,
    // SMART / health (reads and writes are counted per queue).
    pub power_cycles: AtomicU64,
    pub unsafe_shutdowns: AtomicU64,
    pub media_errors: AtomicU64,
    /// Backend operations that failed (see [`Stats::backend_error`]).
    pub backend_errors: AtomicU64,
    /// Bytes of reads and writes copied through a buffer between the host
    /// and the backend (see [`crate::io`]).
    pub bounced_bytes: AtomicU64,
    /// I/O commands a limit held back ([`crate::qos`]), and the time they
    /// were held, in nanoseconds.
    pub qos_throttled: AtomicU64,
    pub qos_throttled_ns: AtomicU64,
    /// Writes by stream id (Streams directive), `0..=MSL`.
    stream_writes: Vec<AtomicU64>,
    backend_error_log: LogLimit,
}

fn counters(n: usize) -> Vec<AtomicU64> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

impl Stats {
    pub fn new(queue_ids: usize) -> Self {
        Self {
            queues: (0..queue_ids).map(|_| QueueCounters::default()).collect(),
            admin_ops: counters(256),
            io_ops: counters(256),
            statuses: counters(STATUS_CODES),
            invalid_doorbell_writes_no_queue: AtomicU64::new(0),
            invalid_register_accesses: AtomicU64::new(0),
            controller_resets: AtomicU64::new(0),
            enables: AtomicU64::new(0),
            fatal_errors: AtomicU64::new(0),
            shadow_errors: AtomicU64::new(0),
            worker_wakeups: AtomicU64::new(0),
            eventidx_arms: AtomicU64::new(0),
            dbbuf_configs: AtomicU64::new(0),
            sgl_commands: AtomicU64::new(0),
            power_cycles: AtomicU64::new(0),
            unsafe_shutdowns: AtomicU64::new(0),
            media_errors: AtomicU64::new(0),
            backend_errors: AtomicU64::new(0),
            bounced_bytes: AtomicU64::new(0),
            qos_throttled: AtomicU64::new(0),
            qos_throttled_ns: AtomicU64::new(0),
            stream_writes: counters(usize::from(crate::streams::MSL) + 1),
            backend_error_log: LogLimit::new(BACKEND_ERROR_LOG_INTERVAL),
        }
    }

    /// A backend failed at `op` for namespace `nsid`: counts it, logs it
    /// with its cause (at most one line per interval, with how many were
    /// held back), and gives the status its command completes with.
    pub fn backend_error(&self, op: BackendOp, nsid: u32, err: &BlockError) -> Status {
        self.backend_errors.fetch_add(1, Relaxed);
        if op.is_media_error() {
            self.media_errors.fetch_add(1, Relaxed);
        }
        if let Some(held_back) = self.backend_error_log.admit() {
            tracing::warn!(%op, nsid, held_back, "backend error: {}", Chain(err));
        }
        op.status()
    }

    /// I/O commands of opcode `op` so far.
    pub fn io_commands(&self, op: NvmOpcode) -> u64 {
        let i = usize::from(op.0);
        match self.io_ops.get(i) {
            Some(c) if i >= OWNED_IO_OPS => c.load(Relaxed),
            _ => self.sum(|q| q.io_ops.get(i).map_or(0, Owned::get)),
        }
    }

    fn sum(&self, f: impl Fn(&QueueCounters) -> u64) -> u64 {
        self.queues.iter().map(f).fold(0, u64::wrapping_add)
    }

    /// Host Read Commands (SMART / Health) so far.
    pub fn host_read_commands(&self) -> u64 {
        self.sum(|q| q.reads.get())
    }

    /// Host Write Commands (SMART / Health) so far.
    pub fn host_write_commands(&self) -> u64 {
        self.sum(|q| q.writes.get())
    }

    /// 512-byte units read so far (Data Units Read counts thousands).
    pub fn data_units_read_512(&self) -> u64 {
        self.sum(|q| q.read_512.get())
    }

    /// 512-byte units written so far.
    pub fn data_units_written_512(&self) -> u64 {
        self.sum(|q| q.written_512.get())
    }

    /// A read of `bytes_512` 512-byte units from SQ `qid` completed: by
    /// the SQ's worker.
    pub fn read(&self, qid: u16, bytes_512: u64) {
        if let Some(q) = self.queue(qid) {
            q.reads.add(1);
            q.read_512.add(bytes_512);
        }
    }

    /// A write of `bytes_512` 512-byte units from SQ `qid` completed: by
    /// the SQ's worker.
    pub fn written(&self, qid: u16, bytes_512: u64) {
        if let Some(q) = self.queue(qid) {
            q.writes.add(1);
            q.written_512.add(bytes_512);
        }
    }

    pub fn queue(&self, qid: u16) -> Option<&QueueCounters> {
        self.queues.get(usize::from(qid))
    }

    /// A command fetched from SQ `qid`; `true` if its latency is to be
    /// measured (one in [`LATENCY_SAMPLE`]).
    pub fn command(&self, qid: u16, opcode: u8) -> bool {
        let Some(q) = self.queue(qid) else {
            return false;
        };
        let shared = if qid == 0 {
            self.admin_ops.get(usize::from(opcode))
        } else if let Some(c) = q.io_ops.get(usize::from(opcode)) {
            c.add(1);
            None
        } else {
            self.io_ops.get(usize::from(opcode))
        };
        if let Some(c) = shared {
            c.fetch_add(1, Relaxed);
        }
        q.commands.add(1) % LATENCY_SAMPLE == 0
    }

    /// A sampled command from SQ `qid`, fetched at `started`, completed.
    pub fn latency(&self, qid: u16, started: Option<Instant>) {
        if let (Some(t0), Some(q)) = (started, self.queue(qid)) {
            let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
            q.latency.record(ns);
        }
    }

    /// A write with stream id `sid` completed.
    pub fn stream_write(&self, sid: u16) {
        if let Some(c) = self.stream_writes.get(usize::from(sid)) {
            c.fetch_add(1, Relaxed);
        }
    }

    /// A completion posted for a command of SQ `qid`, by the worker that
    /// owns its CQ (and so the SQ).
    pub fn completion(&self, qid: u16, status: Status) {
        let q = self.queue(qid);
        match q {
            Some(q) if status.is_success() => {
                q.successes.add(1);
                return;
            }
            Some(q) => {
                q.errors.fetch_add(1, Relaxed);
            }
            None => {}
        }
        if let Some(c) = self.statuses.get(status_index(status)) {
            c.fetch_add(1, Relaxed);
        }
    }

    pub fn snapshot(&self) -> ControllerStats {
        let mut s = ControllerStats::default();
        for (qid, q) in self.queues.iter().enumerate() {
            let qs = QueueStats {
                qid: qid as u16,
                sq_doorbell_traps: q.sq_doorbell_traps.load(Relaxed),
                cq_doorbell_traps: q.cq_doorbell_traps.load(Relaxed),
                shadow_reads: q.shadow_reads.load(Relaxed),
                eventidx_writes: q.eventidx_writes.load(Relaxed),
                commands: q.commands.get(),
                errors: q.errors.load(Relaxed),
                interrupts: q.interrupts.load(Relaxed),
                invalid_doorbell_writes: q.invalid_doorbell_writes.load(Relaxed),
                latency: q.latency.snapshot(),
            };
            s.sq_doorbell_traps += qs.sq_doorbell_traps;
            s.cq_doorbell_traps += qs.cq_doorbell_traps;
            s.shadow_reads += qs.shadow_reads;
            s.eventidx_writes += qs.eventidx_writes;
            s.commands += qs.commands;
            s.errors += qs.errors;
            s.interrupts += qs.interrupts;
            s.invalid_doorbell_writes += qs.invalid_doorbell_writes;
            // Latency is sampled from commands: a queue without any has none.
            let idle = QueueStats {
                qid: qs.qid,
                latency: qs.latency.clone(),
                ..Default::default()
            };
            if qs != idle {
                s.queues.push(qs);
            }
        }
        let nq = self.invalid_doorbell_writes_no_queue.load(Relaxed);
        s.invalid_doorbell_writes += nq;
        for (op, c) in self.admin_ops.iter().enumerate() {
            let n = c.load(Relaxed);
            if n != 0 {
                s.admin_commands
                    .insert(AdminOpcode(op as u8).to_string(), n);
            }
        }
        for op in 0..self.io_ops.len() {
            let n = self.io_commands(NvmOpcode(op as u8));
            if n != 0 {
                s.io_commands.insert(NvmOpcode(op as u8).to_string(), n);
            }
        }
        let success = status_index(Status::SUCCESS);
        for (raw, c) in self.statuses.iter().enumerate() {
            let mut n = c.load(Relaxed);
            if raw == success {
                n = n.wrapping_add(self.sum(|q| q.successes.get()));
            }
            if n != 0 {
                let st = Status::from_raw(raw as u16);
                let key = match st.name() {
                    "unknown" => format!("sct{:x}-sc{:02x}", st.sct(), st.sc()),
                    name => name.to_string(),
                };
                s.completions.insert(key, n);
            }
        }
        s.invalid_register_accesses = self.invalid_register_accesses.load(Relaxed);
        s.controller_resets = self.controller_resets.load(Relaxed);
        s.enables = self.enables.load(Relaxed);
        s.fatal_errors = self.fatal_errors.load(Relaxed);
        s.shadow_errors = self.shadow_errors.load(Relaxed);
        s.worker_wakeups = self.worker_wakeups.load(Relaxed);
        s.eventidx_arms = self.eventidx_arms.load(Relaxed);
        s.dbbuf_configs = self.dbbuf_configs.load(Relaxed);
        s.sgl_commands = self.sgl_commands.load(Relaxed);
        s.backend_errors = self.backend_errors.load(Relaxed);
        s.bounced_bytes = self.bounced_bytes.load(Relaxed);
        s.qos_throttled_commands = self.qos_throttled.load(Relaxed);
        s.qos_throttled_ns = self.qos_throttled_ns.load(Relaxed);
        for (sid, c) in self.stream_writes.iter().enumerate() {
            let n = c.load(Relaxed);
            if n != 0 {
                s.stream_writes.insert(sid as u16, n);
            }
        }
        s
    }
}

/// Counters of one queue id in a [`ControllerStats`] snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct QueueStats {
    pub qid: u16,
    /// SQ tail doorbell writes that trapped (MMIO).
    pub sq_doorbell_traps: u64,
    /// CQ head doorbell writes that trapped (MMIO).
    pub cq_doorbell_traps: u64,
    /// Shadow doorbell reads (Doorbell Buffer Config; 0 until it exists).
    pub shadow_reads: u64,
    /// EventIdx writes (Doorbell Buffer Config; 0 until it exists).
    pub eventidx_writes: u64,
    /// Commands fetched from this SQ.
    pub commands: u64,
    /// Completions with a non-success status posted for this SQ.
    pub errors: u64,
    /// Interrupts raised for this CQ.
    pub interrupts: u64,
    /// Doorbell values ignored: beyond the queue size, for a queue that does
    /// not exist, or a CQ head skipping entries not yet posted.
    pub invalid_doorbell_writes: u64,
    /// Sampled command latency (one in [`LATENCY_SAMPLE`]).
    pub latency: LatencyHistogram,
}

/// A latency histogram in a snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LatencyHistogram {
    /// Samples at or under each bound of [`LATENCY_BOUNDS_NS`], then all
    /// of them (+Inf): cumulative, as Prometheus buckets are.
    pub cumulative: Vec<u64>,
    /// Sum of the samples, nanoseconds.
    pub sum_ns: u64,
}

impl LatencyHistogram {
    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.cumulative.last().copied().unwrap_or(0)
    }
}

/// Counters of one namespace in a [`ControllerStats`] snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NamespaceStats {
    pub nsid: u32,
    pub read_commands: u64,
    pub write_commands: u64,
    /// Bytes read and written (logical block data and metadata).
    pub bytes_read: u64,
    pub bytes_written: u64,
}

/// A snapshot of the controller's counters, cumulative since construction.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ControllerStats {
    /// The controller's CNTLID (1, 2, ... in a subsystem's `--socket`
    /// order): which controller these counters are.
    pub cntlid: u16,
    pub sq_doorbell_traps: u64,
    pub cq_doorbell_traps: u64,
    pub shadow_reads: u64,
    pub eventidx_writes: u64,
    pub interrupts: u64,
    pub commands: u64,
    pub errors: u64,
    pub invalid_doorbell_writes: u64,
    pub invalid_register_accesses: u64,
    pub controller_resets: u64,
    pub enables: u64,
    /// Times CSTS.CFS was set (bad enable, unreachable queue memory).
    pub fatal_errors: u64,
    /// Shadow doorbell / EventIdx buffer accesses that failed (the host
    /// unmapped them); the queue sees no new work, CSTS.CFS is not set.
    pub shadow_errors: u64,
    /// Queue workers waking from sleep (condvar or mmap-poll back-off) to
    /// run: with adaptive polling, far fewer than doorbell traps.
    pub worker_wakeups: u64,
    /// Adaptive mode: EventIdx armed (= tail seen) before a worker slept.
    pub eventidx_arms: u64,
    /// Successful Doorbell Buffer Config commands.
    pub dbbuf_configs: u64,
    /// I/O commands whose data came through an SGL (Linux uses them for
    /// requests averaging `nvme.sgl_threshold`, 32 KiB, per segment).
    pub sgl_commands: u64,
    /// Backend operations that failed: each completed its command with an
    /// error status (Unrecovered Read Error, Write Fault or Internal Error)
    /// and is logged, rate-limited, with its cause.
    pub backend_errors: u64,
    /// Bytes of reads and writes copied through a buffer of the
    /// controller's or the backend's on their way between the host's
    /// memory and the backend: all of them on the `ram` backend, only
    /// what cannot move in place on the `file` backend (separate
    /// metadata, memory reached by messages, a request its queue had no
    /// room for).
    pub bounced_bytes: u64,
    /// I/O commands an IOPS or bandwidth limit made wait (see
    /// `vnvme_controller::qos`), and the time they waited, summed, in
    /// nanoseconds (counted when each starts).
    pub qos_throttled_commands: u64,
    pub qos_throttled_ns: u64,
    /// Admin commands by opcode name.
    pub admin_commands: BTreeMap<String, u64>,
    /// I/O commands by opcode name.
    pub io_commands: BTreeMap<String, u64>,
    /// Completions by status name ("success", "invalid-field", ...).
    pub completions: BTreeMap<String, u64>,
    /// Writes completed by stream id (Streams directive), ids written to only.
    pub stream_writes: BTreeMap<u16, u64>,
    /// Queues with any non-zero counter.
    pub queues: Vec<QueueStats>,
    /// Allocated namespaces, by NSID.
    pub namespaces: Vec<NamespaceStats>,
}

impl ControllerStats {
    /// Counters of queue `qid` (zeroes if it never counted anything).
    pub fn queue(&self, qid: u16) -> QueueStats {
        self.queues
            .iter()
            .find(|q| q.qid == qid)
            .cloned()
            .unwrap_or(QueueStats {
                qid,
                ..Default::default()
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_kept_per_queue_add_up_to_the_controllers() {
        let stats = Stats::new(3);
        for qid in [1, 1, 1, 2, 2] {
            stats.command(qid, NvmOpcode::READ.0);
            stats.read(qid, 8);
            stats.completion(qid, Status::SUCCESS);
        }
        stats.command(2, NvmOpcode::WRITE.0);
        stats.written(2, 16);
        stats.completion(2, Status::INVALID_FIELD);
        stats.command(1, 0x81);
        stats.completion(0, Status::SUCCESS);

        assert_eq!(stats.io_commands(NvmOpcode::READ), 5);
        assert_eq!(stats.io_commands(NvmOpcode::WRITE), 1);
        assert_eq!(stats.io_commands(NvmOpcode(0x81)), 1);
        assert_eq!(stats.host_read_commands(), 5);
        assert_eq!(stats.data_units_read_512(), 40);
        assert_eq!(stats.host_write_commands(), 1);
        assert_eq!(stats.data_units_written_512(), 16);
        let s = stats.snapshot();
        assert_eq!(s.commands, 7);
        assert_eq!(s.io_commands.get("read"), Some(&5));
        assert_eq!(s.completions.get("success"), Some(&6));
        assert_eq!(s.completions.values().sum::<u64>(), 7);
        assert_eq!(s.errors, 1);
    }

    #[test]
    fn a_namespaces_counts_from_more_threads_than_slots_add_up() {
        // Every thread stays alive until all have counted, so past the
        // slots some count in the shared slot: nothing is lost either way.
        let threads = thread_slot::SLOTS + 8;
        let counters = NamespaceCounters::default();
        let all_counted = std::sync::Barrier::new(threads);
        std::thread::scope(|s| {
            for t in 0..threads as u64 {
                let (counters, all_counted) = (&counters, &all_counted);
                s.spawn(move || {
                    for _ in 0..1000 {
                        counters.read(4096);
                        counters.written(512 + t);
                    }
                    all_counted.wait();
                });
            }
        });
        let n = threads as u64;
        let got = counters.snapshot(7);
        assert_eq!(got.nsid, 7);
        assert_eq!(got.read_commands, 1000 * n);
        assert_eq!(got.write_commands, 1000 * n);
        assert_eq!(got.bytes_read, 4096 * 1000 * n);
        assert_eq!(got.bytes_written, 1000 * (512 * n + n * (n - 1) / 2));
        assert!(
            counters.shared.read_commands.load(Relaxed) >= 8000,
            "threads past the slots counted in the shared slot"
        );
    }
}
