//! Persistent Event Log page (0Dh, §5.16.1.14): the LSP action decides
//! whether the host establishes, reads or releases its reporting context.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use vnvme_spec::log::persistent_event::{action, PersistentEventLsp};
use vnvme_spec::Status;

use super::{invalid_field, Request};

/// A read with no context, or an establish over an existing one, is a
/// Command Sequence Error; action 11b is reserved.
pub(super) fn read(req: &Request<'_>) -> Result<Vec<u8>, Status> {
    let pel = &req.shared.reporting.persistent_events;
    let sequence_error = || Status::COMMAND_SEQUENCE_ERROR.with_dnr(true);
    match PersistentEventLsp::from_bits(req.lsp).action() {
        action::READ => pel.context().map(|p| p.to_vec()).ok_or_else(sequence_error),
        action::ESTABLISH_CONTEXT_AND_READ => {
            let power_cycles = req.shared.stats.power_cycles.load(Relaxed);
            pel.establish(Instant::now(), power_cycles)
                .map(|p| p.to_vec())
                .ok_or_else(sequence_error)
        }
        action::RELEASE_CONTEXT => {
            pel.release();
            Ok(Vec::new())
        }
        _ => Err(invalid_field()),
    }
}
