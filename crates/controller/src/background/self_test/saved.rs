//! The device self-test's saved form (docs/state-format.md,
//! `background.self_test`): the results log and the tests counted. A test
//! in progress is not saved (the save is refused until it ends).

use serde::{Deserialize, Serialize};
use vnvme_spec::log::SelfTestResult;
use zerocopy::IntoBytes;

use super::{SelfTest, State, RESULTS};
use crate::saved_check::{at_most, hex, record, InvalidState};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedSelfTest {
    /// Self-test Result Data Structures (28 bytes each), newest first.
    pub results: Vec<SavedSelfTestResult>,
    /// Tests started so far.
    pub generation: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedSelfTestResult(#[serde(with = "hex")] pub Vec<u8>);

impl SelfTest {
    /// The state, or `None` while a test runs.
    pub fn save(&self) -> Option<SavedSelfTest> {
        let s = self.state.lock();
        s.running.is_none().then(|| SavedSelfTest {
            results: (s.results.iter())
                .map(|r| SavedSelfTestResult(r.as_bytes().to_vec()))
                .collect(),
            generation: s.generation,
        })
    }

    pub fn restore(&self, saved: &SavedSelfTest) -> Result<(), InvalidState> {
        at_most(
            "the self-test results",
            saved.results.len() as u64,
            RESULTS as u64,
        )?;
        let results = (saved.results.iter())
            .map(|r| record::<SelfTestResult>("a self-test result", &r.0))
            .collect::<Result<_, _>>()?;
        *self.state.lock() = State {
            running: None,
            results,
            generation: saved.generation,
        };
        Ok(())
    }
}
