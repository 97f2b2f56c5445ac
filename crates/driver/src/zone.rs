//! Zoned namespaces from the host side (NVMe Zoned Namespace Command Set
//! 1.1): Report Zones and Extended Report Zones (Zone Management Receive),
//! the zone actions (Zone Management Send: open, close, finish, reset,
//! offline, one zone or all; Set Zone Descriptor Extension) and Zone
//! Append, on an I/O queue. Each is one command built here and
//! sent as passthrough is ([`IoQueue::passthru`]); anything else a zoned
//! namespace takes (writes at the write pointer, reads) is the block API's
//! read and write.

use vnvme_spec::cdw::Cdw12ReadWrite;
use vnvme_spec::zns::{
    zra, zsa, Cdw13ZoneMgmtRecv, Cdw13ZoneMgmtSend, ReportZonesHeader, ZoneDescriptor,
};
use vnvme_spec::{Command, NvmOpcode};
use zerocopy::FromBytes;

use crate::access::DmaBuffer;
use crate::error::Error;
use crate::io::IoQueue;
use crate::passthru::PassthruData;

/// What Report Zones returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneReport {
    /// Number of Zones: those matching the filter from the start LBA on
    /// (a partial report: the descriptors returned).
    pub nr_zones: u64,
    /// The descriptors that fit in the buffer.
    pub zones: Vec<ZoneDescriptor>,
    /// An extended report: each zone's descriptor extension, in the order
    /// of `zones` (zeroes where its ZDEV attribute is clear). Empty for a
    /// plain report.
    pub extensions: Vec<Vec<u8>>,
}

impl IoQueue {
    /// Report Zones of namespace `nsid` from the zone holding `slba` on,
    /// those in state `filter` (a ZRASF value, 0 for all), into `buf` (as
    /// many descriptors as fit, up to the transfer limit); `partial`: the
    /// count is of the descriptors returned.
    pub fn report_zones(
        &mut self,
        nsid: u32,
        slba: u64,
        filter: u8,
        partial: bool,
        buf: &DmaBuffer,
    ) -> Result<ZoneReport, Error> {
        self.zone_report(nsid, slba, filter, partial, 0, buf)
    }

    /// Extended Report Zones: as [`Self::report_zones`], each descriptor
    /// followed by its extension of `ext_size` bytes (ZDES × 64 of the
    /// namespace's LBA format, Identify Namespace for CSI 02h; at least
    /// 64). A namespace without extensions answers Invalid Field.
    pub fn report_zones_extended(
        &mut self,
        nsid: u32,
        slba: u64,
        filter: u8,
        partial: bool,
        ext_size: usize,
        buf: &DmaBuffer,
    ) -> Result<ZoneReport, Error> {
        if ext_size == 0 || !ext_size.is_multiple_of(64) {
            return Err(Error::InvalidRequest(format!(
                "a zone descriptor extension is a non-zero multiple of 64 bytes, not {ext_size}"
            )));
        }
        self.zone_report(nsid, slba, filter, partial, ext_size, buf)
    }

    /// Set Zone Descriptor Extension (ZSA 10h): the first `ext_size`
    /// bytes of `data` (ZDES × 64) become the extension of the empty zone
    /// at `zslba`, which the device then closes.
    pub fn set_zone_extension(
        &mut self,
        nsid: u32,
        zslba: u64,
        data: &DmaBuffer,
        ext_size: usize,
    ) -> Result<(), Error> {
        if ext_size == 0 || ext_size > data.len() {
            return Err(Error::InvalidRequest(format!(
                "an extension of {ext_size} bytes from a buffer of {}",
                data.len()
            )));
        }
        let mut cmd = Command::new(NvmOpcode::ZONE_MGMT_SEND.0, 0);
        cmd.nsid = nsid.into();
        cmd.set_slba(zslba);
        cmd.cdw13 = Cdw13ZoneMgmtSend::new()
            .with_zsa(zsa::SET_ZONE_DESCRIPTOR_EXTENSION)
            .into();
        let c = self.passthru(cmd, Some(PassthruData::write(data, ext_size)))?;
        self.check(c.status, NvmOpcode::ZONE_MGMT_SEND)
    }

    /// Report Zones (`ext` 0) or Extended Report Zones (`ext` bytes of
    /// extension after each descriptor).
    fn zone_report(
        &mut self,
        nsid: u32,
        slba: u64,
        filter: u8,
        partial: bool,
        ext: usize,
        buf: &DmaBuffer,
    ) -> Result<ZoneReport, Error> {
        let len = buf.len().min(self.max_transfer()) & !3;
        if len < size_of::<ReportZonesHeader>() {
            return Err(Error::InvalidRequest(format!(
                "a zone report needs at least 64 bytes of buffer, got {len}"
            )));
        }
        let mut cmd = Command::new(NvmOpcode::ZONE_MGMT_RECV.0, 0);
        cmd.nsid = nsid.into();
        cmd.set_slba(slba);
        // NUMD, 0's based dwords; len is at least 64.
        cmd.cdw12 = ((len / 4 - 1) as u32).into();
        let action = if ext == 0 {
            zra::REPORT_ZONES
        } else {
            zra::EXTENDED_REPORT_ZONES
        };
        cmd.cdw13 = Cdw13ZoneMgmtRecv::new()
            .with_zra(action)
            .with_zrasf(filter)
            .with_partial(partial)
            .into();
        let c = self.passthru(cmd, Some(PassthruData::read(buf, len)))?;
        self.check(c.status, NvmOpcode::ZONE_MGMT_RECV)?;
        let mut page = vec![0u8; len];
        buf.read_bytes(0, &mut page)?;
        let (header, rest) = page.split_at(size_of::<ReportZonesHeader>());
        let nr_zones = ReportZonesHeader::read_from_bytes(header)
            .map(|h| h.nr_zones.get())
            .unwrap_or(0);
        // A device may claim more than it returned: take what is there.
        let given = usize::try_from(nr_zones).unwrap_or(usize::MAX);
        let entry = size_of::<ZoneDescriptor>() + ext;
        let (mut zones, mut extensions) = (Vec::new(), Vec::new());
        for e in rest.chunks_exact(entry).take(given) {
            let (d, x) = e.split_at(size_of::<ZoneDescriptor>());
            let Ok(d) = ZoneDescriptor::read_from_bytes(d) else {
                break;
            };
            zones.push(d);
            if ext > 0 {
                extensions.push(x.to_vec());
            }
        }
        Ok(ZoneReport {
            nr_zones,
            zones,
            extensions,
        })
    }

    /// Zone Management Send action `zsa` (a [`vnvme_spec::zns::zsa`]
    /// value) on the zone starting at `zslba`, or on every zone it applies
    /// to (`select_all`). A status other than success is an error.
    pub fn zone_action(
        &mut self,
        nsid: u32,
        zslba: u64,
        zsa: u8,
        select_all: bool,
    ) -> Result<(), Error> {
        let mut cmd = Command::new(NvmOpcode::ZONE_MGMT_SEND.0, 0);
        cmd.nsid = nsid.into();
        cmd.set_slba(zslba);
        cmd.cdw13 = Cdw13ZoneMgmtSend::new()
            .with_zsa(zsa)
            .with_select_all(select_all)
            .into();
        let c = self.passthru(cmd, None)?;
        self.check(c.status, NvmOpcode::ZONE_MGMT_SEND)
    }

    /// Zone Append of `nblocks` blocks of `buf` to the zone starting at
    /// `zslba`: the LBA the device wrote them at (completion DW0 and DW1).
    pub fn zone_append(
        &mut self,
        nsid: u32,
        zslba: u64,
        nblocks: u32,
        buf: &DmaBuffer,
    ) -> Result<u64, Error> {
        let lba_size = u64::from(self.namespace(nsid)?.lba_size);
        let nlb_z = nblocks
            .checked_sub(1)
            .and_then(|n| u16::try_from(n).ok())
            .ok_or_else(|| {
                Error::InvalidRequest(format!("{nblocks} blocks (NLB allows 1 to 65536)"))
            })?;
        let len = usize::try_from(u64::from(nblocks) * lba_size).unwrap_or(usize::MAX);
        let mut cmd = Command::new(NvmOpcode::ZONE_APPEND.0, 0);
        cmd.nsid = nsid.into();
        cmd.set_slba(zslba);
        cmd.cdw12 = Cdw12ReadWrite::new().with_nlb_z(nlb_z).into();
        let c = self.passthru(cmd, Some(PassthruData::write(buf, len)))?;
        self.check(c.status, NvmOpcode::ZONE_APPEND)?;
        Ok(u64::from(c.result) | (u64::from(c.dw1) << 32))
    }

    fn check(&self, status: vnvme_spec::Status, opcode: NvmOpcode) -> Result<(), Error> {
        if status.is_success() {
            Ok(())
        } else {
            Err(Error::IoCommand {
                qid: self.qid(),
                opcode,
                status,
            })
        }
    }
}
