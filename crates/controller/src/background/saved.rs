//! The background operations' saved form (docs/state-format.md,
//! `background`): what the Sanitize Status and Device Self-test logs
//! report. An operation in progress keeps the state from being saved
//! (`None` from [`SavedBackground::save`]): resuming one in a restored
//! controller is not supported yet.

use serde::{Deserialize, Serialize};

use super::sanitize::{Sanitize, SavedSanitize};
use super::self_test::{SavedSelfTest, SelfTest};
use crate::saved_check::InvalidState;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedBackground {
    pub sanitize: SavedSanitize,
    pub self_test: SavedSelfTest,
}

impl SavedBackground {
    /// Both operations' state, or the name of the one in progress.
    pub fn save(sanitize: &Sanitize, self_test: &SelfTest) -> Result<Self, &'static str> {
        Ok(Self {
            sanitize: sanitize.save().ok_or("sanitize")?,
            self_test: self_test.save().ok_or("device self-test")?,
        })
    }

    pub fn restore(&self, sanitize: &Sanitize, self_test: &SelfTest) -> Result<(), InvalidState> {
        sanitize.restore(&self.sanitize)?;
        self_test.restore(&self.self_test)
    }
}
