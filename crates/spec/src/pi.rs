//! Protection information tuples (NVM Command Set 1.0 §5.3.1): what a
//! namespace formatted with a PI type keeps in each block's metadata, big
//! endian, and the guard CRCs.
//!
//! | guard | bytes | guard | application tag | reference tag |
//! |---|---|---|---|---|
//! | 16-bit (CRC-16 T10-DIF) | 8 | 0..2 | 2..4 | 4..8, 32 bits |
//! | 64-bit (CRC-64 NVMe), ELBAF.PIF 10b | 16 | 0..8 | 8..10 | 10..16, 48 bits (STS = 0) |
//!
//! The CRCs come from `vnvme-crc`, which folds with carry-less
//! multiplication: 256-bit VPCLMULQDQ where the CPU has it (about 20 GB/s
//! on the development machine's AMD EPYC), `crc-fast` elsewhere (PCLMULQDQ,
//! PMULL: about 10 GB/s), against 0.5 for a byte-wise table, which would
//! cost a 4 KiB block about 8 µs.

/// The guard of a format's protection information (Identify CNS 05h
/// ELBAF.PIF).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Guard {
    /// 16-bit guard, CRC-16 T10-DIF, in an 8-byte tuple.
    #[default]
    Crc16,
    /// 64-bit guard, CRC-64 NVMe, in a 16-byte tuple with a 48-bit
    /// reference tag.
    Crc64,
}

impl Guard {
    /// Bytes of the PI tuple.
    pub const fn pi_size(self) -> u16 {
        match self {
            Guard::Crc16 => 8,
            Guard::Crc64 => 16,
        }
    }

    /// Reference tags wrap at this mask (32 or 48 bits).
    pub const fn ref_mask(self) -> u64 {
        match self {
            Guard::Crc16 => 0xFFFF_FFFF,
            Guard::Crc64 => 0xFFFF_FFFF_FFFF,
        }
    }

    /// The guard of `bytes`: the block's data, and with PI in the last
    /// bytes of the metadata the metadata before it.
    pub fn checksum(self, bytes: &[u8]) -> u64 {
        match self {
            Guard::Crc16 => vnvme_crc::crc16_t10dif(bytes).into(),
            Guard::Crc64 => vnvme_crc::crc64_nvme(bytes),
        }
    }

    /// The guard of `parts` one after the other: a block's data and the
    /// metadata before a last-placed tuple, where they lie apart (a
    /// separate metadata buffer) and a copy to join them would cost more
    /// than the CRC.
    pub fn checksum_parts(self, parts: &[&[u8]]) -> u64 {
        let mut crc = GuardCrc::new(self);
        parts.iter().for_each(|part| crc.update(part));
        crc.finalize()
    }
}

/// A guard over bytes that come in parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardCrc {
    Crc16(vnvme_crc::Crc16T10Dif),
    Crc64(vnvme_crc::Crc64Nvme),
}

impl GuardCrc {
    /// The guard of no bytes yet.
    pub const fn new(guard: Guard) -> Self {
        match guard {
            Guard::Crc16 => GuardCrc::Crc16(vnvme_crc::Crc16T10Dif::new()),
            Guard::Crc64 => GuardCrc::Crc64(vnvme_crc::Crc64Nvme::new()),
        }
    }

    /// Takes `bytes` as the next part.
    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            GuardCrc::Crc16(crc) => crc.update(bytes),
            GuardCrc::Crc64(crc) => crc.update(bytes),
        }
    }

    /// Copies `bytes` to `dst` (as long) and takes them as the next part,
    /// reading them once (see `vnvme_crc`'s `update_copy`).
    pub fn update_copy(&mut self, bytes: &[u8], dst: &mut [u8]) {
        match self {
            GuardCrc::Crc16(crc) => crc.update_copy(bytes, dst),
            GuardCrc::Crc64(crc) => crc.update_copy(bytes, dst),
        }
    }

    /// The guard of the parts so far.
    pub fn finalize(&self) -> u64 {
        match self {
            GuardCrc::Crc16(crc) => crc.finalize().into(),
            GuardCrc::Crc64(crc) => crc.finalize(),
        }
    }
}

/// One PI tuple's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuple {
    pub guard: u64,
    pub app: u16,
    pub reference: u64,
}

impl Tuple {
    /// Reads the tuple at the start of `at` (at least the tuple's size).
    pub fn load(guard: Guard, at: &[u8]) -> Self {
        let be = |range: std::ops::Range<usize>| {
            at[range].iter().fold(0u64, |v, &b| (v << 8) | u64::from(b))
        };
        match guard {
            Guard::Crc16 => Tuple {
                guard: be(0..2),
                app: be(2..4) as u16,
                reference: be(4..8),
            },
            Guard::Crc64 => Tuple {
                guard: be(0..8),
                app: be(8..10) as u16,
                reference: be(10..16),
            },
        }
    }

    /// Writes the tuple at the start of `at`.
    pub fn store(&self, guard: Guard, at: &mut [u8]) {
        match guard {
            Guard::Crc16 => {
                at[0..2].copy_from_slice(&(self.guard as u16).to_be_bytes());
                at[2..4].copy_from_slice(&self.app.to_be_bytes());
                at[4..8].copy_from_slice(&(self.reference as u32).to_be_bytes());
            }
            Guard::Crc64 => {
                at[0..8].copy_from_slice(&self.guard.to_be_bytes());
                at[8..10].copy_from_slice(&self.app.to_be_bytes());
                at[10..16].copy_from_slice(&self.reference.to_be_bytes()[2..]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crcs_match_their_check_values() {
        assert_eq!(Guard::Crc16.checksum(b"123456789"), 0xD0DB);
        assert_eq!(Guard::Crc64.checksum(b"123456789"), 0xAE8B_1486_0A79_9888);
        for g in [Guard::Crc16, Guard::Crc64] {
            assert_eq!(
                g.checksum_parts(&[b"1234", b"", b"56789"]),
                g.checksum(b"123456789")
            );
        }
    }

    #[test]
    fn parts_of_a_block_give_the_guard_of_the_joined_block() {
        let block: Vec<u8> = (0..4096u32 + 64).map(|i| (i * 7 + 3) as u8).collect();
        let (data, metadata) = block.split_at(4096);
        for g in [Guard::Crc16, Guard::Crc64] {
            let pi_last = 4096 + 64 - usize::from(g.pi_size());
            assert_eq!(
                g.checksum_parts(&[data, &metadata[..pi_last - 4096]]),
                g.checksum(&block[..pi_last])
            );
        }
    }

    #[test]
    fn tuples_round_trip_big_endian() {
        let t = Tuple {
            guard: 0x0102_0304_0506_0708,
            app: 0x090A,
            reference: 0x0B0C_0D0E_0F10,
        };
        let mut b = [0u8; 16];
        t.store(Guard::Crc64, &mut b);
        assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]);
        assert_eq!(Tuple::load(Guard::Crc64, &b), t);
        t.store(Guard::Crc16, &mut b);
        assert_eq!(&b[..8], &[7, 8, 9, 10, 0x0D, 0x0E, 0x0F, 0x10]);
    }
}
