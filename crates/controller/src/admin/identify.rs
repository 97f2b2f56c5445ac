//! Identify (§5.17): controller, namespaces, namespace lists and
//! descriptors, the I/O command set structures, SR-IOV visibility.

use vnvme_spec::cdw::{Cdw10Identify, Cdw11Identify};
use vnvme_spec::identify::nvm::{IdentifyControllerNvm, IdentifyNamespaceNvm};
use vnvme_spec::identify::virtualization::PrimaryControllerCaps;
use vnvme_spec::identify::{
    cmic, csi, ctratt, dsto, fill_ascii, frmw, lpa, ns_descriptor, oacs, oaes, ocfs, oncs, sgls,
    Cns, IdentifyController, IdentifyNsIndependent, IDENTIFY_SIZE,
};
use vnvme_spec::regs::version;
use vnvme_spec::{Command, Status};
use zerocopy::little_endian::{U16, U32};
use zerocopy::IntoBytes;

use super::invalid_field;
use crate::background;
use crate::command::Ctx;
use crate::config::ControllerConfig;
use crate::faults::Faults;
use crate::keep_alive::KAS;
use crate::lifecycle::Lifecycle;
use crate::namespace::{Namespace, ENDURANCE_GROUP_ID, NSID_ALL};
use crate::reporting::persistent_event_log::PELS;
use crate::reporting::{AERL, ELPE};
use crate::state::ACL;
use crate::subsystem::ana::{ANACAP, ANATT};
use crate::subsystem::firmware::{FWUG, SLOTS};
use crate::subsystem::Subsystem;

/// The I/O Command Set Combinations of Identify CNS 1Ch, by index: one,
/// the NVM and Zoned Namespace Command Sets together. Index 0 is what a
/// controller enables after reset, and Linux never selects another, so
/// zoned namespaces are usable without Set Features.
pub(super) const IO_COMMAND_SET_COMBINATIONS: &[u64] =
    &[csi::vector_bit(csi::NVM) | csi::vector_bit(csi::ZNS)];

fn invalid_ns() -> Status {
    Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true)
}

pub(super) fn identify(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<(), Status> {
    let cdw10 = Cdw10Identify::from(cmd.cdw10);
    let csi = Cdw11Identify::from(cmd.cdw11).csi();
    let nsid = cmd.nsid.get();
    let shared = ctx.shared;
    let page: Vec<u8> = match cdw10.cns() {
        Cns::NAMESPACE => identify_namespace(&shared.subsystem, nsid)?,
        Cns::CONTROLLER => identify_controller(&shared.config, &shared.subsystem)
            .as_bytes()
            .to_vec(),
        Cns::ACTIVE_NAMESPACES => namespace_list(&shared.subsystem, nsid, true)?,
        Cns::NS_DESCRIPTORS => descriptors(&shared.subsystem, nsid)?,
        Cns::NS_INDEPENDENT => {
            ns_independent(&shared.subsystem, &shared.faults, &shared.lifecycle, nsid)?
        }
        Cns::ALLOCATED_NAMESPACES => namespace_list(&shared.subsystem, nsid, false)?,
        Cns::ALLOCATED_NAMESPACE => allocated_namespace(&shared.subsystem, nsid)?,
        Cns::NS_CONTROLLERS => namespace_controllers(&shared.subsystem, nsid, cmd)?,
        Cns::CONTROLLERS => subsystem_controllers(&shared.subsystem, cmd),
        cns if uses_csi(cns) && csi == csi::ZNS => {
            zoned(&shared.config, &shared.subsystem, cns, nsid)?
        }
        // The I/O command set specific structures exist for the NVM and
        // Zoned Namespace Command Sets; any other CSI is a set this
        // controller lacks.
        cns if uses_csi(cns) && csi != csi::NVM => return Err(invalid_field()),
        Cns::NAMESPACE_IOCS => {
            check_nsid(&shared.subsystem, nsid)?;
            identify_namespace_nvm().as_bytes().to_vec()
        }
        Cns::CONTROLLER_IOCS => identify_controller_nvm().as_bytes().to_vec(),
        // Every namespace is an NVM Command Set namespace.
        Cns::ACTIVE_NAMESPACES_IOCS => namespace_list(&shared.subsystem, nsid, true)?,
        Cns::ALLOCATED_NAMESPACES_IOCS => namespace_list(&shared.subsystem, nsid, false)?,
        Cns::ALLOCATED_NAMESPACE_IOCS => {
            if nsid == NSID_ALL {
                return Err(invalid_ns());
            }
            check_nsid(&shared.subsystem, nsid)?;
            identify_namespace_nvm().as_bytes().to_vec()
        }
        Cns::IO_COMMAND_SETS => io_command_sets(&shared.config, cdw10.cntid())?,
        Cns::PRIMARY_CONTROLLER_CAPS => primary_controller_caps(&shared.config, cdw10.cntid())?,
        // No secondary controllers: a list of none, whatever CNTID it
        // starts from.
        Cns::SECONDARY_CONTROLLERS => vec![0; IDENTIFY_SIZE],
        // No UUIDs for vendor specific information (CTRATT.UUIDL clear): the
        // UUID List ends at its first entry, which is zero.
        Cns::UUID_LIST => vec![0; IDENTIFY_SIZE],
        // No Domain List (CNS 18h): it describes the domains of an NVM
        // subsystem that has several (CTRATT.MDS). Ours is a single domain,
        // whose Domain Identifiers are all 0h (§3.2.5), so there is no list
        // to give; the CNS is optional and unsupported, which is Invalid
        // Field in Command (§5.17.1), as for any other such CNS.
        _ => return Err(invalid_field()),
    };
    ctx.send(cmd, &page)
}

/// CNS values whose data depends on CDW11.CSI (§5.17.1 Figure 273).
fn uses_csi(cns: Cns) -> bool {
    matches!(
        cns,
        Cns::NAMESPACE_IOCS
            | Cns::CONTROLLER_IOCS
            | Cns::ACTIVE_NAMESPACES_IOCS
            | Cns::ALLOCATED_NAMESPACES_IOCS
            | Cns::ALLOCATED_NAMESPACE_IOCS
    )
}

/// Identify Controller (CNS 01h, §5.17.2.1).
/// Reads the configuration and the subsystem (namespaces, firmware).
pub(crate) fn identify_controller(
    c: &ControllerConfig,
    subsystem: &Subsystem,
) -> Box<IdentifyController> {
    let mut id = IdentifyController::new_boxed();
    id.vid = U16::new(c.vid);
    id.ssvid = U16::new(c.ssvid);
    fill_ascii(&mut id.sn, &c.serial);
    fill_ascii(&mut id.mn, &c.model);
    id.fr = subsystem.firmware.lock().running();
    id.rab = 6;
    id.mdts = c.mdts;
    id.cntlid = U16::new(c.cntlid);
    id.ver = U32::new(version(2, 0, 0));
    id.oaes = U32::new(
        oaes::NAMESPACE_ATTRIBUTE | oaes::FIRMWARE_ACTIVATION | oaes::ZONE_DESCRIPTOR_CHANGED,
    );
    if subsystem.namespaces.multi_controller() {
        subsystem_fields(subsystem, &mut id);
    }
    id.ctratt =
        U32::new(ctratt::HOST_ID_128 | ctratt::EXTENDED_LBA_FORMATS | ctratt::ENDURANCE_GROUPS);
    // CNTRLTYPE 1: I/O controller.
    id.cntrltype = 1;
    let dbbuf = if c.doorbells.uses_dbbuf() {
        oacs::DOORBELL_BUFFER_CONFIG
    } else {
        0
    };
    id.oacs = U16::new(
        (c.oacs_extra & !(oacs::SECURITY | oacs::DOORBELL_BUFFER_CONFIG))
            | dbbuf
            | oacs::FORMAT_NVM
            | oacs::FIRMWARE
            | oacs::NS_MANAGEMENT
            | oacs::SELF_TEST
            | oacs::DIRECTIVES,
    );
    id.acl = ACL;
    id.aerl = AERL;
    id.frmw = frmw::SLOT1_READ_ONLY | frmw::nofs(SLOTS) | frmw::ACTIVATION_WITHOUT_RESET;
    // Activation is a switch of revision (crate::subsystem::firmware): well within
    // the smallest nonzero bound, 100 ms.
    id.mtfa = U16::new(1);
    id.fwug = FWUG;
    id.lpa = lpa::COMMANDS_SUPPORTED_AND_EFFECTS
        | lpa::EXTENDED_DATA
        | lpa::TELEMETRY
        | lpa::PERSISTENT_EVENT;
    id.elpe = ELPE;
    // An extended self-test reads every namespace at the self-test rate.
    let edstt = background::seconds(subsystem.namespaces.media_bytes(), c.self_test_rate)
        .map_or(1, |s| s.div_ceil(60).max(1));
    id.edstt = U16::new(u16::try_from(edstt).unwrap_or(u16::MAX));
    id.dsto = dsto::SDSO;
    id.wctemp = U16::new(0x0157);
    id.cctemp = U16::new(0x0175);
    id.kas = U16::new(KAS);
    id.sqes = 0x66;
    id.cqes = 0x44;
    id.nn = U32::new(subsystem.nn);
    id.endgidmax = U16::new(ENDURANCE_GROUP_ID);
    id.pels = U32::new(PELS);
    id.sanicap = U32::new(super::sanitize::SANICAP);
    let allocated = subsystem.namespaces.allocated();
    id.tnvmcap = u128::from(subsystem.tnvmcap).to_le_bytes();
    id.unvmcap = u128::from(subsystem.tnvmcap.saturating_sub(allocated)).to_le_bytes();
    // FNA = 0: Format NVM and its erase apply to one namespace at a time.
    id.fna = 0;
    id.oncs = U16::new(
        oncs::COMPARE
            | oncs::WRITE_UNCORRECTABLE
            | oncs::DATASET_MANAGEMENT
            | oncs::WRITE_ZEROES
            | oncs::VERIFY
            | oncs::COPY
            | oncs::RESERVATIONS,
    );
    id.ocfs = U16::new(ocfs::FORMAT_0);
    // SGLs for I/O data, and for metadata through the one descriptor at
    // MPTR (PSDT 10b), exactly as long as the transfer: see `crate::sgl`.
    id.sgls = U32::new(sgls::SUPPORTED | sgls::BIT_BUCKET | sgls::MSDS);
    // Get Features' Select field, and the Timestamp feature.
    id.oncs = U16::new(id.oncs.get() | oncs::SAVE_SELECT | oncs::TIMESTAMP);
    // VWC bit 0: present; bits 2:1 = 11b: Flush with NSID FFFFFFFFh supported.
    id.vwc = u8::from(subsystem.vwc) | 0x06;
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

/// What a controller of a subsystem with several reports (§8.1, §8.3):
/// CMIC, and ANA reporting with one ANA group per namespace (ANAGRPID =
/// NSID, so NN groups at most; MNAN = NN bounds the NSIDs in the ANA log).
fn subsystem_fields(subsystem: &Subsystem, id: &mut IdentifyController) {
    id.cmic = cmic::MULTI_PORT | cmic::MULTI_CONTROLLER;
    if subsystem.ana_reporting() {
        id.cmic |= cmic::ANA_REPORTING;
        id.oaes = U32::new(id.oaes.get() | oaes::ANA_CHANGE);
        id.anatt = ANATT;
        id.anacap = ANACAP;
        id.anagrpmax = U32::new(subsystem.nn);
        id.nanagrpid = U32::new(subsystem.nn);
        id.mnan = U32::new(subsystem.nn);
    }
}

/// Identify Namespace data of `ns` as this controller reports it: shared
/// (NMIC bit 0) and in its ANA group when the subsystem has several
/// controllers.
fn namespace_data(subsystem: &Subsystem, ns: &Namespace) -> Vec<u8> {
    let mut id = ns.identify();
    if subsystem.namespaces.multi_controller() {
        id.nmic = 1;
        if subsystem.ana_reporting() {
            id.anagrpid = U32::new(ns.nsid);
        }
    }
    id.as_bytes().to_vec()
}

/// Identify Namespace (CNS 00h): active -> its data; inactive (detached
/// or unallocated) but valid -> zeroes; NSID FFFFFFFFh -> common
/// capabilities (zeroes here).
fn identify_namespace(subsystem: &Subsystem, nsid: u32) -> Result<Vec<u8>, Status> {
    check_nsid(subsystem, nsid)?;
    Ok(match subsystem.namespaces.active(nsid) {
        Some(ns) => namespace_data(subsystem, &ns),
        None => vec![0; IDENTIFY_SIZE],
    })
}

/// NSID 0 and NSIDs above NN (other than FFFFFFFFh) are invalid.
fn check_nsid(subsystem: &Subsystem, nsid: u32) -> Result<(), Status> {
    if nsid == 0 || (nsid > subsystem.nn && nsid != NSID_ALL) {
        return Err(invalid_ns());
    }
    Ok(())
}

/// Identify Namespace for an allocated NSID (CNS 11h): as CNS 00h, whether
/// attached or not; unallocated -> zeroes.
fn allocated_namespace(subsystem: &Subsystem, nsid: u32) -> Result<Vec<u8>, Status> {
    if nsid == NSID_ALL {
        return Err(invalid_ns());
    }
    check_nsid(subsystem, nsid)?;
    Ok(match subsystem.namespaces.get(nsid) {
        Some(ns) => namespace_data(subsystem, &ns),
        None => vec![0; IDENTIFY_SIZE],
    })
}

/// Active (CNS 02h) or Allocated (CNS 10h) Namespace ID list: NSIDs greater
/// than `nsid`, at most 1024.
fn namespace_list(subsystem: &Subsystem, nsid: u32, active_only: bool) -> Result<Vec<u8>, Status> {
    if nsid >= 0xFFFF_FFFE {
        return Err(invalid_ns());
    }
    let mut page = vec![0u8; IDENTIFY_SIZE];
    let ids = subsystem.namespaces.ids_after(nsid, active_only, 1024);
    for (slot, id) in page.chunks_exact_mut(4).zip(ids) {
        slot.copy_from_slice(&id.to_le_bytes());
    }
    Ok(page)
}

/// A Controller List (§4.7.2): number of identifiers, then the ids, each
/// 16 bits, ascending: those of `cntlids` at least CDW10.CNTID (31:16),
/// 2047 at most.
fn controller_list(cntlids: impl IntoIterator<Item = u16>, cmd: &Command) -> Vec<u8> {
    let from = Cdw10Identify::from(cmd.cdw10).cntid();
    let mut page = vec![0u8; IDENTIFY_SIZE];
    let mut n = 0u16;
    for (slot, id) in page[2..]
        .chunks_exact_mut(2)
        .zip(cntlids.into_iter().filter(|&c| c >= from))
    {
        slot.copy_from_slice(&id.to_le_bytes());
        n += 1;
    }
    page[..2].copy_from_slice(&n.to_le_bytes());
    page
}

/// The subsystem's controllers (CNS 13h).
fn subsystem_controllers(subsystem: &Subsystem, cmd: &Command) -> Vec<u8> {
    controller_list(subsystem.namespaces.controllers(), cmd)
}

/// Controllers attached to an allocated namespace (CNS 12h).
fn namespace_controllers(
    subsystem: &Subsystem,
    nsid: u32,
    cmd: &Command,
) -> Result<Vec<u8>, Status> {
    if nsid == NSID_ALL {
        return Err(invalid_ns());
    }
    check_nsid(subsystem, nsid)?;
    let attached = subsystem.namespaces.get(nsid);
    let ids: Vec<u16> = attached.map_or(Vec::new(), |ns| ns.attached.iter().collect());
    Ok(controller_list(ids, cmd))
}

/// Namespace Identification Descriptor list (CNS 03h): EUI-64, NGUID,
/// UUID (the same as Identify Namespace reports, and the UUID only here)
/// and CSI.
fn descriptors(subsystem: &Subsystem, nsid: u32) -> Result<Vec<u8>, Status> {
    let ns = subsystem.namespace(nsid)?;
    let mut page = Vec::with_capacity(IDENTIFY_SIZE);
    page.extend_from_slice(&[ns_descriptor::EUI64, 8, 0, 0]);
    page.extend_from_slice(&ns.ids.eui64);
    page.extend_from_slice(&[ns_descriptor::NGUID, 16, 0, 0]);
    page.extend_from_slice(&ns.ids.nguid);
    page.extend_from_slice(&[ns_descriptor::UUID, 16, 0, 0]);
    page.extend_from_slice(&ns.ids.uuid);
    page.extend_from_slice(&[ns_descriptor::CSI, 1, 0, 0, ns.csi()]);
    page.resize(IDENTIFY_SIZE, 0);
    Ok(page)
}

/// I/O Command Set Independent Identify Namespace (CNS 08h): zeroes for an
/// inactive NSID; for an active one NSTAT bit 0 (NRDY) says whether it is
/// ready for I/O, and NSFEAT bit 5 (VWCPN) that its backend has no
/// volatile write cache, whatever Identify Controller VWC says for others.
/// NSTAT reads the operator's faults and the lifecycle (time since
/// enable).
fn ns_independent(
    subsystem: &Subsystem,
    faults: &Faults,
    lifecycle: &Lifecycle,
    nsid: u32,
) -> Result<Vec<u8>, Status> {
    check_nsid(subsystem, nsid)?;
    let mut id = IdentifyNsIndependent::new_boxed();
    if let Some(ns) = subsystem.namespaces.active(nsid) {
        let now = std::time::Instant::now();
        let faulted = faults.not_ready(ns.nsid, || now);
        id.nstat = u8::from(ns.is_ready(lifecycle.since_enable(now)) && !faulted);
        id.nsfeat = if ns.backend.volatile_cache() {
            0
        } else {
            1 << 5
        };
        id.nmic = u8::from(subsystem.namespaces.multi_controller());
        id.endgid = U16::new(ENDURANCE_GROUP_ID);
    }
    Ok(id.as_bytes().to_vec())
}

/// The I/O Command Set specific structures with CSI 02h (Zoned Namespace
/// Command Set): its Identify Namespace and Controller, and its
/// namespaces' lists (the zoned ones).
fn zoned(
    config: &ControllerConfig,
    subsystem: &Subsystem,
    cns: Cns,
    nsid: u32,
) -> Result<Vec<u8>, Status> {
    let namespaces = &subsystem.namespaces;
    match cns {
        Cns::NAMESPACE_IOCS => {
            check_nsid(subsystem, nsid)?;
            super::zns::identify_namespace_of(namespaces.active(nsid).as_deref())
        }
        Cns::ALLOCATED_NAMESPACE_IOCS => {
            if nsid == NSID_ALL {
                return Err(invalid_ns());
            }
            check_nsid(subsystem, nsid)?;
            super::zns::identify_namespace_of(namespaces.get(nsid).as_deref())
        }
        Cns::CONTROLLER_IOCS => Ok(super::zns::identify_controller(config).as_bytes().to_vec()),
        _ => {
            let active = cns == Cns::ACTIVE_NAMESPACES_IOCS;
            let mut page = namespace_list(subsystem, nsid, active)?;
            let zoned = |id: u32| namespaces.get(id).is_some_and(|ns| ns.zones.is_some());
            let ids: Vec<u32> = page
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .filter(|&id| id != 0 && zoned(id))
                .collect();
            page.fill(0);
            for (slot, id) in page.chunks_exact_mut(4).zip(ids) {
                slot.copy_from_slice(&id.to_le_bytes());
            }
            Ok(page)
        }
    }
}

/// I/O Command Set specific Identify Namespace for the NVM Command Set
/// (CNS 05h and 1Bh): the same for every NSID that gets one: no storage
/// tag (LBSTM, PIC 0), and the guard of each format's protection
/// information in its Extended LBA Format ([`Namespace::identify_nvm`]).
fn identify_namespace_nvm() -> Box<IdentifyNamespaceNvm> {
    Namespace::identify_nvm()
}

/// I/O Command Set specific Identify Controller for the NVM Command Set
/// (CNS 06h): the commands have no size limits beyond MDTS and their own
/// fields (Write Zeroes NLB, Dataset Management's 256 ranges of any
/// length), so VSL, WZSL, WUSL, DMRL, DMRSL and DMSL report none (0).
fn identify_controller_nvm() -> Box<IdentifyControllerNvm> {
    IdentifyControllerNvm::new_boxed()
}

/// Identify I/O Command Set data structure (CNS 1Ch): the combinations,
/// 8 bytes each, for CNTID FFFFh (the controller processing the command)
/// or our own CNTLID; there is no other controller.
fn io_command_sets(config: &ControllerConfig, cntid: u16) -> Result<Vec<u8>, Status> {
    if cntid != 0xFFFF && cntid != config.cntlid {
        return Err(invalid_field());
    }
    let mut page = vec![0u8; IDENTIFY_SIZE];
    for (slot, v) in page.chunks_exact_mut(8).zip(IO_COMMAND_SET_COMBINATIONS) {
        slot.copy_from_slice(&v.to_le_bytes());
    }
    Ok(page)
}

/// Primary Controller Capabilities (CNS 14h) of the primary controller
/// CNTID, which can only be this one. CNTID 0 is taken as this one too:
/// it is what nvme-cli and libnvme send when the user names no controller
/// (`nvme primary-ctrl-caps /dev/nvme0`), QEMU answers every CNTID with its
/// own capabilities, and the structure names the controller it describes
/// (its CNTLID field), so a host cannot mistake whose it is; another
/// CNTID names no controller of this subsystem: Invalid Field.
/// Without Virtualization Management (OACS bit 7) no resource is flexible
/// (CRT 0): every queue, admin included, and every interrupt vector is the
/// controller's own.
fn primary_controller_caps(config: &ControllerConfig, cntid: u16) -> Result<Vec<u8>, Status> {
    let c = config;
    if cntid != c.cntlid && cntid != 0 {
        return Err(invalid_field());
    }
    let mut caps = PrimaryControllerCaps::new_boxed();
    caps.cntlid = U16::new(c.cntlid);
    caps.vqprt = U16::new(c.max_io_queues.saturating_add(1));
    caps.viprt = U16::new(c.msix_vectors);
    Ok(caps.as_bytes().to_vec())
}
