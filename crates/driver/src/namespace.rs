//! Active namespaces as the driver sees them after initialisation.

use std::sync::Arc;

use vnvme_spec::identify::IdentifyNamespace;

/// A namespace the driver can do I/O to.
#[derive(Debug, Clone)]
pub struct Namespace {
    pub nsid: u32,
    /// NSZE: size in logical blocks.
    pub blocks: u64,
    /// NCAP: capacity in logical blocks.
    pub capacity: u64,
    /// Bytes per logical block of the format in use.
    pub lba_size: u32,
    /// The Identify Namespace data it was built from.
    pub identify: Arc<IdentifyNamespace>,
}

/// Why a namespace from the active list is not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// NSZE is zero: the controller reported the namespace as inactive.
    Inactive,
    /// The format carries metadata, which this driver does not transfer.
    Metadata,
    /// LBADS outside 512 B ..= 64 KiB.
    LbaSize(u8),
}

impl Namespace {
    /// Validates an Identify Namespace structure. The device is not trusted:
    /// the format index and sizes are checked, not assumed.
    pub fn from_identify(nsid: u32, id: IdentifyNamespace) -> Result<Self, Skip> {
        if id.nsze.get() == 0 {
            return Err(Skip::Inactive);
        }
        let format = id.current_format();
        if !(9..=16).contains(&format.lbads) {
            return Err(Skip::LbaSize(format.lbads));
        }
        if format.ms.get() != 0 {
            return Err(Skip::Metadata);
        }
        Ok(Self {
            nsid,
            blocks: id.nsze.get(),
            capacity: id.ncap.get(),
            lba_size: 1 << format.lbads,
            identify: Arc::new(id),
        })
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.blocks.saturating_mul(u64::from(self.lba_size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_with_metadata_or_odd_lba_size_is_skipped() {
        let mut id = IdentifyNamespace::new_boxed();
        assert_eq!(
            Namespace::from_identify(1, (*id).clone()).unwrap_err(),
            Skip::Inactive
        );
        id.nsze = 100.into();
        id.lbaf[0].lbads = 12;
        let ns = Namespace::from_identify(1, (*id).clone()).unwrap();
        assert_eq!(
            (ns.blocks, ns.lba_size, ns.size_bytes()),
            (100, 4096, 409_600)
        );
        id.lbaf[0].ms = 8.into();
        assert_eq!(
            Namespace::from_identify(1, (*id).clone()).unwrap_err(),
            Skip::Metadata
        );
        id.lbaf[0].ms = 0.into();
        id.lbaf[0].lbads = 40;
        assert_eq!(
            Namespace::from_identify(1, (*id).clone()).unwrap_err(),
            Skip::LbaSize(40)
        );
    }
}
