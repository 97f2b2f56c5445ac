//! A fault for tests of crash recovery (the control socket's
//! `hold_message`, offered under `--supervise` only): holds the thread
//! serving the client in the next vfio-user message of one command until
//! the process dies, so a test can kill the server at a known point of
//! its handling.
//!
//! * `handling`: the message is marked in the crash area (and its fds are
//!   with the supervisor), nothing of it is done;
//! * `kept`: it is done, its effect is kept in the crash area (when the
//!   checkpoint succeeded) and its reply is staged; the mark is not yet
//!   cleared.
//!
//! Unset, it costs a relaxed load per message of a supervised server.

use std::sync::atomic::{AtomicU64, Ordering};

/// Where the message is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum At {
    Handling,
    Kept,
}

/// 0: nothing armed; else [`ARMED_BIT`], bit 16 for [`At::Kept`], the
/// command in bits 0-15.
static ARMED: AtomicU64 = AtomicU64::new(0);
const ARMED_BIT: u64 = 1 << 32;
const KEPT_BIT: u64 = 1 << 16;
/// A `kept` hold matched the message being handled, which it holds at the
/// clear: 0, or [`ARMED_BIT`] with its msg_id in bits 16-31 and command.
static DUE_AT_CLEAR: AtomicU64 = AtomicU64::new(0);

/// Holds the next message of `command` at `at` (replacing what was armed).
pub fn arm(command: u16, at: At) {
    let kept = if at == At::Kept { KEPT_BIT } else { 0 };
    ARMED.store(ARMED_BIT | kept | u64::from(command), Ordering::Release);
}

/// The message `msg_id` of `command` is marked: held here if armed for it
/// at [`At::Handling`], or later at [`at_clear`] if at [`At::Kept`].
pub(crate) fn at_mark(msg_id: u16, command: u16) {
    let armed = ARMED.load(Ordering::Relaxed);
    if armed == 0 || armed as u16 != command {
        return;
    }
    if ARMED
        .compare_exchange(armed, 0, Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    if armed & KEPT_BIT != 0 {
        let due = ARMED_BIT | (u64::from(msg_id) << 16) | u64::from(command);
        DUE_AT_CLEAR.store(due, Ordering::Release);
    } else {
        hold(msg_id, command, "marked, before it is handled");
    }
}

/// The marked message is done and kept: held here if [`at_mark`] said so.
pub(crate) fn at_clear() {
    if DUE_AT_CLEAR.load(Ordering::Relaxed) == 0 {
        return;
    }
    let due = DUE_AT_CLEAR.swap(0, Ordering::AcqRel);
    if due != 0 {
        let (msg_id, command) = ((due >> 16) as u16, due as u16);
        hold(
            msg_id,
            command,
            "handled and kept, before its mark is cleared",
        );
    }
}

fn hold(msg_id: u16, command: u16, at: &str) -> ! {
    tracing::warn!(
        "hold_message: holding vfio-user message {msg_id} (command {command}) {at}, until this \
         process dies"
    );
    loop {
        std::thread::park();
    }
}
