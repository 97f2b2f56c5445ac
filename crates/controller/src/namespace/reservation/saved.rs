//! A namespace's reservations in the saved state
//! (docs/state-format.md, `namespaces[].reservations`): the sidecar file's
//! text ([`State::decode`] checks it as it does a file's) and PTPL.

use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::{Reservations, State};
use crate::saved_check::{inconsistent, InvalidState};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedReservations {
    /// Persist Through Power Loss.
    pub ptpl: bool,
    /// Generation, registrants and the reservation held, as a sidecar
    /// file holds them (`vnvme-reservations 1` lines).
    pub text: String,
}

impl Reservations {
    pub fn save(&self) -> SavedReservations {
        let s = self.state.lock();
        SavedReservations {
            ptpl: s.ptpl,
            text: s.encode(),
        }
    }

    /// Takes the saved state (the sidecar file, if any, is left as it is:
    /// it already holds what PTPL persisted).
    pub fn restore(&self, saved: &SavedReservations) -> Result<(), InvalidState> {
        let mut state = State::decode(&saved.text)
            .map_err(|e| inconsistent(format!("the reservations: {e}")))?;
        state.ptpl = saved.ptpl;
        let word = state.word();
        *self.state.lock() = state;
        self.word.store(word, Ordering::Release);
        Ok(())
    }
}
