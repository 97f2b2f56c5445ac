//! The Persistent Event Log's saved form (docs/state-format.md,
//! `reporting.persistent_events`): every event with its time as a distance
//! from the save (negative: it has happened; positive: a completion known
//! in advance, e.g. a Format NVM that finishes later), the generation
//! number, an established reporting context, and the power-on time the
//! log's header counts hours from.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use vnvme_spec::log::persistent_event::EventType;

use super::{Event, PersistentEventLog, Store, HEADER_BYTES, MAX_LOG_BYTES};
use crate::lifecycle::saved::{before, ms};
use crate::saved_check::{at_most, hex, InvalidState};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedEvent {
    pub etype: u8,
    /// Milliseconds from the save to the event (negative: before it).
    pub at_ms: i64,
    /// Its Timestamp (Timestamp feature format), as recorded.
    pub ts: u64,
    /// The event's data, after its 24-byte header.
    #[serde(with = "hex")]
    pub data: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedPersistentEventLog {
    /// Oldest first.
    pub events: Vec<SavedEvent>,
    pub generation: u16,
    /// The log as an Establish Context took it, until released.
    #[serde(with = "opt_hex")]
    pub context: Option<Vec<u8>>,
    /// Milliseconds from power on to the save.
    pub power_on_ms: u64,
}

/// `Option<Vec<u8>>` as `null` or a hex string.
mod opt_hex {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    struct Hex(#[serde(with = "crate::saved_check::hex")] Vec<u8>);

    pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        v.as_ref().map(|b| Hex(b.clone())).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        Ok(Option::<Hex>::deserialize(d)?.map(|h| h.0))
    }
}

impl PersistentEventLog {
    pub fn save(&self, now: Instant) -> SavedPersistentEventLog {
        let s = self.store.lock();
        let at_ms = |at: Instant| match at.checked_duration_since(now) {
            Some(ahead) => i64::try_from(ms(ahead)).unwrap_or(i64::MAX),
            None => -i64::try_from(ms(now.saturating_duration_since(at))).unwrap_or(i64::MAX),
        };
        SavedPersistentEventLog {
            events: (s.events.iter())
                .map(|e| SavedEvent {
                    etype: e.etype.0,
                    at_ms: at_ms(e.at),
                    ts: e.ts,
                    data: e.data.clone(),
                })
                .collect(),
            generation: s.generation,
            context: s.context.as_ref().map(|c| c.to_vec()),
            power_on_ms: ms(now.saturating_duration_since(*self.created.lock())),
        }
    }

    pub fn restore(
        &self,
        saved: &SavedPersistentEventLog,
        now: Instant,
    ) -> Result<(), InvalidState> {
        let mut store = Store {
            generation: saved.generation,
            context: saved.context.clone().map(Arc::new),
            ..Store::default()
        };
        for e in &saved.events {
            // The header's Event Length is 16 bits.
            at_most(
                "a persistent event's data length",
                e.data.len() as u64,
                0xFFFF,
            )?;
            let at = if e.at_ms >= 0 {
                now.checked_add(Duration::from_millis(e.at_ms.unsigned_abs()))
                    .unwrap_or(now)
            } else {
                before(now, e.at_ms.unsigned_abs())
            };
            let event = Event {
                etype: EventType(e.etype),
                at,
                ts: e.ts,
                data: e.data.clone(),
            };
            store.bytes += event.len();
            at_most(
                "the Persistent Event Log's length",
                (HEADER_BYTES + store.bytes) as u64,
                MAX_LOG_BYTES as u64,
            )?;
            let i = store.events.partition_point(|o| o.at <= at);
            store.events.insert(i, event);
        }
        *self.store.lock() = store;
        *self.created.lock() = before(now, saved.power_on_ms);
        Ok(())
    }
}
