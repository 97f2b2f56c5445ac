//! Configuration space storage: every byte next to its guest-writable mask
//! and its write-1-to-clear mask (the Cloud Hypervisor `configuration.rs`
//! model), so read-only bits are enforced in one place.

/// Capability IDs (PCI Local Bus 3.0 §6.7, Appendix H).
pub mod cap_id {
    pub const POWER_MANAGEMENT: u8 = 0x01;
    pub const MSI: u8 = 0x05;
    pub const PCI_EXPRESS: u8 = 0x10;
    pub const MSIX: u8 = 0x11;
}

/// Size of PCI Express configuration space.
pub const CONFIG_SPACE_SIZE: usize = 4096;

/// 4 KiB of configuration space with per-bit write semantics.
#[derive(Clone, PartialEq, Eq)]
pub struct ConfigSpace {
    bytes: Box<[u8; CONFIG_SPACE_SIZE]>,
    /// Bits the guest may write.
    writable: Box<[u8; CONFIG_SPACE_SIZE]>,
    /// Bits the guest clears by writing 1 (status bits).
    w1c: Box<[u8; CONFIG_SPACE_SIZE]>,
}

impl std::fmt::Debug for ConfigSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigSpace")
            .field("header", &&self.bytes[..64])
            .finish_non_exhaustive()
    }
}

impl Default for ConfigSpace {
    fn default() -> Self {
        Self {
            bytes: Box::new([0; CONFIG_SPACE_SIZE]),
            writable: Box::new([0; CONFIG_SPACE_SIZE]),
            w1c: Box::new([0; CONFIG_SPACE_SIZE]),
        }
    }
}

impl ConfigSpace {
    /// Guest read of any size at any offset; bytes outside the space read 0.
    pub fn read(&self, offset: u64, buf: &mut [u8]) {
        for (i, b) in buf.iter_mut().enumerate() {
            *b = offset
                .checked_add(i as u64)
                .and_then(|o| usize::try_from(o).ok())
                .and_then(|o| self.bytes.get(o).copied())
                .unwrap_or(0);
        }
    }

    /// Guest write of any size at any offset: writable bits take the new
    /// value, W1C bits written as 1 clear, everything else is kept. Bytes
    /// outside the space are ignored.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        for (i, v) in data.iter().enumerate() {
            let Some(o) = offset
                .checked_add(i as u64)
                .and_then(|o| usize::try_from(o).ok())
            else {
                return;
            };
            if o >= CONFIG_SPACE_SIZE {
                return;
            }
            let w = self.writable[o];
            let c = self.w1c[o];
            let old = self.bytes[o];
            self.bytes[o] = ((old & !w) | (v & w)) & !(v & c);
        }
    }

    /// The whole space as it stands, for a live upgrade to hand to the
    /// next process ([`load`](Self::load)).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..]
    }

    /// Puts back what [`bytes`](Self::bytes) gave, as far as the guest
    /// could have changed it: only guest-writable bits and W1C bits are
    /// taken from `saved` (the IDs, capability list and other read-only
    /// fields stay this function's own, whatever `saved` holds). False,
    /// and nothing changed, if `saved` is not the space's size.
    pub fn load(&mut self, saved: &[u8]) -> bool {
        if saved.len() != CONFIG_SPACE_SIZE {
            return false;
        }
        for (o, v) in saved.iter().enumerate() {
            let keep = self.writable[o] | self.w1c[o];
            self.bytes[o] = (self.bytes[o] & !keep) | (v & keep);
        }
        true
    }

    // Device-side accessors (no masks). Offsets are constants of ours, so an
    // out-of-range one is a bug; they are still ignored rather than panicking.

    pub fn get_u8(&self, offset: usize) -> u8 {
        self.bytes.get(offset).copied().unwrap_or(0)
    }

    pub fn get_u16(&self, offset: usize) -> u16 {
        u16::from_le_bytes([self.get_u8(offset), self.get_u8(offset + 1)])
    }

    pub fn get_u32(&self, offset: usize) -> u32 {
        u32::from_le_bytes([
            self.get_u8(offset),
            self.get_u8(offset + 1),
            self.get_u8(offset + 2),
            self.get_u8(offset + 3),
        ])
    }

    fn set_bytes(field: &mut [u8; CONFIG_SPACE_SIZE], offset: usize, value: &[u8]) {
        if let Some(dst) = field.get_mut(offset..offset + value.len()) {
            dst.copy_from_slice(value);
        }
    }

    pub fn set_u8(&mut self, offset: usize, v: u8) {
        Self::set_bytes(&mut self.bytes, offset, &[v]);
    }

    pub fn set_u16(&mut self, offset: usize, v: u16) {
        Self::set_bytes(&mut self.bytes, offset, &v.to_le_bytes());
    }

    pub fn set_u32(&mut self, offset: usize, v: u32) {
        Self::set_bytes(&mut self.bytes, offset, &v.to_le_bytes());
    }

    /// Declares a register: its reset value, guest-writable bits and W1C bits.
    pub fn define(&mut self, offset: usize, width: usize, value: u32, writable: u32, w1c: u32) {
        let n = width.min(4);
        Self::set_bytes(&mut self.bytes, offset, &value.to_le_bytes()[..n]);
        Self::set_bytes(&mut self.writable, offset, &writable.to_le_bytes()[..n]);
        Self::set_bytes(&mut self.w1c, offset, &w1c.to_le_bytes()[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_apply_per_bit() {
        let mut c = ConfigSpace::default();
        c.define(0x10, 4, 0x0000_000c, 0xffff_f000, 0);
        c.define(0x06, 2, 0x8010, 0, 0xf900);
        c.write(0x10, &[0xff; 4]);
        assert_eq!(c.get_u32(0x10), 0xffff_f00c);
        c.write(0x06, &0x8010u16.to_le_bytes());
        assert_eq!(c.get_u16(0x06), 0x0010);
    }

    #[test]
    fn out_of_range_accesses_are_ignored_or_zero() {
        let mut c = ConfigSpace::default();
        c.define(0xffe, 2, 0xabcd, 0xffff, 0);
        let mut b = [0xaa; 4];
        c.read(0xffe, &mut b);
        assert_eq!(b, [0xcd, 0xab, 0, 0]);
        c.write(0xfff, &[1, 2, 3]);
        assert_eq!(c.get_u8(0xfff), 1);
        c.read(u64::MAX, &mut b);
        assert_eq!(b, [0; 4]);
        c.write(u64::MAX - 1, &[1, 2, 3, 4]);
    }
}
