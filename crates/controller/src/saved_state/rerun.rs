//! Which admin commands a crash interrupted a restore runs again
//! (`vnvme serve --supervise`, issue 35). Linux sends every admin command
//! with REQ_FAILFAST_DRIVER (`nvme_init_request`), so it never retries
//! one that completes with Command Interrupted: the caller (the driver's
//! own Set Features at a reset, nvme-cli) gets the error. A command whose
//! completion was owed (`crate::queue::owed`) and whose effect no slot
//! holds is run again instead, against the restored state, which lacks
//! its effect: as if it arrived after the crash. That needs its 64 bytes
//! kept with its in-flight record ([`CrashRecord::admin_command`]), since
//! the host may reuse its SQ entry once later completions report the head
//! past it. Data it reads from guest memory is still the host's: the
//! command never completed.
//!
//! [`CrashRecord::admin_command`]: crate::crash_record::CrashRecord::admin_command

use vnvme_spec::AdminOpcode;

/// Whether an interrupted admin command of opcode `op` is run again at
/// the restore (`true`) or completed with Command Interrupted (`false`).
/// One entry per opcode, each with its reason.
pub(crate) fn runs_again(op: AdminOpcode) -> bool {
    match op {
        // The feature's value is in the saved features; setting it again
        // is setting it once (its buffer, if any, is still the host's).
        AdminOpcode::SET_FEATURES => true,
        // The queues are in the saved queue table; the restored table
        // lacks the queue created or still has the one deleted.
        AdminOpcode::CREATE_IO_SQ
        | AdminOpcode::CREATE_IO_CQ
        | AdminOpcode::DELETE_IO_SQ
        | AdminOpcode::DELETE_IO_CQ => true,
        // Attachments are in the saved subsystem; the Changed Namespace
        // List and its event are made again with them.
        AdminOpcode::NAMESPACE_ATTACHMENT => true,
        // The shadow and EventIdx addresses are in the saved doorbells.
        AdminOpcode::DOORBELL_BUFFER_CONFIG => true,
        // Streams and their allocations are in the saved namespaces.
        AdminOpcode::DIRECTIVE_SEND => true,
        // Restarts the Keep Alive Timer, which the restore started anew.
        AdminOpcode::KEEP_ALIVE => true,
        // Reading a log may clear events or take a telemetry capture, and
        // a Directive Receive may allocate resources: both in the saved
        // state, run again as if they came after the crash.
        AdminOpcode::GET_LOG_PAGE | AdminOpcode::DIRECTIVE_RECEIVE => true,
        // Its target may have been completed as interrupted at this very
        // restore, and run now it would leave a pending abort for a CID
        // the host reuses for its retry.
        AdminOpcode::ABORT => false,
        // The blocks it erased are in the backend, not in the saved state:
        // the restore has the new format, or not, beside erased data.
        AdminOpcode::FORMAT_NVM | AdminOpcode::SANITIZE => false,
        // The image pieces and the slots live in the subsystem's firmware
        // store beside the backend; a commit may have activated already.
        AdminOpcode::FIRMWARE_IMAGE_DOWNLOAD | AdminOpcode::FIRMWARE_COMMIT => false,
        // Creating a namespace allocates storage outside the saved state
        // and picks an NSID: run again it could make a second one.
        AdminOpcode::NAMESPACE_MANAGEMENT => false,
        // A test runs in the background against the backend; starting it
        // again would report a second test the host did not ask for.
        AdminOpcode::DEVICE_SELF_TEST => false,
        // Kept outstanding by the restore already (`positions.rs`), never
        // owed; Identify and Get Features are never owed (read only).
        AdminOpcode::ASYNC_EVENT_REQUEST | AdminOpcode::IDENTIFY | AdminOpcode::GET_FEATURES => {
            false
        }
        // Security Send and vendor commands: effects this controller does
        // not know are kept in its state.
        _ => false,
    }
}
