//! Admin commands of the NVM Write Command Group (NVMe Base 2.1 §8.1.24,
//! "Command Behavior in the Presence of a Reservation"): Format NVM,
//! Namespace Attachment, Namespace Management (delete) and Sanitize change
//! what a namespace holds or who sees it, so a host that may not write a
//! namespace such a command affects gets Reservation Conflict, as its
//! Write would.

use vnvme_spec::cdw::{Cdw10NsManagement, Cdw10Sanitize};
use vnvme_spec::log::sanitize::action;
use vnvme_spec::{AdminOpcode, Command, Status};

use crate::command::Ctx;
use crate::namespace::NSID_ALL;

/// Reservation Conflict unless this controller's host may write every
/// namespace `op` would change; commands outside the group pass.
pub(super) fn check(ctx: &Ctx<'_>, op: AdminOpcode, cmd: &Command) -> Result<(), Status> {
    let namespaces = &ctx.shared.subsystem.namespaces;
    let nsid = cmd.nsid.get();
    let affected = match op {
        AdminOpcode::FORMAT_NVM if nsid == NSID_ALL => namespaces.active_list(),
        AdminOpcode::FORMAT_NVM | AdminOpcode::NAMESPACE_ATTACHMENT => {
            namespaces.get(nsid).into_iter().collect()
        }
        AdminOpcode::NAMESPACE_MANAGEMENT if Cdw10NsManagement::from(cmd.cdw10).sel() == 1 => {
            if nsid == NSID_ALL {
                namespaces.allocated_list()
            } else {
                namespaces.get(nsid).into_iter().collect()
            }
        }
        // The whole NVM subsystem's media; exiting the failure mode
        // changes none.
        AdminOpcode::SANITIZE
            if Cdw10Sanitize::from(cmd.cdw10).sanact() != action::EXIT_FAILURE_MODE =>
        {
            namespaces.allocated_list()
        }
        _ => return Ok(()),
    };
    let host = ctx.shared.features.admin.lock().host_id;
    for ns in affected {
        // Admitted and dropped at once: an admin command is not one a
        // Preempt and Abort waits for.
        ns.reservations.check(|| host, true)?;
    }
    Ok(())
}
