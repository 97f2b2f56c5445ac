//! EventIdx arithmetic (Doorbell Buffer Config, NVMe Base 2.0 §5.8), once
//! for both sides: the host's test of whether a doorbell update must reach
//! the register (the driver's), and the EventIdx a polling device publishes
//! so that it never does (the controller's).
//!
//! The host writes the register only when its shadow value moves from
//! `old` to `new` across EventIdx, all mod 2^16. Linux and SPDK differ by
//! one: Linux rings when EventIdx lies in `[old, new)`, SPDK and libvfn in
//! `[old, new]`; a device must be right for both.
//!
//! The arithmetic is mod 2^16 while ring indexes wrap at the queue size, so
//! an update that wraps the ring covers every value from `old` up to 65535:
//! an EventIdx of 0xFFFF ("never", as SPDK's target writes in poll mode)
//! still costs one register write per ring wrap. A device that wants no
//! writes at all keeps EventIdx one [`behind`] the value it has seen.

/// Linux `nvme_dbbuf_need_event`: `(u16)(new - event_idx - 1) < (u16)(new
/// - old)`: notify when the update moves the value past EventIdx, i.e.
/// EventIdx is in `[old, new)`.
pub fn need_event_linux(event_idx: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event_idx).wrapping_sub(1) < new.wrapping_sub(old)
}

/// SPDK / libvfn: `(u16)(new - event_idx) <= (u16)(new - old)`: notify
/// when the update moves the value onto or past EventIdx, i.e. EventIdx is
/// in `[old, new]`.
pub fn need_event_spdk(event_idx: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event_idx) <= new.wrapping_sub(old)
}

/// The EventIdx that keeps a polling device's host from trapping: one
/// behind the value seen, mod 2^16. Every value the host can move to lies
/// ahead of `seen` within the ring, so neither interval above reaches
/// `seen - 1`, except SPDK's when the host fills the ring completely (`new
/// == seen - 1`), which traps once (unless `seen` is 0 in a ring shorter
/// than 2^16): the safe direction. Valid only while the device keeps it
/// updated.
pub fn behind(seen: u16) -> u16 {
    seen.wrapping_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_fires_when_crossing_event_idx() {
        // The device wants to hear once the tail moves past 5.
        assert!(need_event_linux(5, 6, 5));
        assert!(need_event_linux(5, 8, 3));
        assert!(
            !need_event_linux(5, 5, 3),
            "reaching EventIdx is not past it"
        );
        assert!(!need_event_linux(5, 4, 3));
        // Wrap-around.
        assert!(need_event_linux(65535, 2, 65534));
        assert!(!need_event_linux(2, 65534, 65533));
    }

    #[test]
    fn spdk_fires_when_reaching_or_crossing_event_idx() {
        assert!(need_event_spdk(5, 5, 3));
        assert!(need_event_spdk(5, 6, 5));
        assert!(!need_event_spdk(5, 4, 3));
        assert!(need_event_spdk(0, 1, 65534));
        assert!(!need_event_spdk(2, 1, 65534));
    }

    #[test]
    fn one_behind_what_was_seen_is_never_crossed_by_a_move_ahead_of_it() {
        for seen in [0u16, 1, 7, 65535] {
            let ei = behind(seen);
            for (old, new) in [(seen, seen.wrapping_add(1)), (seen, seen.wrapping_add(100))] {
                assert!(!need_event_linux(ei, new, old), "{seen}: {old} -> {new}");
                assert!(!need_event_spdk(ei, new, old), "{seen}: {old} -> {new}");
            }
        }
    }
}
