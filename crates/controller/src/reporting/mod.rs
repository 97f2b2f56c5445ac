//! What the controller reports to the host beyond completions: the
//! Persistent Event Log (0Dh) and the telemetry captures (07h, 08h).

pub(crate) mod persistent_event_log;
pub(crate) mod telemetry;
