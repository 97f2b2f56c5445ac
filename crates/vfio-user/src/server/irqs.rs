//! SET_IRQS: the client's interrupt eventfds (MSI-X, INTx, error and
//! request indexes) given to the device, checked first.

use std::os::fd::{AsRawFd, OwnedFd};

use super::{ClientState, Handled, Server};
use crate::wire::*;
use crate::Device;

impl<D: Device> Server<D> {
    pub(super) fn set_irqs(
        &mut self,
        s: &mut ClientState,
        payload: &[u8],
        fds: Vec<OwnedFd>,
    ) -> Handled {
        let set = read_prefix::<IrqSet>(payload).ok_or(libc::EINVAL)?;
        if (set.argsz as usize) < size_of::<IrqSet>() {
            return Err(libc::EINVAL);
        }
        let data_flags = set.flags & VFIO_IRQ_SET_DATA_MASK;
        let action = set.flags & VFIO_IRQ_SET_ACTION_MASK_ALL;
        if set.flags & !(VFIO_IRQ_SET_DATA_MASK | VFIO_IRQ_SET_ACTION_MASK_ALL) != 0
            || data_flags.count_ones() != 1
            || action.count_ones() != 1
        {
            return Err(libc::EINVAL);
        }
        let info = self.device.irq_info(set.index).ok_or(libc::EINVAL)?;
        let end = set.start.checked_add(set.count).ok_or(libc::EINVAL)?;
        let disable_all = data_flags == VFIO_IRQ_SET_DATA_NONE && set.count == 0;
        if disable_all {
            if set.start != 0 {
                return Err(libc::EINVAL);
            }
        } else if set.count == 0 || end > info.count {
            return Err(libc::EINVAL);
        }
        match data_flags {
            VFIO_IRQ_SET_DATA_EVENTFD => {
                if !fds.is_empty() && fds.len() != set.count as usize {
                    return Err(libc::EINVAL);
                }
                for fd in &fds {
                    if let Err(what) = prepare_eventfd(fd) {
                        if let Some(suppressed) = s.warnings.allow() {
                            tracing::warn!(
                                index = set.index,
                                suppressed,
                                "SET_IRQS: {what}: refused (EINVAL); interrupts need eventfds"
                            );
                        }
                        return Err(libc::EINVAL);
                    }
                }
                self.device
                    .set_irqs(set.index, set.flags, set.start, set.count, fds)?;
            }
            VFIO_IRQ_SET_DATA_NONE => {
                if !fds.is_empty() {
                    return Err(libc::EINVAL);
                }
                self.device
                    .set_irqs(set.index, set.flags, set.start, set.count, Vec::new())?;
            }
            _ => {
                // DATA_BOOL: one byte per vector follows the structure.
                if !fds.is_empty() {
                    return Err(libc::EINVAL);
                }
                let data = payload
                    .get(size_of::<IrqSet>()..size_of::<IrqSet>() + set.count as usize)
                    .ok_or(libc::EINVAL)?;
                let flags = (set.flags & !VFIO_IRQ_SET_DATA_BOOL) | VFIO_IRQ_SET_DATA_NONE;
                for (i, b) in data.iter().enumerate() {
                    if *b != 0 {
                        self.device.set_irqs(
                            set.index,
                            flags,
                            set.start + i as u32,
                            1,
                            Vec::new(),
                        )?;
                    }
                }
            }
        }
        Ok(Vec::new())
    }
}

/// Makes an interrupt fd safe to signal from any thread: it must be an
/// eventfd (a pipe or socket whose buffer fills would block the writer), and
/// it is made non-blocking, so an eventfd at its maximum count answers
/// EAGAIN (it is signalled already) instead of blocking. O_NONBLOCK is a
/// property of the open file, so the client's copy gets it too; eventfd
/// readers (QEMU's event notifiers) poll before they read.
fn prepare_eventfd(fd: &OwnedFd) -> Result<(), String> {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| format!("cannot tell what fd {} is ({e})", fd.as_raw_fd()))?;
    if link.as_os_str() != "anon_inode:[eventfd]" {
        return Err(format!("fd is {}, not an eventfd", link.display()));
    }
    let flags = rustix::fs::fcntl_getfl(fd).map_err(|e| format!("F_GETFL: {e}"))?;
    rustix::fs::fcntl_setfl(fd, flags | rustix::fs::OFlags::NONBLOCK)
        .map_err(|e| format!("F_SETFL: {e}"))
}
