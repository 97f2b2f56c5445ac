//! Protection information the driver makes and checks itself (NVM Command
//! Set 1.0 §5.3), on namespaces whose metadata is the PI tuple: a write
//! carries tuples generated here in a separate metadata buffer (MPTR) and
//! the controller checks them (PRACT 0, PRCHK); a read brings them back,
//! checked by the controller and again here, end to end.

use vnvme_spec::pi::{Guard, Tuple};

use crate::namespace::NsProtection;

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

impl NsProtection {
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
        let tuple = usize::from(self.tuple_size());
        let blocks = data.len() / lba_size.max(1);
        if blocks == 0 || !data.len().is_multiple_of(lba_size.max(1)) || meta.len() < blocks * tuple
        {
            return Err(PiError::Buffers {
                blocks: blocks as u64,
                need: blocks * (lba_size + tuple),
                data: data.len(),
                meta: meta.len(),
            });
        }
        Ok(blocks as u64)
    }

    /// Writes into `meta` the PI of each `lba_size` block of `data`, with
    /// application tag `app` and reference tags from `ilbrt`.
    pub fn generate(
        self,
        data: &[u8],
        lba_size: usize,
        meta: &mut [u8],
        ilbrt: u64,
        app: u16,
    ) -> Result<(), PiError> {
        self.blocks(data, meta, lba_size)?;
        let size = usize::from(self.tuple_size());
        for (i, (block, at)) in
            (0u64..).zip(data.chunks_exact(lba_size).zip(meta.chunks_exact_mut(size)))
        {
            Tuple {
                guard: self.guard().checksum(block),
                app,
                reference: self.reference(ilbrt, i),
            }
            .store(self.guard(), at);
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
        let (guard, size) = (self.guard(), usize::from(self.tuple_size()));
        for (index, (block, at)) in
            (0u64..).zip(data.chunks_exact(lba_size).zip(meta.chunks_exact(size)))
        {
            let t = Tuple::load(guard, at);
            if t.app == 0xFFFF && (self.pit != 3 || t.reference == guard.ref_mask()) {
                continue;
            }
            let expected = guard.checksum(block);
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
    };

    #[test]
    fn generated_pi_verifies_and_a_changed_byte_does_not() {
        for pi in [
            TYPE1,
            NsProtection {
                pit: 3,
                guard_64: true,
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
}
