//! What the client asks of the device's layout: DEVICE_GET_INFO,
//! DEVICE_GET_REGION_INFO, DEVICE_GET_IRQ_INFO, and region reads and
//! writes, each checked against the region first.

use zerocopy::IntoBytes;

use super::{ClientState, Handled, Server};
use crate::conn::MAX_DATA_XFER_SIZE;
use crate::wire::*;
use crate::{Device, Errno};

impl<D: Device> Server<D> {
    pub(super) fn device_info(&mut self, payload: &[u8]) -> Handled {
        let argsz = read_prefix::<u32>(payload).ok_or(libc::EINVAL)?;
        if (argsz as usize) < size_of::<DeviceInfoWire>() {
            return Err(libc::EINVAL);
        }
        let info = self.device.device_info();
        let w = DeviceInfoWire {
            argsz: size_of::<DeviceInfoWire>() as u32,
            flags: info.flags,
            num_regions: info.num_regions,
            num_irqs: info.num_irqs,
        };
        Ok(w.as_bytes().to_vec())
    }

    pub(super) fn region_info(
        &self,
        payload: &[u8],
    ) -> Result<(Vec<u8>, Option<std::os::fd::BorrowedFd<'_>>), Errno> {
        // Only argsz and index are required; the rest may be left out.
        let mut req = [0u8; size_of::<RegionInfoWire>()];
        let n = payload.len().min(req.len());
        if n < 12 {
            return Err(libc::EINVAL);
        }
        req[..n].copy_from_slice(&payload[..n]);
        let req = read_prefix::<RegionInfoWire>(&req).ok_or(libc::EINVAL)?;
        if (req.argsz as usize) < size_of::<RegionInfoWire>() {
            return Err(libc::EINVAL);
        }
        let (info, fd) = self.device.region_info(req.index).ok_or(libc::EINVAL)?;
        let mut flags = info.flags & (VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE);
        let base = size_of::<RegionInfoWire>();
        let mut caps = Vec::new();
        if fd.is_some() {
            flags |= VFIO_REGION_INFO_FLAG_MMAP;
            if !info.sparse_areas.is_empty() {
                flags |= VFIO_REGION_INFO_FLAG_CAPS;
                let cap = CapHeader {
                    id: VFIO_REGION_INFO_CAP_SPARSE_MMAP,
                    version: 1,
                    next: 0,
                };
                caps.extend_from_slice(cap.as_bytes());
                // Areas or a reply larger than the wire's u32 fields: the
                // errno is the whole answer.
                let nr_areas = u32::try_from(info.sparse_areas.len()).map_err(|_| libc::EINVAL)?;
                caps.extend_from_slice(
                    SparseMmapWire {
                        nr_areas,
                        reserved: 0,
                    }
                    .as_bytes(),
                );
                for a in &info.sparse_areas {
                    caps.extend_from_slice(
                        SparseAreaWire {
                            offset: a.offset,
                            size: a.size,
                        }
                        .as_bytes(),
                    );
                }
            }
        }
        // A reply past the wire's u32 argsz: the errno is the whole answer.
        let full = u32::try_from(base + caps.len()).map_err(|_| libc::EINVAL)?;
        let fits = req.argsz >= full;
        if !fits {
            // With too small an argsz, say how much is needed and leave the
            // capabilities out, CAPS flag included: QEMU's client refuses a
            // reply flagged CAPS whose cap_offset lies outside it (EINVAL,
            // "failed to get region 0 info") before it would ask again with
            // the argsz given.
            flags &= !VFIO_REGION_INFO_FLAG_CAPS;
        }
        let w = RegionInfoWire {
            argsz: full,
            flags,
            index: req.index,
            cap_offset: if fits && !caps.is_empty() {
                base as u32
            } else {
                0
            },
            size: info.size,
            offset: 0,
        };
        let mut out = w.as_bytes().to_vec();
        if fits {
            out.extend_from_slice(&caps);
        }
        Ok((out, fd))
    }

    pub(super) fn irq_info(&mut self, payload: &[u8]) -> Handled {
        let mut req = [0u8; size_of::<IrqInfoWire>()];
        let n = payload.len().min(req.len());
        if n < 12 {
            return Err(libc::EINVAL);
        }
        req[..n].copy_from_slice(&payload[..n]);
        let req = read_prefix::<IrqInfoWire>(&req).ok_or(libc::EINVAL)?;
        if (req.argsz as usize) < size_of::<IrqInfoWire>() {
            return Err(libc::EINVAL);
        }
        let info = self.device.irq_info(req.index).ok_or(libc::EINVAL)?;
        let w = IrqInfoWire {
            argsz: size_of::<IrqInfoWire>() as u32,
            flags: info.flags,
            index: req.index,
            count: info.count,
        };
        Ok(w.as_bytes().to_vec())
    }

    /// Checks an access against the region's size and permission.
    fn check_region(
        &self,
        s: &ClientState,
        index: u32,
        offset: u64,
        count: u32,
        need: u32,
    ) -> Result<(), Errno> {
        if count as usize > MAX_DATA_XFER_SIZE {
            return Err(libc::E2BIG);
        }
        let (flags, size) = match s.regions.get(index as usize) {
            Some(cached) => cached.ok_or(libc::EINVAL)?,
            None => self
                .device
                .region_info(index)
                .map(|(i, _)| (i.flags, i.size))
                .ok_or(libc::EINVAL)?,
        };
        if flags & need == 0 {
            return Err(libc::EINVAL);
        }
        let end = offset.checked_add(u64::from(count)).ok_or(libc::EINVAL)?;
        if end > size {
            return Err(libc::EINVAL);
        }
        Ok(())
    }

    pub(super) fn region_read(&mut self, s: &ClientState, payload: &[u8]) -> Handled {
        let a = read_prefix::<RegionAccess>(payload).ok_or(libc::EINVAL)?;
        self.check_region(s, a.region, a.offset, a.count, VFIO_REGION_INFO_FLAG_READ)?;
        let mut out = a.as_bytes().to_vec();
        let head = out.len();
        out.resize(head + a.count as usize, 0);
        self.device
            .region_read(a.region, a.offset, &mut out[head..])?;
        Ok(out)
    }

    pub(super) fn region_write(&mut self, s: &ClientState, payload: &[u8]) -> Handled {
        let a = read_prefix::<RegionAccess>(payload).ok_or(libc::EINVAL)?;
        let data = &payload[size_of::<RegionAccess>()..];
        if data.len() != a.count as usize {
            return Err(libc::EINVAL);
        }
        self.check_region(s, a.region, a.offset, a.count, VFIO_REGION_INFO_FLAG_WRITE)?;
        self.device.region_write(a.region, a.offset, data)?;
        Ok(a.as_bytes().to_vec())
    }
}
