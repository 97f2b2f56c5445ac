//! The telemetry captures' saved form (docs/state-format.md,
//! `reporting.telemetry`): both captures as the host would read them, and
//! their generation numbers.

use serde::{Deserialize, Serialize};

use super::{Capture, State, Telemetry, BLOCK};
use crate::saved_check::{array, at_most, hex, inconsistent, InvalidState};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedCapture {
    /// Data areas 1 to 3, whole 512-byte blocks.
    #[serde(with = "hex")]
    pub data: Vec<u8>,
    /// Last block of data areas 1, 2 and 3.
    pub last_block: [u16; 3],
    /// Why it was taken (128 bytes, NUL padded).
    #[serde(with = "hex")]
    pub reason: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedTelemetry {
    pub host: Option<SavedCapture>,
    pub host_generation: u8,
    /// Kept until the host releases it (Data Available).
    pub controller: Option<SavedCapture>,
    pub controller_generation: u8,
}

impl Capture {
    fn save(&self) -> SavedCapture {
        SavedCapture {
            data: self.data.clone(),
            last_block: self.last_block,
            reason: self.reason.to_vec(),
        }
    }

    fn restored(saved: &SavedCapture) -> Result<Self, InvalidState> {
        let [a, b, c] = saved.last_block;
        if a > b || b > c {
            return Err(inconsistent(
                "a telemetry capture's data areas end out of order",
            ));
        }
        at_most(
            "a telemetry capture's data length",
            saved.data.len() as u64,
            u64::from(c) * BLOCK as u64,
        )?;
        Ok(Self {
            data: saved.data.clone(),
            last_block: saved.last_block,
            reason: array("a telemetry capture's reason", &saved.reason)?,
        })
    }
}

impl Telemetry {
    pub fn save(&self) -> SavedTelemetry {
        let s = self.state.lock();
        SavedTelemetry {
            host: s.host.as_ref().map(Capture::save),
            host_generation: s.host_generation,
            controller: s.controller.as_ref().map(Capture::save),
            controller_generation: s.controller_generation,
        }
    }

    pub fn restore(&self, saved: &SavedTelemetry) -> Result<(), InvalidState> {
        let restored = State {
            host: saved.host.as_ref().map(Capture::restored).transpose()?,
            host_generation: saved.host_generation,
            controller: saved
                .controller
                .as_ref()
                .map(Capture::restored)
                .transpose()?,
            controller_generation: saved.controller_generation,
        };
        *self.state.lock() = restored;
        Ok(())
    }
}
