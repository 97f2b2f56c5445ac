//! The interrupt state's saved form (docs/state-format.md, `interrupts`):
//! Interrupt Coalescing (feature 08h) and each vector's Coalescing Disable
//! (feature 09h). The mask (INTMS) is a register, saved with them; an INTx
//! interrupt the mask held, and each CQ's pending count, are not saved: a
//! restore raises every CQ's interrupt once instead (a spurious interrupt
//! costs a host a look; a lost one, a timeout).

use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::Interrupts;
use crate::saved_check::{same, InvalidState};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedInterrupts {
    /// Interrupt Coalescing: THR (7:0), TIME (15:8).
    pub coalescing: u32,
    /// Vectors (by index) whose Coalescing Disable bit is set.
    pub coalescing_disabled: Vec<u16>,
    /// How many vectors the controller had (checked).
    pub vectors: u16,
}

impl Interrupts {
    pub fn save(&self) -> SavedInterrupts {
        SavedInterrupts {
            coalescing: self.coalescing(),
            coalescing_disabled: (self.coalescing_disabled.iter().enumerate())
                .filter(|(_, cd)| cd.load(Ordering::Relaxed))
                .map(|(iv, _)| iv as u16)
                .collect(),
            vectors: self.coalescing_disabled.len() as u16,
        }
    }

    /// Applies `saved`, and `intm` (the mask register).
    pub fn restore(&self, saved: &SavedInterrupts, intm: u32) -> Result<(), InvalidState> {
        same(
            "the number of MSI-X vectors",
            usize::from(saved.vectors),
            self.coalescing_disabled.len(),
        )?;
        for &iv in &saved.coalescing_disabled {
            if self.coalescing_disabled(iv).is_none() {
                return Err(crate::saved_check::InvalidState::OutOfRange {
                    what: "a vector with coalescing disabled".into(),
                    value: u64::from(iv),
                    max: u64::from(saved.vectors.saturating_sub(1)),
                });
            }
        }
        self.coalescing
            .store(saved.coalescing & 0xFFFF, Ordering::Relaxed);
        for &iv in &saved.coalescing_disabled {
            self.set_coalescing_disabled(iv, true);
        }
        self.set_mask(intm);
        Ok(())
    }
}
