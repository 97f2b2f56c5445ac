//! The memfds `ram` namespaces keep their data in: the process that serves
//! the namespace next (a live upgrade's new process, the server a
//! supervisor starts after a crash) is handed them, one per namespace by
//! NSID, and maps them instead of starting the namespace empty.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

use anyhow::{Context, Result};
use vnvme_blockdev::{BlockDevice, RamDevice};
use vnvme_controller::NamespaceConfig;

/// The memfds of the namespaces among `backends` (by NSID) that keep their
/// data in one.
pub fn memfds(backends: &[(u32, Arc<dyn BlockDevice>)]) -> Vec<(u32, BorrowedFd<'_>)> {
    backends
        .iter()
        .filter_map(|(nsid, b)| b.memory_fd().map(|fd| (*nsid, fd)))
        .collect()
}

/// Puts the memfds `handed` (by NSID) under the `ram` namespaces
/// configured: each must be one of them, a memfd sealed against shrinking
/// and at least as large as the namespace, or the start is refused (a
/// namespace started empty would lose every write completed before).
pub fn adopt(namespaces: &mut [NamespaceConfig], handed: Vec<(u32, OwnedFd)>) -> Result<()> {
    for (nsid, fd) in handed {
        let ns = namespaces
            .iter_mut()
            .find(|n| n.nsid == nsid && n.backend.memory_fd().is_some())
            .with_context(|| {
                format!(
                    "the handover has the memory of namespace {nsid}, which this server does not \
                     serve from ram: not this server's handover"
                )
            })?;
        let dev = RamDevice::adopt(fd, ns.backend.size())
            .with_context(|| format!("namespace {nsid}'s handed-over memory"))?;
        ns.backend = Arc::new(dev.with_volatile_cache(ns.backend.volatile_cache()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vnvme_blockdev::NullDevice;

    fn ram(size: u64) -> Arc<dyn BlockDevice> {
        Arc::new(RamDevice::new(size))
    }

    fn copy(b: &Arc<dyn BlockDevice>) -> OwnedFd {
        rustix::io::dup(b.memory_fd().unwrap()).unwrap()
    }

    #[test]
    fn a_handed_memfd_replaces_the_new_namespace_and_keeps_its_data() {
        let old = ram(1 << 20);
        old.write(4096, &[9; 512]).unwrap();
        let mut namespaces = vec![
            NamespaceConfig::new(1, 512, Arc::new(NullDevice::new(1 << 20))),
            NamespaceConfig::new(2, 512, ram(1 << 20)),
        ];
        let null: Arc<dyn BlockDevice> = Arc::new(NullDevice::new(1 << 20));
        let backends = [(1, null), (2, old.clone())];
        let handed = memfds(&backends);
        assert_eq!(handed.len(), 1, "the null namespace has no memory");
        assert_eq!(handed[0].0, 2);
        adopt(&mut namespaces, vec![(2, copy(&old))]).unwrap();
        let mut b = [0u8; 512];
        namespaces[1].backend.read(4096, &mut b).unwrap();
        assert_eq!(b, [9; 512]);
    }

    #[test]
    fn a_handed_memfd_too_small_or_for_another_namespace_is_refused() {
        let small = ram(1 << 19);
        let mut namespaces = vec![
            NamespaceConfig::new(1, 512, Arc::new(NullDevice::new(1 << 20))),
            NamespaceConfig::new(2, 512, ram(1 << 20)),
        ];
        let err = adopt(&mut namespaces, vec![(2, copy(&small))]).unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.contains("namespace 2's handed-over memory")
                && msg.contains("is 524288 bytes, the namespace 1048576"),
            "{msg}"
        );
        for nsid in [1, 3] {
            let err = adopt(&mut namespaces, vec![(nsid, copy(&small))]).unwrap_err();
            assert!(
                err.to_string().contains(&format!(
                    "the memory of namespace {nsid}, which this server"
                )),
                "{err}"
            );
        }
        // Not a memfd: the fd of a pipe.
        let (pipe, _w) = rustix::pipe::pipe().unwrap();
        let err = adopt(&mut namespaces, vec![(2, pipe)]).unwrap_err();
        assert!(format!("{err:#}").contains("is not a memfd"), "{err:#}");
    }
}
