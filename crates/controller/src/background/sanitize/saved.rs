//! The sanitize state's saved form (docs/state-format.md,
//! `background.sanitize`): the Sanitize Status log's values and failure
//! mode. A sanitize in progress is not saved (its thread's position in
//! the medium is not yet part of the state): the save is refused.

use serde::{Deserialize, Serialize};
use vnvme_spec::log::sanitize::sstat;

use super::{Sanitize, State};
use crate::saved_check::{at_most, InvalidState};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedSanitize {
    /// SSTAT 2:0: the most recent operation's status.
    pub status: u16,
    /// Overwrite passes completed.
    pub passes: u8,
    /// The most recent Sanitize command's CDW10.
    pub scdw10: u32,
    /// SPROG, in 65536ths.
    pub sprog: u16,
    /// In failure mode: whether Exit Failure Mode may leave it (AUSE).
    pub failure: Option<bool>,
    /// User data writes counted when the last operation completed.
    pub erased_at: Option<u64>,
}

impl Sanitize {
    /// The state, or `None` while an operation is in progress.
    pub fn save(&self) -> Option<SavedSanitize> {
        let s = self.state.lock();
        (s.status != sstat::IN_PROGRESS).then(|| SavedSanitize {
            status: s.status,
            passes: s.passes,
            scdw10: s.scdw10,
            sprog: s.sprog,
            failure: s.failure,
            erased_at: s.erased_at,
        })
    }

    pub fn restore(&self, saved: &SavedSanitize) -> Result<(), InvalidState> {
        at_most("the sanitize status", u64::from(saved.status), 7)?;
        if saved.status == sstat::IN_PROGRESS {
            return Err(crate::saved_check::inconsistent(
                "the saved state has a sanitize in progress, which cannot be restored",
            ));
        }
        *self.state.lock() = State {
            status: saved.status,
            passes: saved.passes,
            scdw10: saved.scdw10,
            sprog: saved.sprog,
            failure: saved.failure,
            erased_at: saved.erased_at,
        };
        Ok(())
    }
}
