//! Protection information the driver makes and checks itself (NVM Command
//! Set 1.0 §5.3): a write carries tuples generated here in a separate
//! metadata buffer (MPTR) and the controller checks them (PRACT 0, PRCHK);
//! a read brings them back, checked by the controller and again here, end
//! to end. The metadata buffer holds each block's whole metadata (MS
//! bytes): the tuple sits at its first or last bytes (DPS.PIP), and a last
//! one's guard covers the metadata bytes before it as well as the data
//! (§5.3.1.1), which the caller may fill with metadata of its own.

use vnvme_spec::pi::{Guard, Tuple};

/// A block whose PI does not match its data or the expected tags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PiError {
    #[error("block {index}: guard {found:#x}, its data gives {expected:#x}")]
    Guard {
        index: u64,
        found: u64,
        expected: u64,
    },
    #[error("block {index}: application tag {found:#06x}, expected {expected:#06x}")]
    ApplicationTag {
        index: u64,
        found: u16,
        expected: u16,
    },
    #[error("block {index}: reference tag {found:#x}, expected {expected:#x}")]
    ReferenceTag {
        index: u64,
        found: u64,
        expected: u64,
    },
    #[error(
        "{blocks} blocks need {need} bytes of data and PI, the buffers hold {data} and {meta}"
    )]
    Buffers {
        blocks: u64,
        need: usize,
        data: usize,
        meta: usize,
    },
}

/// A namespace's protection information: DPS.PIT and PIP, the guard of
/// its format (Identify CNS 05h ELBAF.PIF) and the metadata the tuple
/// lies in (LBAF.MS, FLBAS bit 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NsProtection {
    /// PI type, 1 to 3.
    pub pit: u8,
    /// 64-bit guard (16-byte tuple, 48-bit reference tag), else 16-bit.
    pub guard_64: bool,
    /// The tuple is the first bytes of the metadata (DPS.PIP), else the
    /// last, and the guard covers the metadata before it too.
    pub first: bool,
    /// Metadata bytes per block (MS): the tuple or more.
    pub ms: u16,
    /// Extended LBAs (FLBAS bit 4): the metadata follows each block's data
    /// in the data buffer. The driver takes these only where the metadata
    /// is the tuple alone, which PRACT strips: the block API moves data
    /// alone then (more metadata would have to be interleaved into every
    /// caller's buffer); protected I/O bounces data and PI through a
    /// buffer of the queue's.
    pub extended: bool,
}

impl NsProtection {
    /// Bytes of the PI tuple.
    pub fn tuple_size(self) -> u16 {
        if self.guard_64 {
            16
        } else {
            8
        }
    }

    /// Where the tuple starts in a block's metadata.
    pub fn tuple_offset(self) -> usize {
        if self.first {
            0
        } else {
            usize::from(self.ms.saturating_sub(self.tuple_size()))
        }
    }

    /// Whether PRACT leaves no metadata to move (§5.3.2.1, §5.3.2.2).
    pub fn stripped(self) -> bool {
        self.ms == self.tuple_size()
    }

    pub fn guard(self) -> Guard {
        if self.guard_64 {
            Guard::Crc64
        } else {
            Guard::Crc16
        }
    }

    /// The reference tag of block `index` of a command whose initial one is
    /// `ilbrt`: counting up for Types 1 and 2, the same for Type 3.
    fn reference(self, ilbrt: u64, index: u64) -> u64 {
        let r = if self.pit == 3 {
            ilbrt
        } else {
            ilbrt.wrapping_add(index)
        };
        r & self.guard().ref_mask()
    }

    /// Checks that `data` and `meta` hold `blocks` blocks of `lba_size`.
    fn blocks(self, data: &[u8], meta: &[u8], lba_size: usize) -> Result<u64, PiError> {
        let ms = usize::from(self.ms);
        let blocks = data.len() / lba_size.max(1);
        if blocks == 0
            || !data.len().is_multiple_of(lba_size.max(1))
            || meta.len() < blocks * ms
            || ms < usize::from(self.tuple_size())
        {
            return Err(PiError::Buffers {
                blocks: blocks as u64,
                need: blocks * (lba_size + ms),
                data: data.len(),
                meta: meta.len(),
            });
        }
        Ok(blocks as u64)
    }

    /// The guard of one block: its data, and with the tuple last the
    /// metadata before it.
    fn guard_of(self, block: &[u8], meta: &[u8]) -> u64 {
        let before = meta.get(..self.tuple_offset()).unwrap_or_default();
        self.guard().checksum_parts(&[block, before])
    }

    /// Writes into `meta` the PI of each `lba_size` block of `data`, with
    /// application tag `app` and reference tags from `ilbrt`; the other
    /// metadata bytes are left as they are (and guarded, before a last
    /// tuple).
    pub fn generate(
        self,
        data: &[u8],
        lba_size: usize,
        meta: &mut [u8],
        ilbrt: u64,
        app: u16,
    ) -> Result<(), PiError> {
        self.blocks(data, meta, lba_size)?;
        let (ms, at) = (usize::from(self.ms), self.tuple_offset());
        for (i, (block, m)) in
            (0u64..).zip(data.chunks_exact(lba_size).zip(meta.chunks_exact_mut(ms)))
        {
            Tuple {
                guard: self.guard_of(block, m),
                app,
                reference: self.reference(ilbrt, i),
            }
            .store(self.guard(), &mut m[at..]);
        }
        Ok(())
    }

    /// Checks each block's PI in `meta` against its data and the tags, but
    /// for blocks whose tags are the escape values (application tag FFFFh;
    /// for Type 3 with a reference tag of all ones too).
    pub fn verify(
        self,
        data: &[u8],
        lba_size: usize,
        meta: &[u8],
        ilbrt: u64,
        app: u16,
    ) -> Result<(), PiError> {
        self.blocks(data, meta, lba_size)?;
        let (guard, ms, at) = (self.guard(), usize::from(self.ms), self.tuple_offset());
        for (index, (block, m)) in
            (0u64..).zip(data.chunks_exact(lba_size).zip(meta.chunks_exact(ms)))
        {
            let t = Tuple::load(guard, &m[at..]);
            if t.app == 0xFFFF && (self.pit != 3 || t.reference == guard.ref_mask()) {
                continue;
            }
            let expected = self.guard_of(block, m);
            if t.guard != expected {
                return Err(PiError::Guard {
                    index,
                    found: t.guard,
                    expected,
                });
            }
            if t.app != app {
                return Err(PiError::ApplicationTag {
                    index,
                    found: t.app,
                    expected: app,
                });
            }
            let expected = self.reference(ilbrt, index);
            if self.pit != 3 && t.reference != expected {
                return Err(PiError::ReferenceTag {
                    index,
                    found: t.reference,
                    expected,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TYPE1: NsProtection = NsProtection {
        pit: 1,
        guard_64: false,
        first: false,
        ms: 8,
        extended: false,
    };

    #[test]
    fn generated_pi_verifies_and_a_changed_byte_does_not() {
        for pi in [
            TYPE1,
            NsProtection {
                pit: 3,
                guard_64: true,
                first: false,
                ms: 16,
                extended: false,
            },
        ] {
            let data: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
            let mut meta = vec![0; 32];
            pi.generate(&data, 4096, &mut meta, 10, 0x77).unwrap();
            assert_eq!(pi.verify(&data, 4096, &meta, 10, 0x77), Ok(()));
            let mut bad = data.clone();
            bad[5000] ^= 1;
            assert!(matches!(
                pi.verify(&bad, 4096, &meta, 10, 0x77),
                Err(PiError::Guard { index: 1, .. })
            ));
            assert!(matches!(
                pi.verify(&data, 4096, &meta, 10, 0x78),
                Err(PiError::ApplicationTag { index: 0, .. })
            ));
        }
        let data = vec![1u8; 4096];
        let mut meta = vec![0; 8];
        TYPE1.generate(&data, 4096, &mut meta, 10, 0).unwrap();
        assert_eq!(
            TYPE1.verify(&data, 4096, &meta, 11, 0),
            Err(PiError::ReferenceTag {
                index: 0,
                found: 10,
                expected: 11
            })
        );
        // Escape: application tag FFFFh.
        let escaped = [0, 0, 0xFF, 0xFF, 0, 0, 0, 0];
        assert_eq!(TYPE1.verify(&data, 4096, &escaped, 11, 0), Ok(()));
        assert!(matches!(
            TYPE1.verify(&data, 4096, &[0; 4], 0, 0),
            Err(PiError::Buffers { .. })
        ));
    }

    #[test]
    fn a_last_tuple_guards_the_metadata_before_it_and_a_first_one_does_not() {
        let data = vec![3u8; 1024];
        for first in [false, true] {
            let pi = NsProtection {
                pit: 2,
                guard_64: true,
                first,
                ms: 64,
                extended: false,
            };
            let mut meta = vec![0x11u8; 128];
            pi.generate(&data, 512, &mut meta, 7, 1).unwrap();
            let at = pi.tuple_offset();
            let t = Tuple::load(Guard::Crc64, &meta[64 + at..]);
            assert_eq!(t.reference, 8, "second block, first: {first}");
            let mut guarded = data[512..].to_vec();
            if !first {
                guarded.extend_from_slice(&meta[64..64 + at]);
            }
            assert_eq!(t.guard, Guard::Crc64.checksum(&guarded));
            // A metadata byte outside the tuple: guarded only before a
            // last tuple.
            let outside = if first { 64 + 20 } else { 64 };
            meta[outside] ^= 1;
            let r = pi.verify(&data, 512, &meta, 7, 1);
            if first {
                assert_eq!(r, Ok(()));
            } else {
                assert!(matches!(r, Err(PiError::Guard { index: 1, .. })));
            }
        }
    }
}
