//! Commands a live upgrade hands to the new process (docs/upgrade.md):
//! fetched and not yet given to a backend, because something holds them back
//! (a QoS limit, a fault's delay or never-complete, a Preempt and Abort's
//! fence). They are not in the saved state's body (its format is for a
//! controller at rest): the upgrade's manifest carries them beside it, and
//! [`Controller::restore`](crate::Controller::restore) holds them again in
//! the new process before its workers start.
//!
//! Commands already on a backend are never handed over: the drain waits
//! for them, since a write run again while its first copy may still land
//! could overwrite data the guest wrote after seeing the second complete.

use serde::{Deserialize, Serialize};
use vnvme_spec::Command;
use zerocopy::{FromBytes, IntoBytes};

/// What holds a handed command back, and so what the new process does
/// with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Hold {
    /// An IOPS or bandwidth limit: run when the old process's limits
    /// let it, or charged again under the new process's once it sets
    /// them (as when limits change).
    Qos,
    /// A latency fault: run once the delay left is over (the fault rule
    /// itself is not carried, as no fault is).
    Delay,
    /// A never-complete fault: held until Abort asks for it or a reset.
    Never,
    /// A Preempt and Abort that ran (its change is in the saved
    /// reservations) and waited for the commands admitted before it, all
    /// done by the drain: completed with success.
    Fence,
}

/// One command held back at the save.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandedCommand {
    /// The SQ it was fetched from and the CQ its completion goes to.
    pub sqid: u16,
    pub cqid: u16,
    /// Its Command Identifier (also in `sqe`), for a reader and a check.
    pub cid: u16,
    /// The 64-byte submission queue entry, as 16 little-endian dwords.
    pub sqe: [u32; 16],
    pub hold: Hold,
    /// Microseconds left until it may start (`None`: never, or a fence).
    pub due_in_us: Option<u64>,
    /// Abort asked for it: the new process completes it with Command
    /// Abort Requested.
    pub aborted: bool,
}

impl HandedCommand {
    /// The dwords of `cmd`.
    pub(crate) fn dwords(cmd: &Command) -> [u32; 16] {
        let mut out = [0u32; 16];
        for (d, chunk) in out.iter_mut().zip(cmd.as_bytes().chunks_exact(4)) {
            *d = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        }
        out
    }

    /// The command its dwords hold.
    pub(crate) fn command(&self) -> Command {
        let mut bytes = [0u8; Command::SIZE];
        for (chunk, d) in bytes.chunks_exact_mut(4).zip(self.sqe) {
            chunk.copy_from_slice(&d.to_le_bytes());
        }
        Command::read_from_bytes(&bytes).unwrap_or_default()
    }
}
