//! A controller's state, saved whole (docs/state-format.md): everything a
//! host can observe, so that [`Controller::restore`](crate::Controller::restore)
//! brings up a controller whose next commands behave as the saved one's
//! would have. Each part of the controller saves and restores its own
//! values (a `saved` module next to it); this module assembles the parts
//! into a [`SavedState`] and puts it in its envelope ([`envelope`]).
//!
//! Not in the state: namespace data (a `ram` backend's bytes, a file), the
//! client's guest memory and interrupts (given to the restore), counters
//! and injected faults (transient).

mod envelope;
mod error;
mod handed;
pub(crate) mod positions;
mod rerun;

use serde::{Deserialize, Serialize};

use crate::background::SavedBackground;
use crate::doorbell::SavedDoorbells;
use crate::features::SavedFeatures;
use crate::interrupts::SavedInterrupts;
use crate::lifecycle::SavedLifecycle;
use crate::queue::SavedQueues;
use crate::regs::SavedRegs;
use crate::reporting::SavedReporting;
use crate::subsystem::SavedSubsystem;

pub use envelope::{FORMAT_VERSION, HEADER_LEN, MAGIC, OLDEST_READABLE_VERSION};
pub use error::StateError;
pub use handed::{HandedCommand, Hold};
pub use positions::Positions;

/// A saved controller: encode it to bytes with [`encode`](Self::encode),
/// read it back with [`decode`](Self::decode), bring it up with
/// [`Controller::restore`](crate::Controller::restore).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedState {
    pub(crate) body: StateBody,
    /// Commands held back at the save, for the new process of an upgrade
    /// ([`handed`]); not encoded: the upgrade's manifest carries them.
    pub(crate) handed: Vec<HandedCommand>,
    /// Admin commands a crash interrupted that the restore runs again
    /// ([`put_positions`](Self::put_positions), [`rerun`]); not encoded:
    /// the crash area keeps their bytes.
    pub(crate) rerun: Vec<vnvme_spec::Command>,
}

/// The body: one field per part, in the order a restore applies them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StateBody {
    /// The register file (BAR0).
    pub regs: SavedRegs,
    /// CC.SHN completed since the last enable (SMART unsafe shutdowns).
    pub clean_shutdown: bool,
    pub lifecycle: SavedLifecycle,
    pub interrupts: SavedInterrupts,
    pub features: SavedFeatures,
    pub reporting: SavedReporting,
    pub queues: SavedQueues,
    pub doorbells: SavedDoorbells,
    pub subsystem: SavedSubsystem,
    pub background: SavedBackground,
}

impl SavedState {
    /// The state in its envelope: header (magic, format version, lengths,
    /// checksum) and JSON body.
    pub fn encode(&self) -> Vec<u8> {
        envelope::encode(&self.body)
    }

    /// A state [`encode`](Self::encode) wrote, checked: its magic, its
    /// format version (an older one is read or refused by name, never
    /// misread), its lengths and checksum, and a body of this version's
    /// shape. Whether it fits a controller is checked at the restore.
    pub fn decode(bytes: &[u8]) -> Result<Self, StateError> {
        Ok(Self {
            body: envelope::decode(bytes)?,
            handed: Vec::new(),
            rerun: Vec::new(),
        })
    }

    /// The commands held back at the save
    /// ([`Controller::save_state_handing`](crate::Controller::save_state_handing)),
    /// which [`encode`](Self::encode) leaves out.
    pub fn handed(&self) -> &[HandedCommand] {
        &self.handed
    }

    /// This state with `handed` to hold again at the restore (an
    /// upgrade's manifest carried them).
    pub fn with_handed(mut self, handed: Vec<HandedCommand>) -> Self {
        self.handed = handed;
        self
    }

    /// How many admin commands the restore runs again (those a crash
    /// interrupted that [`put_positions`](Self::put_positions) found kept).
    pub fn reruns(&self) -> usize {
        self.rerun.len()
    }

    /// The admin commands to run again (found by
    /// [`put_positions`](Self::put_positions), or still waiting when this
    /// state was saved: the slot does not carry them), each with its CID,
    /// the admin SQ head it waits at (no entry is taken from the admin SQ
    /// before them) and its bytes: a keeper records them in flight again
    /// when it keeps this state, as it does the completions owed.
    pub fn rerun_commands(&self) -> Vec<(u16, u32, [u8; 64])> {
        let admin = self.body.queues.sqs.iter().find(|s| s.qid == 0);
        let head = admin.map_or(0, |s| s.head);
        let bytes = |c: &vnvme_spec::Command| *zerocopy::transmute_ref!(c);
        self.rerun
            .iter()
            .map(|c| (c.cid(), head, bytes(c)))
            .collect()
    }

    /// The body as indented JSON, for a reader (the encoded body is the
    /// same JSON without the indentation).
    pub fn to_json_pretty(&self) -> String {
        serde_json::to_string_pretty(&self.body).unwrap_or_default()
    }
}
