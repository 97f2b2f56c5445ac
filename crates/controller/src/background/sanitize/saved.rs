//! The sanitize state's saved form (docs/state-format.md,
//! `background.sanitize`): the Sanitize Status log's values and failure
//! mode, and of a sanitize in progress its operation and position (its
//! thread is stopped first: by the pause that precedes a save).

use serde::{Deserialize, Serialize};
use vnvme_spec::log::sanitize::sstat;

use super::{Method, Position, Sanitize, State};
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
    /// In progress: the operation, its media key and the bytes done (a
    /// state without it has no sanitize in progress).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<Position>,
}

impl Sanitize {
    /// The state, or `None` while an operation's thread runs (a pause
    /// stops it; it then stays where it was until resumed).
    pub fn save(&self) -> Option<SavedSanitize> {
        if self.task.running() {
            return None;
        }
        let s = self.state.lock();
        let in_progress = s.status == sstat::IN_PROGRESS;
        Some(SavedSanitize {
            status: s.status,
            passes: s.passes,
            scdw10: s.scdw10,
            sprog: s.sprog,
            failure: s.failure,
            erased_at: s.erased_at,
            run: s.run.filter(|_| in_progress),
        })
    }

    pub fn restore(&self, saved: &SavedSanitize) -> Result<(), InvalidState> {
        at_most("the sanitize status", u64::from(saved.status), 7)?;
        match (saved.status == sstat::IN_PROGRESS, &saved.run) {
            (true, None) => {
                return Err(crate::saved_check::inconsistent(
                    "the saved state has a sanitize in progress without its position \
                     (saved by a server that could not carry one)",
                ))
            }
            (false, Some(_)) => {
                return Err(crate::saved_check::inconsistent(
                    "the saved state has a sanitize position but none in progress",
                ))
            }
            (true, Some(run)) => {
                if let Method::Overwrite { passes, .. } = run.op.method {
                    at_most("the overwrite passes", u64::from(passes), 16)?;
                    if passes == 0 {
                        return Err(crate::saved_check::inconsistent(
                            "the saved sanitize overwrites in 0 passes",
                        ));
                    }
                }
            }
            (false, None) => {}
        }
        *self.state.lock() = State {
            status: saved.status,
            passes: saved.passes,
            scdw10: saved.scdw10,
            sprog: saved.sprog,
            failure: saved.failure,
            erased_at: saved.erased_at,
            run: saved.run,
        };
        Ok(())
    }
}
