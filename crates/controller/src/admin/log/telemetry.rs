//! Telemetry Host-Initiated (07h) and Controller-Initiated (08h) log pages
//! (§5.16.1.8, §5.16.1.9): the captures of [`crate::reporting::telemetry`].

use std::time::Instant;

use vnvme_spec::log::persistent_event::EventType;
use vnvme_spec::log::telemetry::{TelemetryHostLsp, BLOCK};
use vnvme_spec::log::LogPageId;
use vnvme_spec::Status;

use super::{invalid_field, Request};

/// The host reads a telemetry log in whole data blocks (§8.24).
fn check_offset(req: &Request<'_>) -> Result<(), Status> {
    if req.offset.is_multiple_of(BLOCK as u64) {
        Ok(())
    } else {
        Err(invalid_field())
    }
}

/// Log 07h; with LSP.CTHID set, a new capture first (recorded in the
/// Persistent Event Log as a Telemetry Log Create event).
pub(super) fn host_initiated(req: &Request<'_>) -> Result<Vec<u8>, Status> {
    check_offset(req)?;
    let lsp = TelemetryHostLsp::from_bits(req.lsp);
    let shared = req.shared;
    let lid = LogPageId::TELEMETRY_HOST_INITIATED;
    if lsp.cthid() {
        // MCDA 5 to 7 are reserved.
        if lsp.mcda() > 4 {
            return Err(invalid_field());
        }
        let capture = shared
            .reporting
            .telemetry_capture(&shared.stats, shared.lifecycle.uptime(), "host-initiated")
            .limit(lsp.mcda());
        shared.reporting.telemetry.host_initiated(capture);
        let page = shared.reporting.telemetry.page(lid);
        let header = page.get(..BLOCK).unwrap_or_default().to_vec();
        shared.reporting.persistent_events.record(
            EventType::TELEMETRY_LOG_CREATE,
            Instant::now(),
            header,
        );
        return Ok(page);
    }
    Ok(shared.reporting.telemetry.page(lid))
}

/// Log 08h.
pub(super) fn controller_initiated(req: &Request<'_>) -> Result<Vec<u8>, Status> {
    check_offset(req)?;
    Ok(req
        .shared
        .reporting
        .telemetry
        .page(LogPageId::TELEMETRY_CONTROLLER_INITIATED))
}

/// Read with RAE cleared, the controller-initiated data the host saw
/// (Data Available and its generation in the header) is released: the
/// next failure may be captured.
pub(super) fn release_controller_initiated(req: &Request<'_>, page: &[u8]) {
    const DATA_AVAILABLE: usize = 382;
    const GENERATION: usize = 383;
    if req.rae || page.get(DATA_AVAILABLE) != Some(&1) {
        return;
    }
    if let Some(&generation) = page.get(GENERATION) {
        req.shared
            .reporting
            .telemetry
            .release_controller(generation);
    }
}
