//! Admin command set (NVMe Base 2.0 §5): dispatch, and the small commands.

pub(crate) mod abort;
mod dbbuf;
mod directives;
mod feature_data;
mod features;
mod firmware;
mod identify;
mod log;
mod namespaces;
pub(crate) use namespaces::{forget, record_change, set_attached};
pub(crate) mod queues;
mod reserved;
mod sanitize;
mod self_test;
mod zns;

/// Goes on with a sanitize a pause stopped (or a restored state holds).
pub(crate) use sanitize::resume as resume_sanitize;

use vnvme_spec::{AdminOpcode, Command, Status};

use crate::command::{Ctx, Outcome};
use crate::reporting::AERL;

/// Admin opcodes this controller implements (Commands Supported and Effects).
pub(crate) const SUPPORTED: &[AdminOpcode] = &[
    AdminOpcode::DELETE_IO_SQ,
    AdminOpcode::CREATE_IO_SQ,
    AdminOpcode::GET_LOG_PAGE,
    AdminOpcode::DELETE_IO_CQ,
    AdminOpcode::CREATE_IO_CQ,
    AdminOpcode::IDENTIFY,
    AdminOpcode::ABORT,
    AdminOpcode::SET_FEATURES,
    AdminOpcode::GET_FEATURES,
    AdminOpcode::ASYNC_EVENT_REQUEST,
    AdminOpcode::DOORBELL_BUFFER_CONFIG,
    AdminOpcode::NAMESPACE_MANAGEMENT,
    AdminOpcode::FIRMWARE_COMMIT,
    AdminOpcode::FIRMWARE_IMAGE_DOWNLOAD,
    AdminOpcode::DEVICE_SELF_TEST,
    AdminOpcode::NAMESPACE_ATTACHMENT,
    AdminOpcode::KEEP_ALIVE,
    AdminOpcode::DIRECTIVE_SEND,
    AdminOpcode::DIRECTIVE_RECEIVE,
    AdminOpcode::FORMAT_NVM,
    AdminOpcode::SANITIZE,
];

/// Whether this controller accepts `op` (Doorbell Buffer Config only in the
/// modes that advertise it in OACS).
pub(crate) fn supported(op: AdminOpcode, config: &crate::ControllerConfig) -> bool {
    SUPPORTED.contains(&op)
        && (op != AdminOpcode::DOORBELL_BUFFER_CONFIG || config.doorbells.uses_dbbuf())
}

pub(crate) use vnvme_spec::status::invalid_field;

/// Executes one admin command.
pub(crate) fn execute(ctx: &mut Ctx<'_>, cmd: &Command) -> Outcome {
    let op = AdminOpcode(cmd.opcode());
    if op.is_vendor_specific() {
        let set = crate::vendor::CommandSet::Admin;
        return Outcome::from_result(crate::command::execute_vendor(ctx, set, cmd));
    }
    if !supported(op, &ctx.shared.config) {
        return Outcome::from_result(Err(Status::INVALID_OPCODE.with_dnr(true)));
    }
    if cmd.fuse() != 0 || cmd.psdt() != 0 {
        return Outcome::from_result(Err(invalid_field()));
    }
    if let Some(status) = sanitize::refusal(ctx.shared.sanitize(), op) {
        return Outcome::from_result(Err(status));
    }
    if let Err(status) = reserved::check(ctx, op, cmd) {
        return Outcome::from_result(Err(status));
    }
    match op {
        AdminOpcode::ASYNC_EVENT_REQUEST => async_event_request(ctx, cmd),
        _ => Outcome::from_result(match op {
            AdminOpcode::IDENTIFY => identify::identify(ctx, cmd).map(|()| 0),
            AdminOpcode::CREATE_IO_CQ => queues::create_cq(ctx, cmd).map(|()| 0),
            AdminOpcode::CREATE_IO_SQ => queues::create_sq(ctx, cmd).map(|()| 0),
            AdminOpcode::DELETE_IO_CQ => {
                return queues::delete_cq(ctx, cmd)
                    .unwrap_or_else(|status| Outcome::Done { dw0: 0, status })
            }
            AdminOpcode::DELETE_IO_SQ => {
                return queues::delete_sq(ctx, cmd)
                    .unwrap_or_else(|status| Outcome::Done { dw0: 0, status })
            }
            AdminOpcode::GET_FEATURES => features::get(ctx, cmd),
            AdminOpcode::SET_FEATURES => features::set(ctx, cmd),
            AdminOpcode::GET_LOG_PAGE => log::get_log_page(ctx, cmd).map(|()| 0),
            AdminOpcode::NAMESPACE_MANAGEMENT => namespaces::namespace_management(ctx, cmd),
            AdminOpcode::NAMESPACE_ATTACHMENT => namespaces::namespace_attachment(ctx, cmd),
            AdminOpcode::FORMAT_NVM => namespaces::format_nvm(ctx, cmd),
            AdminOpcode::FIRMWARE_IMAGE_DOWNLOAD => firmware::image_download(ctx, cmd),
            AdminOpcode::FIRMWARE_COMMIT => firmware::commit(ctx, cmd),
            AdminOpcode::SANITIZE => sanitize::sanitize(ctx, cmd),
            AdminOpcode::DEVICE_SELF_TEST => self_test::device_self_test(ctx, cmd),
            AdminOpcode::DOORBELL_BUFFER_CONFIG => {
                dbbuf::doorbell_buffer_config(ctx, cmd).map(|()| 0)
            }
            // Keep Alive (§5.18): restarts the Keep Alive Timer if it runs.
            AdminOpcode::KEEP_ALIVE => {
                ctx.shared.features.keep_alive.keep_alive();
                Ok(0)
            }
            AdminOpcode::ABORT => {
                return abort::abort(ctx, cmd)
                    .unwrap_or_else(|status| Outcome::Done { dw0: 0, status })
            }
            AdminOpcode::DIRECTIVE_SEND => directives::send(ctx, cmd),
            AdminOpcode::DIRECTIVE_RECEIVE => directives::receive(ctx, cmd),
            _ => Err(Status::INVALID_OPCODE.with_dnr(true)),
        }),
    }
}

/// Asynchronous Event Request (§5.2): held until an event occurs; at most
/// AERL + 1 outstanding.
fn async_event_request(ctx: &mut Ctx<'_>, cmd: &Command) -> Outcome {
    let mut e = ctx.shared.reporting.events.lock();
    if e.outstanding.len() > usize::from(AERL) {
        return Outcome::from_result(Err(Status::AER_LIMIT_EXCEEDED.with_dnr(true)));
    }
    e.outstanding.push(cmd.cid());
    Outcome::Deferred
}
