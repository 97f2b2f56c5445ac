//! Namespaces: an NSID, an LBA format and a backend (NVM Command Set §4.1.5).

use std::sync::Arc;

use vnvme_blockdev::BlockDevice;
use vnvme_spec::identify::{IdentifyNamespace, LbaFormat};
use vnvme_spec::Status;
use zerocopy::little_endian::{U16, U64};

use crate::config::{ConfigError, NamespaceConfig};

#[derive(Debug)]
pub(crate) struct Namespace {
    pub nsid: u32,
    /// log2 of the LBA size (9 or 12).
    pub lba_shift: u8,
    /// Namespace size in logical blocks.
    pub nsze: u64,
    pub backend: Arc<dyn BlockDevice>,
}

impl Namespace {
    pub fn new(c: &NamespaceConfig) -> Result<Self, ConfigError> {
        if c.nsid == 0 || c.nsid >= 0xFFFF_FFFE {
            return Err(ConfigError::Nsid(c.nsid));
        }
        let lba_shift = match c.lba_size {
            512 => 9,
            4096 => 12,
            lba_size => {
                return Err(ConfigError::LbaSize {
                    nsid: c.nsid,
                    lba_size,
                })
            }
        };
        let nsze = c.backend.size() >> lba_shift;
        if nsze == 0 {
            return Err(ConfigError::TooSmall(c.nsid));
        }
        Ok(Self {
            nsid: c.nsid,
            lba_shift,
            nsze,
            backend: c.backend.clone(),
        })
    }

    /// Byte offset and length of `nlb` blocks at `slba`, or LBA Out of Range.
    pub fn byte_range(&self, slba: u64, nlb: u64) -> Result<(u64, u64), Status> {
        match slba.checked_add(nlb) {
            Some(end) if end <= self.nsze => Ok((slba << self.lba_shift, nlb << self.lba_shift)),
            _ => Err(Status::LBA_OUT_OF_RANGE.with_dnr(true)),
        }
    }

    /// Identify Namespace (CNS 00h): one LBA format, no metadata, deallocated
    /// blocks read as zeroes.
    pub fn identify(&self) -> Box<IdentifyNamespace> {
        let mut id = IdentifyNamespace::new_boxed();
        id.nsze = U64::new(self.nsze);
        id.ncap = U64::new(self.nsze);
        id.nuse = U64::new(self.nsze);
        // NSFEAT bit 0: thin provisioning is not reported; bit 2 DAE: the
        // deallocated-or-unwritten error is not supported.
        id.nlbaf_z = 0;
        id.set_format_index(0, false);
        id.dlfeat = 0x01;
        id.lbaf[0] = LbaFormat {
            ms: U16::new(0),
            lbads: self.lba_shift,
            rp: 0,
        };
        id.nguid = self.nguid();
        id.eui64.copy_from_slice(&self.nguid()[8..]);
        id
    }

    /// A stable NGUID derived from the NSID (unique within this controller).
    pub fn nguid(&self) -> [u8; 16] {
        let mut g = *b"vnvme-ns\0\0\0\0\0\0\0\0";
        g[12..].copy_from_slice(&self.nsid.to_be_bytes());
        g
    }
}
