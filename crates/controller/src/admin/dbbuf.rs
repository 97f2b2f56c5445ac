//! Doorbell Buffer Config (NVMe Base 2.0 §5.8; 1.3 §5.7): the host gives a
//! shadow doorbell buffer (PRP1) and an EventIdx buffer (PRP2), one memory
//! page each, laid out like the doorbell registers.

use std::sync::atomic::Ordering;

use vnvme_spec::{Command, Status};

use super::invalid_field;
use crate::command::Ctx;
use crate::memory::GuestAddress;
use crate::queue::rings::RingOp;

/// The two buffers, checked.
struct Buffers {
    shadow: GuestAddress,
    event_idx: GuestAddress,
    /// Queue ids whose doorbells the buffers hold: every queue the controller
    /// can grant, plus the admin queue.
    queue_ids: u16,
}

/// Checks the command (§5.8): both pages aligned to CC.MPS, distinct, and
/// big enough for the doorbells of every queue the controller can grant
/// (`(4 << DSTRD) * 2 * (max I/O queues + 1)` bytes, DSTRD = 0), and
/// both reachable. Anything else is Invalid Field in Command with DNR —
/// unreachable memory included: the spec lists a bad address under Invalid
/// Field, and the host learns it now rather than through a silent queue.
fn parse(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<Buffers, Status> {
    let page = ctx.session.page_size;
    let shadow = GuestAddress(cmd.prp1.get());
    let event_idx = GuestAddress(cmd.prp2.get());
    // CC.MPS's page size is a power of two.
    if page == 0 || !shadow.is_aligned(page) || !event_idx.is_aligned(page) || shadow == event_idx {
        return Err(invalid_field());
    }
    // What the controller can grant, not what Number of Queues granted so
    // far: the host may still raise NSQA/NCQA before creating queues.
    let queue_ids = ctx.shared.config.max_io_queues.saturating_add(1);
    let bytes = 8 * u64::from(queue_ids);
    if bytes > page {
        return Err(invalid_field());
    }
    let buf = &mut ctx.scratch.buf;
    buf.clear();
    buf.resize(bytes as usize, 0);
    let mem = &*ctx.session.mem;
    if mem.read(shadow, buf).is_err() || mem.read(event_idx, buf).is_err() {
        tracing::debug!(
            ?shadow,
            ?event_idx,
            "doorbell buffer config: buffer not mapped"
        );
        return Err(invalid_field());
    }
    Ok(Buffers {
        shadow,
        event_idx,
        queue_ids,
    })
}

/// Doorbell Buffer Config. Queues that already exist keep working: the
/// doorbells seed each open doorbell's shadow slot and EventIdx with its
/// current value (so the host's next move past it traps), then its queue
/// switches to the shadow source. The admin queue's own source is switched
/// by its worker after this command completes (it owns those rings).
pub(super) fn doorbell_buffer_config(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<(), Status> {
    let b = parse(ctx, cmd)?;
    let shared = ctx.shared;
    let doorbells = &shared.doorbells;
    let seeded =
        doorbells.configure_dbbuf(b.shadow, b.event_idx, ctx.session.mem.clone(), b.queue_ids);
    // Switch (or, on failure, revert) every I/O queue's source: their
    // workers own the rings, and take this before any kick that follows.
    for m in shared.queues.mailboxes.iter().skip(1) {
        m.send(RingOp::Sources);
    }
    if !seeded {
        return Err(invalid_field());
    }
    shared.stats.dbbuf_configs.fetch_add(1, Ordering::Relaxed);
    Ok(())
}
