//! Endurance Group Information log page (09h, §5.16.1.10). One endurance
//! group, [`ENDURANCE_GROUP_ID`], holds every namespace, so its counters
//! are the controller's.

use vnvme_spec::log::endurance::EnduranceGroupLog;
use vnvme_spec::log::set_u128;
use vnvme_spec::Status;
use zerocopy::IntoBytes;

use super::{invalid_field, Health, Request};
use crate::namespace::ENDURANCE_GROUP_ID;

/// The group named by the Log Specific Identifier; any other id is
/// Invalid Field.
pub(super) fn information(req: &Request<'_>) -> Result<Vec<u8>, Status> {
    if req.lsi != ENDURANCE_GROUP_ID {
        return Err(invalid_field());
    }
    let shared = req.shared;
    let h = Health::of(&shared.stats, &shared.reporting);
    let mut log = EnduranceGroupLog::new_boxed();
    log.available_spare = 100;
    log.available_spare_threshold = 10;
    set_u128(&mut log.data_units_read, h.data_units_read);
    set_u128(&mut log.data_units_written, h.data_units_written);
    // Media writes are the host's: no write amplification in RAM or a file.
    set_u128(&mut log.media_units_written, h.data_units_written);
    set_u128(&mut log.host_read_commands, h.host_read_commands);
    set_u128(&mut log.host_write_commands, h.host_write_commands);
    set_u128(&mut log.media_and_data_integrity_errors, h.media_errors);
    set_u128(&mut log.error_log_entries, h.error_log_entries);
    let total = shared.subsystem.tnvmcap;
    let allocated = shared.subsystem.namespaces.allocated();
    set_u128(&mut log.tegcap, u128::from(total));
    set_u128(&mut log.uegcap, u128::from(total.saturating_sub(allocated)));
    Ok(log.as_bytes().to_vec())
}
