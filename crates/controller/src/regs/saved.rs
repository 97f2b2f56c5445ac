//! The register file's saved form (docs/state-format.md, `regs`): what a
//! host wrote and what it reads back. CAP, VS and CRTO follow from the
//! configuration: CAP is kept only to check that the restoring controller
//! offers the same one (a host keeps using what it read at enable).

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use vnvme_spec::regs::{Aqa, Cc, Csts};

use super::Regs;
use crate::config::ControllerConfig;
use crate::saved_check::{same, InvalidState};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedRegs {
    /// CAP as offered (checked, not restored).
    pub cap: u64,
    /// INTMS/INTMC: the interrupt mask, a bit per vector.
    pub intm: u32,
    pub cc: u32,
    /// CSTS as the register file holds it (CFS here: an enable refused;
    /// a fatal error of the workers is the lifecycle's).
    pub csts: u32,
    pub aqa: u32,
    pub asq: u64,
    pub acq: u64,
    /// Ready with media: CSTS.RDY turns 1 this many microseconds after the
    /// save (`None`: no RDY pending).
    pub rdy_in_us: Option<u64>,
}

impl Regs {
    pub fn save(&self, now: Instant) -> SavedRegs {
        SavedRegs {
            cap: u64::from(self.cap),
            intm: self.intm,
            cc: u32::from(self.cc),
            csts: u32::from(self.csts),
            aqa: u32::from(self.aqa),
            asq: self.asq,
            acq: self.acq,
            rdy_in_us: self
                .rdy_at
                .map(|t| t.saturating_duration_since(now).as_micros() as u64),
        }
    }

    /// The register file of `config` as `saved` left it.
    pub fn restored(
        config: &ControllerConfig,
        saved: &SavedRegs,
        now: Instant,
    ) -> Result<Self, InvalidState> {
        let mut regs = Self::new(config);
        same("CAP", saved.cap, u64::from(regs.cap))?;
        regs.intm = saved.intm;
        regs.cc = Cc::from(saved.cc);
        regs.csts = Csts::from(saved.csts);
        regs.aqa = Aqa::from(saved.aqa);
        regs.asq = saved.asq;
        regs.acq = saved.acq;
        regs.rdy_at = saved
            .rdy_in_us
            .and_then(|us| now.checked_add(Duration::from_micros(us)));
        Ok(regs)
    }
}
