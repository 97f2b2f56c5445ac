//! Namespace descriptions from the command line: `SIZE[:null|ram]`.

use std::str::FromStr;
use std::sync::Arc;

use vnvme_blockdev::BlockDevice;

use crate::size::parse_size;

/// The storage behind a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Reads return zeroes, writes are dropped.
    Null,
    /// Kept in memory for the life of the server.
    Ram,
}

/// A namespace as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceSpec {
    pub size: u64,
    pub backend: Backend,
}

impl FromStr for NamespaceSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (size, backend) = match s.split_once(':') {
            Some((size, backend)) => (size, backend),
            None => (s, "ram"),
        };
        let size = parse_size(size)?;
        if size < 4096 || size % 4096 != 0 {
            return Err(format!(
                "namespace size {size} must be a non-zero multiple of 4096 bytes"
            ));
        }
        let backend = match backend {
            "null" => Backend::Null,
            "ram" => Backend::Ram,
            other => return Err(format!("unknown backend '{other}': use null or ram")),
        };
        Ok(Self { size, backend })
    }
}

impl NamespaceSpec {
    pub fn open(&self) -> Arc<dyn BlockDevice> {
        match self.backend {
            Backend::Null => Arc::new(vnvme_blockdev::NullDevice::new(self.size)),
            Backend::Ram => Arc::new(vnvme_blockdev::RamDevice::new(self.size)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_specs_parse() {
        assert_eq!(
            "1G:null".parse(),
            Ok(NamespaceSpec {
                size: 1 << 30,
                backend: Backend::Null
            })
        );
        assert_eq!(
            "64M".parse(),
            Ok(NamespaceSpec {
                size: 64 << 20,
                backend: Backend::Ram
            })
        );
    }

    #[test]
    fn bad_namespace_specs_are_explained() {
        assert!("1G:disk"
            .parse::<NamespaceSpec>()
            .unwrap_err()
            .contains("unknown backend"));
        assert!("1000"
            .parse::<NamespaceSpec>()
            .unwrap_err()
            .contains("multiple of 4096"));
    }
}
