//! `vnvme serve --metrics ADDR:PORT`: the controller's counters as
//! Prometheus metrics, served on `GET /metrics` by [`http`].
//!
//! The text is the Prometheus text format 0.0.4, written by the
//! `prometheus` crate's encoder from the same snapshot `--stats` writes
//! ([`Controller::stats`](vnvme_controller::Controller::stats)): a scrape
//! reads the counters and adds nothing to the I/O path. (The OpenMetrics text of `prometheus-client` names a counter family
//! without its `_total`, which Debian bookworm's `promtool check metrics`
//! reports as a sample without help text; Prometheus scrapes both.)
//!
//! Metric families, all `vnvme_`:
//! * per controller: `commands_total{queue_type,opcode}`,
//!   `completions_total{status}` (errors by status), `*_total` of the
//!   controller's own counters (resets, fatal errors, backend errors,
//!   commands QoS limits made wait...), `qos_throttled_seconds_total`;
//! * per queue id (`qid`): commands, errors, interrupts, doorbell traps,
//!   shadow reads, EventIdx writes, ignored doorbell writes, and the
//!   histogram `command_latency_seconds` of one command in 64 (fetch to
//!   completion posted);
//! * per namespace (`nsid`): reads, writes, bytes read and written.
//!
//! A subsystem of several controllers (`--socket A --socket B`) labels
//! every sample of a controller's own families `cntlid="N"`; the
//! namespace families, the subsystem's, appear once without it.

pub mod http;

use prometheus::proto::{Bucket, Counter, Histogram, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{Encoder, TextEncoder};
use vnvme_controller::stats::{
    ControllerStats, NamespaceStats, QueueStats, LATENCY_BOUNDS_NS, LATENCY_SAMPLE,
};

/// The Content-Type of [`encode`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A family of counters being built.
struct Family(MetricFamily);

impl Family {
    fn new(name: &str, help: &str, kind: MetricType) -> Self {
        let mut f = MetricFamily::default();
        f.set_name(format!("vnvme_{name}"));
        f.set_help(help.to_string());
        f.set_field_type(kind);
        Self(f)
    }

    fn counter(name: &str, help: &str) -> Self {
        Self::new(name, help, MetricType::COUNTER)
    }

    /// A sample with `labels` (name, value).
    fn add(&mut self, labels: &[(&str, String)], value: u64) {
        self.add_f64(labels, value as f64);
    }

    fn add_f64(&mut self, labels: &[(&str, String)], value: f64) {
        let mut c = Counter::default();
        c.set_value(value);
        let mut m = Metric::from_label(pairs(labels));
        m.set_counter(c);
        self.0.mut_metric().push(m);
    }

    fn push_to(self, out: &mut Vec<MetricFamily>) {
        // The encoder refuses a family without samples.
        if !self.0.get_metric().is_empty() {
            out.push(self.0);
        }
    }
}

fn pairs(labels: &[(&str, String)]) -> Vec<LabelPair> {
    labels
        .iter()
        .map(|(name, value)| {
            let mut p = LabelPair::default();
            p.set_name(name.to_string());
            p.set_value(value.clone());
            p
        })
        .collect()
}

/// A counter family of `T`s: name, help, value.
type Field<T> = (&'static str, &'static str, fn(&T) -> u64);

/// The per-queue counter families.
const QUEUE_COUNTERS: &[Field<QueueStats>] = &[
    (
        "queue_commands_total",
        "Commands fetched from the submission queue.",
        |q| q.commands,
    ),
    (
        "queue_errors_total",
        "Completions with an error status for the submission queue.",
        |q| q.errors,
    ),
    (
        "queue_interrupts_total",
        "Interrupts raised for the completion queue.",
        |q| q.interrupts,
    ),
    (
        "queue_sq_doorbell_traps_total",
        "SQ tail doorbell writes that trapped (MMIO).",
        |q| q.sq_doorbell_traps,
    ),
    (
        "queue_cq_doorbell_traps_total",
        "CQ head doorbell writes that trapped (MMIO).",
        |q| q.cq_doorbell_traps,
    ),
    (
        "queue_shadow_reads_total",
        "Shadow doorbell reads (Doorbell Buffer Config).",
        |q| q.shadow_reads,
    ),
    (
        "queue_eventidx_writes_total",
        "EventIdx writes (Doorbell Buffer Config).",
        |q| q.eventidx_writes,
    ),
    (
        "queue_invalid_doorbell_writes_total",
        "Doorbell values ignored as invalid.",
        |q| q.invalid_doorbell_writes,
    ),
];

/// The controller-wide counter families.
const CONTROLLER_COUNTERS: &[Field<ControllerStats>] = &[
    (
        "controller_resets_total",
        "Controller resets (CC.EN cleared, or a reset message).",
        |s| s.controller_resets,
    ),
    ("enables_total", "Controller enables (CC.EN set).", |s| {
        s.enables
    }),
    ("fatal_errors_total", "Times CSTS.CFS was set.", |s| {
        s.fatal_errors
    }),
    (
        "invalid_register_accesses_total",
        "Register accesses with a bad size or alignment.",
        |s| s.invalid_register_accesses,
    ),
    (
        "invalid_doorbell_writes_total",
        "Doorbell writes ignored, queue or value invalid.",
        |s| s.invalid_doorbell_writes,
    ),
    (
        "shadow_errors_total",
        "Shadow doorbell or EventIdx buffer accesses that failed.",
        |s| s.shadow_errors,
    ),
    (
        "worker_wakeups_total",
        "Queue workers waking from sleep to run.",
        |s| s.worker_wakeups,
    ),
    (
        "eventidx_arms_total",
        "EventIdx armed before a worker slept (adaptive mode).",
        |s| s.eventidx_arms,
    ),
    (
        "qos_throttled_commands_total",
        "I/O commands an IOPS or bandwidth limit made wait.",
        |s| s.qos_throttled_commands,
    ),
    (
        "dbbuf_configs_total",
        "Successful Doorbell Buffer Config commands.",
        |s| s.dbbuf_configs,
    ),
    (
        "sgl_commands_total",
        "I/O commands whose data came through an SGL.",
        |s| s.sgl_commands,
    ),
    (
        "backend_errors_total",
        "Backend operations that failed.",
        |s| s.backend_errors,
    ),
    (
        "bounced_bytes_total",
        "Bytes copied through a buffer between host memory and the backend.",
        |s| s.bounced_bytes,
    ),
];

/// The per-namespace counter families.
const NAMESPACE_COUNTERS: &[Field<NamespaceStats>] = &[
    (
        "namespace_read_commands_total",
        "Reads completed on the namespace.",
        |n| n.read_commands,
    ),
    (
        "namespace_write_commands_total",
        "Writes completed on the namespace.",
        |n| n.write_commands,
    ),
    (
        "namespace_read_bytes_total",
        "Bytes read from the namespace.",
        |n| n.bytes_read,
    ),
    (
        "namespace_written_bytes_total",
        "Bytes written to the namespace.",
        |n| n.bytes_written,
    ),
];

/// The metric families of `s`.
pub fn families(s: &ControllerStats) -> Vec<MetricFamily> {
    let mut out = Vec::new();
    let mut f = Family::counter(
        "commands_total",
        "Commands fetched, by queue type and opcode.",
    );
    for (queue_type, ops) in [("admin", &s.admin_commands), ("io", &s.io_commands)] {
        for (op, &n) in ops {
            f.add(
                &[("queue_type", queue_type.into()), ("opcode", op.clone())],
                n,
            );
        }
    }
    f.push_to(&mut out);
    let mut f = Family::counter("completions_total", "Completions posted, by status.");
    for (status, &n) in &s.completions {
        f.add(&[("status", status.clone())], n);
    }
    f.push_to(&mut out);
    counters(
        CONTROLLER_COUNTERS,
        std::slice::from_ref(s),
        |_| None,
        &mut out,
    );
    let mut f = Family::counter(
        "qos_throttled_seconds_total",
        "Time I/O commands waited for IOPS or bandwidth limits, summed.",
    );
    f.add_f64(&[], s.qos_throttled_ns as f64 / 1e9);
    f.push_to(&mut out);
    let mut f = Family::counter("stream_writes_total", "Writes completed, by stream id.");
    for (sid, &n) in &s.stream_writes {
        f.add(&[("stream", sid.to_string())], n);
    }
    f.push_to(&mut out);
    let qid = |q: &QueueStats| Some(("qid", q.qid.to_string()));
    counters(QUEUE_COUNTERS, &s.queues, qid, &mut out);
    latency(&s.queues).push_to(&mut out);
    let nsid = |n: &NamespaceStats| Some(("nsid", n.nsid.to_string()));
    counters(NAMESPACE_COUNTERS, &s.namespaces, nsid, &mut out);
    out
}

/// A family per field, with a sample per item labelled by `label`.
fn counters<T>(
    fields: &[Field<T>],
    items: &[T],
    label: impl Fn(&T) -> Option<(&'static str, String)>,
    out: &mut Vec<MetricFamily>,
) {
    for &(name, help, value) in fields {
        let mut f = Family::counter(name, help);
        for item in items {
            let labels: Vec<_> = label(item).into_iter().collect();
            f.add(&labels, value(item));
        }
        f.push_to(out);
    }
}

/// `command_latency_seconds{qid}`: the sampled latency histogram.
fn latency(queues: &[QueueStats]) -> Family {
    let mut f = Family::new(
        "command_latency_seconds",
        &format!(
            "Latency of one command in {LATENCY_SAMPLE} per queue, from fetch to completion posted."
        ),
        MetricType::HISTOGRAM,
    );
    for q in queues.iter().filter(|q| q.latency.count() > 0) {
        let mut h = Histogram::default();
        h.set_sample_count(q.latency.count());
        h.set_sample_sum(q.latency.sum_ns as f64 / 1e9);
        let buckets = LATENCY_BOUNDS_NS
            .iter()
            .zip(&q.latency.cumulative)
            .map(|(&bound, &n)| {
                let mut b = Bucket::default();
                b.set_upper_bound(bound as f64 / 1e9);
                b.set_cumulative_count(n);
                b
            })
            .collect();
        h.set_bucket(buckets);
        let mut m = Metric::from_label(pairs(&[("qid", q.qid.to_string())]));
        m.set_histogram(h);
        f.0.mut_metric().push(m);
    }
    f
}

/// The metric families of a subsystem's controllers `all`: one
/// controller's as [`families`] has them; several's with a `cntlid`
/// label on each sample of a controller's own counters, and the
/// namespaces' once (they are the subsystem's, the same in every
/// controller's snapshot), unlabelled.
pub fn subsystem_families(all: &[ControllerStats]) -> Vec<MetricFamily> {
    if let [one] = all {
        return families(one);
    }
    let mut out: Vec<MetricFamily> = Vec::new();
    for (i, s) in all.iter().enumerate() {
        for mut f in families(s) {
            let shared = f.name().starts_with(NAMESPACE_PREFIX);
            if shared && i > 0 {
                continue;
            }
            if !shared {
                for m in f.mut_metric().iter_mut() {
                    let mut labels = m.take_label();
                    labels.extend(pairs(&[("cntlid", s.cntlid.to_string())]));
                    m.set_label(labels);
                }
            }
            match out.iter_mut().find(|o| o.name() == f.name()) {
                Some(o) => o.mut_metric().extend(f.take_metric()),
                None => out.push(f),
            }
        }
    }
    out
}

/// Families of the namespaces' counters (the subsystem's).
const NAMESPACE_PREFIX: &str = "vnvme_namespace_";

/// The text of `s`'s metrics.
pub fn encode(s: &ControllerStats) -> String {
    encode_families(&families(s))
}

/// The text of the metrics of a subsystem's controllers `all`
/// ([`subsystem_families`]).
pub fn encode_subsystem(all: &[ControllerStats]) -> String {
    encode_families(&subsystem_families(all))
}

/// The counters of `ctrl`'s subsystem as JSON (what `--stats` writes and
/// the control socket's `stats` answers): one controller's object when it
/// has one, else `{"controllers": [...]}`, an object per live controller
/// by CNTLID (each says its `cntlid`).
pub fn stats_json(ctrl: &vnvme_controller::Controller) -> serde_json::Result<serde_json::Value> {
    match ctrl.subsystem_stats().as_slice() {
        [one] => serde_json::to_value(one),
        all => Ok(serde_json::json!({ "controllers": serde_json::to_value(all)? })),
    }
}

fn encode_families(families: &[MetricFamily]) -> String {
    let mut buf = Vec::new();
    // The families are well formed (named, typed, none empty): the
    // encoder's only errors are for malformed ones and write errors,
    // which a Vec has not.
    if let Err(e) = TextEncoder::new().encode(families, &mut buf) {
        tracing::warn!("encoding metrics: {e}");
    }
    String::from_utf8_lossy(&buf).into_owned()
}
