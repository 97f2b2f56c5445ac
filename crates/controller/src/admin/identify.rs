//! Identify (§5.17): controller, namespaces, namespace lists and descriptors.

use vnvme_spec::identify::{
    fill_ascii, ns_descriptor, oacs, oncs, Cns, IdentifyController, IdentifyNsIndependent,
    IDENTIFY_SIZE,
};
use vnvme_spec::regs::version;
use vnvme_spec::{Command, Status};
use zerocopy::little_endian::{U16, U32};
use zerocopy::IntoBytes;

use super::invalid_field;
use crate::state::{Ctx, Shared, AERL, ELPE};

const NSID_ALL: u32 = 0xFFFF_FFFF;

fn invalid_ns() -> Status {
    Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true)
}

pub(super) fn identify(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<(), Status> {
    let cns = Cns(cmd.cdw10.get() as u8);
    let csi = (cmd.cdw11.get() >> 24) as u8;
    let nsid = cmd.nsid.get();
    let shared = ctx.shared;
    let page: Vec<u8> = match cns {
        Cns::NAMESPACE => identify_namespace(shared, nsid)?,
        Cns::CONTROLLER => identify_controller(shared).as_bytes().to_vec(),
        Cns::ACTIVE_NAMESPACES => active_namespaces(shared, nsid)?,
        Cns::NS_DESCRIPTORS => descriptors(shared, nsid)?,
        Cns::NS_INDEPENDENT => ns_independent(shared, nsid)?,
        // I/O Command Set specific Identify Controller (CNS 06h) for the NVM
        // command set: no limits beyond MDTS, all zeroes.
        Cns(0x06) if csi == 0 => vec![0; IDENTIFY_SIZE],
        _ => return Err(invalid_field()),
    };
    ctx.send(cmd, &page)
}

/// Identify Controller (CNS 01h, §5.17.2.1).
pub(crate) fn identify_controller(shared: &Shared) -> Box<IdentifyController> {
    let c = &shared.config;
    let mut id = IdentifyController::new_boxed();
    id.vid = U16::new(c.vid);
    id.ssvid = U16::new(c.ssvid);
    fill_ascii(&mut id.sn, &c.serial);
    fill_ascii(&mut id.mn, &c.model);
    fill_ascii(&mut id.fr, &c.firmware);
    id.rab = 6;
    id.mdts = c.mdts;
    id.cntlid = U16::new(c.cntlid);
    id.ver = U32::new(version(2, 0, 0));
    // OAES bit 8: Namespace Attribute Notices.
    id.oaes = U32::new(1 << 8);
    // CNTRLTYPE 1: I/O controller.
    id.cntrltype = 1;
    let dbbuf = if c.doorbells.uses_dbbuf() {
        oacs::DOORBELL_BUFFER_CONFIG
    } else {
        0
    };
    id.oacs = U16::new((c.oacs_extra & !(oacs::SECURITY | oacs::DOORBELL_BUFFER_CONFIG)) | dbbuf);
    id.acl = 3;
    id.aerl = AERL;
    // FRMW: slot 1 read only, one slot.
    id.frmw = 0x03;
    // LPA bit 1: Commands Supported and Effects; bit 2: extended Get Log
    // Page data (NUMDU, offsets).
    id.lpa = 0x06;
    id.elpe = ELPE;
    id.wctemp = U16::new(0x0157);
    id.cctemp = U16::new(0x0175);
    id.sqes = 0x66;
    id.cqes = 0x44;
    id.nn = U32::new(shared.nn);
    id.oncs = U16::new(oncs::COMPARE | oncs::DATASET_MANAGEMENT | oncs::WRITE_ZEROES);
    // VWC bit 0: present; bits 2:1 = 11b: Flush with NSID FFFFFFFFh supported.
    id.vwc = u8::from(shared.vwc) | 0x06;
    fill_ascii(&mut id.subnqn, &c.nqn());
    for b in id.subnqn.iter_mut().rev() {
        // SUBNQN is null terminated, not space padded.
        if *b != b' ' {
            break;
        }
        *b = 0;
    }
    // Power state 0: max power 25.00 W (units of 0.01 W).
    if let Some(ps0) = id.psd.get_mut(0) {
        ps0[..2].copy_from_slice(&2500u16.to_le_bytes());
    }
    id
}

/// Identify Namespace (CNS 00h): active -> its data; inactive but valid ->
/// zeroes; NSID FFFFFFFFh -> common capabilities (zeroes here).
fn identify_namespace(shared: &Shared, nsid: u32) -> Result<Vec<u8>, Status> {
    if nsid == 0 || (nsid > shared.nn && nsid != NSID_ALL) {
        return Err(invalid_ns());
    }
    Ok(match shared.namespaces.get(&nsid) {
        Some(ns) => ns.identify().as_bytes().to_vec(),
        None => vec![0; IDENTIFY_SIZE],
    })
}

/// Active Namespace ID list (CNS 02h): active NSIDs greater than `nsid`.
fn active_namespaces(shared: &Shared, nsid: u32) -> Result<Vec<u8>, Status> {
    if nsid >= 0xFFFF_FFFE {
        return Err(invalid_ns());
    }
    let mut page = vec![0u8; IDENTIFY_SIZE];
    let ids = shared.namespaces.keys().filter(|&&id| id > nsid).take(1024);
    for (slot, id) in page.chunks_exact_mut(4).zip(ids) {
        slot.copy_from_slice(&id.to_le_bytes());
    }
    Ok(page)
}

/// Namespace Identification Descriptor list (CNS 03h): NGUID and CSI.
fn descriptors(shared: &Shared, nsid: u32) -> Result<Vec<u8>, Status> {
    let ns = shared.namespace(nsid)?;
    let mut page = Vec::with_capacity(IDENTIFY_SIZE);
    page.extend_from_slice(&[ns_descriptor::NGUID, 16, 0, 0]);
    page.extend_from_slice(&ns.nguid());
    page.extend_from_slice(&[ns_descriptor::CSI, 1, 0, 0, 0]);
    page.resize(IDENTIFY_SIZE, 0);
    Ok(page)
}

/// I/O Command Set Independent Identify Namespace (CNS 08h).
fn ns_independent(shared: &Shared, nsid: u32) -> Result<Vec<u8>, Status> {
    if nsid == 0 || (nsid > shared.nn && nsid != NSID_ALL) {
        return Err(invalid_ns());
    }
    let mut id = IdentifyNsIndependent::new_boxed();
    if shared.namespaces.contains_key(&nsid) {
        // NSTAT bit 0: namespace ready.
        id.nstat = 1;
    }
    Ok(id.as_bytes().to_vec())
}
