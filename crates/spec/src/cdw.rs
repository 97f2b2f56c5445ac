//! Command dwords 10 to 13 of the commands the controller and the driver
//! both use, and the completion dword 0 they share, as bitfield types: one
//! type per dword, fields named by the spec's mnemonics.
//!
//! Both sides go through these types, so a field's position is written down
//! once. A dword converts from and to the command's little-endian field:
//!
//! ```
//! use vnvme_spec::cdw::Cdw10CreateIoQueue;
//! use vnvme_spec::Command;
//!
//! let mut cmd = Command::new(0x05, 1);
//! cmd.cdw10 = Cdw10CreateIoQueue::new().with_qid(1).with_qsize_z(63).into();
//! let cdw10 = Cdw10CreateIoQueue::from(cmd.cdw10);
//! assert_eq!((cdw10.qid(), cdw10.qsize_z()), (1, 63));
//! ```
//!
//! Reserved bits are padding: no accessor, and kept as they came through a
//! conversion, so a handler that had to refuse them could still see them
//! in the raw dword (ours ignore them). Values that span two whole dwords
//! (SLBA, log page offset) are on [`Command`](crate::Command) or
//! [`GetLogPage`](crate::log::GetLogPage). Feature values (Set Features
//! CDW11, Get Features dword 0) are in [`feature`](crate::feature).

use bitfield_struct::bitfield;

use crate::feature::FeatureId;
use crate::identify::Cns;
use crate::log_page_id::LogPageId;

dword!(
    Cdw10CreateIoQueue,
    Cdw11CreateIoCq,
    Cdw11CreateIoSq,
    Cdw10DeleteIoQueue,
    Cdw10Abort,
    Cdw10Identify,
    Cdw11Identify,
    Cdw10GetLogPage,
    Cdw11GetLogPage,
    Cdw10GetFeatures,
    Cdw10SetFeatures,
    Cdw10NsManagement,
    Cdw11NsManagement,
    Cdw10NsAttachment,
    Cdw10FormatNvm,
    Cdw10FirmwareCommit,
    Cdw10Sanitize,
    Cdw10DeviceSelfTest,
    Cdw12ReadWrite,
    Cdw13ReadWrite,
    Cdw15ReadWrite,
    Cdw12WriteZeroes,
    Cdw12Copy,
    Cdw10Dsm,
    Cdw11Dsm,
    AsyncEventCompletion,
);

/// Create I/O Completion Queue and Create I/O Submission Queue CDW10
/// (§5.4, §5.5).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw10CreateIoQueue {
    /// Queue Identifier.
    pub qid: u16,
    /// Queue Size, 0's based.
    pub qsize_z: u16,
}

/// Create I/O Completion Queue CDW11 (§5.4).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw11CreateIoCq {
    /// Physically Contiguous.
    pub pc: bool,
    /// Interrupts Enabled.
    pub ien: bool,
    #[bits(14)]
    __: u16,
    /// Interrupt Vector (MSI-X table entry).
    pub iv: u16,
}

/// Create I/O Submission Queue CDW11 (§5.5).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw11CreateIoSq {
    /// Physically Contiguous.
    pub pc: bool,
    /// Queue Priority under weighted round robin: 0 urgent to 3 low.
    #[bits(2)]
    pub qprio: u8,
    #[bits(13)]
    __: u16,
    /// Completion Queue Identifier.
    pub cqid: u16,
}

/// Delete I/O Submission Queue and Delete I/O Completion Queue CDW10
/// (§5.7, §5.6).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw10DeleteIoQueue {
    /// Queue Identifier.
    pub qid: u16,
    __: u16,
}

/// Abort CDW10 (§5.1).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw10Abort {
    /// Submission Queue Identifier of the command to abort.
    pub sqid: u16,
    /// Command Identifier of the command to abort.
    pub cid: u16,
}

/// Identify CDW10 (§5.17).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw10Identify {
    /// Controller or Namespace Structure.
    #[bits(8)]
    pub cns: Cns,
    __: u8,
    /// Controller Identifier: lists start at this CNTLID.
    pub cntid: u16,
}

/// Identify CDW11 (§5.17).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw11Identify {
    /// CNS Specific Identifier.
    pub cnssid: u16,
    __: u8,
    /// Command Set Identifier (0: NVM command set).
    pub csi: u8,
}

/// Get Log Page CDW10 (§5.16).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw10GetLogPage {
    /// Log Page Identifier.
    #[bits(8)]
    pub lid: LogPageId,
    /// Log Specific Parameter.
    #[bits(7)]
    pub lsp: u8,
    /// Retain Asynchronous Event.
    pub rae: bool,
    /// Number of Dwords Lower: bits 15:0 of the 0's based NUMD.
    pub numdl: u16,
}

/// Get Log Page CDW11 (§5.16). CDW12 and CDW13 are the Log
/// Page Offset Lower and Upper (LPOL, LPOU) dwords, whole.
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw11GetLogPage {
    /// Number of Dwords Upper: bits 31:16 of the 0's based NUMD.
    pub numdu: u16,
    /// Log Specific Identifier.
    pub lsi: u16,
}

/// Get Features CDW10 (§5.15). CDW11 carries a feature
/// specific value for some features (Interrupt Vector Configuration: IV).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw10GetFeatures {
    /// Feature Identifier.
    #[bits(8)]
    pub fid: FeatureId,
    /// Select: which value to return (see [`crate::feature::select`]).
    #[bits(3)]
    pub sel: u8,
    #[bits(21)]
    __: u32,
}

/// Set Features CDW10 (§5.27). The value is in CDW11 (see the
/// types in [`crate::feature`]).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw10SetFeatures {
    /// Feature Identifier.
    #[bits(8)]
    pub fid: FeatureId,
    #[bits(23)]
    __: u32,
    /// Save: keep the value across resets.
    pub sv: bool,
}

/// Namespace Management CDW10 (§5.22).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw10NsManagement {
    /// Select: 0h create, 1h delete.
    #[bits(4)]
    pub sel: u8,
    #[bits(28)]
    __: u32,
}

/// Namespace Management CDW11 (§5.22).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw11NsManagement {
    #[bits(24)]
    __: u32,
    /// Command Set Identifier of the namespace to create.
    pub csi: u8,
}

/// Namespace Attachment CDW10 (§5.23).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw10NsAttachment {
    /// Select: 0h attach, 1h detach.
    #[bits(4)]
    pub sel: u8,
    #[bits(28)]
    __: u32,
}

/// Format NVM CDW10 (NVM Command Set 1.0 §4.2; Base 2.0 §5.14).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw10FormatNvm {
    /// LBA Format index, bits 3:0 (see [`Self::lbaf`]).
    #[bits(4)]
    pub lbafl: u8,
    /// Metadata Settings: 1 metadata extends the LBA, 0 in a separate buffer.
    pub mset: bool,
    /// Protection Information type (0: none).
    #[bits(3)]
    pub pi: u8,
    /// Protection Information Location.
    pub pil: bool,
    /// Secure Erase Settings: 0 none, 1 user data erase, 2 cryptographic.
    #[bits(3)]
    pub ses: u8,
    /// LBA Format index, bits 5:4.
    #[bits(2)]
    pub lbafu: u8,
    #[bits(18)]
    __: u32,
}

impl Cdw10FormatNvm {
    /// The LBA Format index, LBAFU:LBAFL (0 to 63).
    pub const fn lbaf(&self) -> u8 {
        self.lbafl() | (self.lbafu() << 4)
    }

    /// Sets LBAFL and LBAFU from an index; bits above 5 are dropped.
    pub const fn with_lbaf(self, index: u8) -> Self {
        self.with_lbafl(index & 0xF).with_lbafu((index >> 4) & 0x3)
    }
}

/// Firmware Commit CDW10 (§5.12). Firmware Image Download's CDW10 (NUMD,
/// 0's based dwords) and CDW11 (OFST, dwords) are whole dwords.
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw10FirmwareCommit {
    /// Firmware Slot: 1 to 7, or 0 for the controller to choose.
    #[bits(3)]
    pub fs: u8,
    /// Commit Action (see [`crate::log::firmware::commit_action`]).
    #[bits(3)]
    pub ca: u8,
    #[bits(25)]
    __: u32,
    /// Boot Partition ID, for the boot partition actions (110b, 111b).
    pub bpid: bool,
}

/// Sanitize CDW10 (§5.24). CDW11 is the Overwrite Pattern, whole.
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw10Sanitize {
    /// Sanitize Action (see [`crate::log::sanitize::action`]).
    #[bits(3)]
    pub sanact: u8,
    /// Allow Unrestricted Sanitize Exit: a failure may be left with Exit
    /// Failure Mode.
    pub ause: bool,
    /// Overwrite Pass Count (0: 16 passes).
    #[bits(4)]
    pub owpass: u8,
    /// Overwrite Invert Pattern Between Passes.
    pub oipbp: bool,
    /// No-Deallocate After Sanitize.
    pub ndas: bool,
    /// Enter Media Verification State.
    pub emvs: bool,
    #[bits(21)]
    __: u32,
}

/// Device Self-test CDW10 (§5.9).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw10DeviceSelfTest {
    /// Self-test Code (see [`crate::log::self_test::code`]).
    #[bits(4)]
    pub stc: u8,
    #[bits(28)]
    __: u32,
}

/// Read, Write and Compare CDW12 (NVM Command Set 1.0 §3.2.4,
/// §3.2.6, §3.2.1); Verify (§3.2.5) and Write Uncorrectable (§3.2.7)
/// have the same layout, with fewer fields. SLBA is CDW10-11
/// ([`Command::slba`](crate::Command::slba)).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw12ReadWrite {
    /// Number of Logical Blocks, 0's based.
    pub nlb_z: u16,
    #[bits(4)]
    __: u8,
    /// Directive Type (Write only).
    #[bits(4)]
    pub dtype: u8,
    /// Storage Tag Check.
    pub stc: bool,
    #[bits(1)]
    __: u8,
    /// Protection Information field.
    #[bits(4)]
    pub prinfo: u8,
    /// Force Unit Access.
    pub fua: bool,
    /// Limited Retry.
    pub lr: bool,
}

/// Read, Write and Compare CDW13 (NVM Command Set 1.0 §3.2.6).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw13ReadWrite {
    /// Dataset Management: access frequency (3:0), latency (5:4),
    /// sequential request (6), incompressible (7).
    pub dsm: u8,
    __: u8,
    /// Directive Specific (Write only).
    pub dspec: u16,
}

/// Read, Write and Compare CDW15 (NVM Command Set 1.0 §3.2.6): the
/// application tag the protection information is checked against or
/// generated with.
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw15ReadWrite {
    /// Logical Block Application Tag (ELBAT, or LBAT for writes).
    pub lbat: u16,
    /// Logical Block Application Tag Mask: the bits of the tag checked.
    pub lbatm: u16,
}

/// The PRINFO field of Read, Write, Compare, Verify and Write Zeroes
/// (CDW12 29:26; NVM Command Set 1.0 §5.3.2.1, Figure 10).
#[bitfield(u8)]
#[derive(PartialEq, Eq)]
pub struct Prinfo {
    /// PRCHK bit 0: check the Logical Block Reference Tag.
    pub prchk_ref: bool,
    /// PRCHK bit 1: check the Logical Block Application Tag.
    pub prchk_app: bool,
    /// PRCHK bit 2: check the Guard.
    pub prchk_guard: bool,
    /// Protection Information Action: the controller inserts (write) or
    /// strips (read) the protection information.
    pub pract: bool,
    #[bits(4)]
    __: u8,
}

/// Write Zeroes CDW12 (NVM Command Set 1.0 §3.2.8).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw12WriteZeroes {
    /// Number of Logical Blocks, 0's based.
    pub nlb_z: u16,
    __: u8,
    /// Storage Tag Check.
    pub stc: bool,
    /// Deallocate: the blocks may be deallocated rather than written.
    pub deac: bool,
    /// Protection Information field.
    #[bits(4)]
    pub prinfo: u8,
    /// Force Unit Access.
    pub fua: bool,
    /// Limited Retry.
    pub lr: bool,
}

/// Copy CDW12 (NVM Command Set 1.0 §3.2.2). SDLBA, the first destination
/// block, is CDW10-11 ([`Command::slba`](crate::Command::slba)); the
/// source range entries are in the data buffer (see
/// [`crate::range::CopyRangeF0`]).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw12Copy {
    /// Number of Ranges, 0's based.
    pub nr_z: u8,
    /// Descriptor Format of the source range entries (see
    /// [`crate::identify::ocfs`]).
    #[bits(4)]
    pub desfmt: u8,
    /// Protection Information field for the reads.
    #[bits(4)]
    pub prinfor: u8,
    #[bits(4)]
    __: u8,
    /// Directive Type of the write.
    #[bits(4)]
    pub dtype: u8,
    /// Storage Tag Check Write.
    pub stcw: bool,
    #[bits(1)]
    __: u8,
    /// Protection Information field for the write.
    #[bits(4)]
    pub prinfow: u8,
    /// Force Unit Access.
    pub fua: bool,
    /// Limited Retry.
    pub lr: bool,
}

/// Dataset Management CDW10 (NVM Command Set 1.0 §3.2.3).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw10Dsm {
    /// Number of Ranges, 0's based.
    pub nr_z: u8,
    #[bits(24)]
    __: u32,
}

/// Dataset Management CDW11 (NVM Command Set 1.0 §3.2.3).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw11Dsm {
    /// Integral Dataset for Read.
    pub idr: bool,
    /// Integral Dataset for Write.
    pub idw: bool,
    /// Attribute – Deallocate.
    pub ad: bool,
    #[bits(29)]
    __: u32,
}

/// Asynchronous Event Request completion dword 0 (§5.2).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct AsyncEventCompletion {
    /// Asynchronous Event Type (see [`crate::log::async_event`]).
    #[bits(3)]
    pub aet: u8,
    #[bits(5)]
    __: u8,
    /// Asynchronous Event Information.
    pub aei: u8,
    /// Log Page Identifier to read to clear the event.
    pub lid: u8,
    __: u8,
}

#[cfg(test)]
mod tests {
    use zerocopy::little_endian::U32;

    use super::*;

    /// Every type keeps all 32 bits through `U32` and back.
    #[test]
    fn every_dword_round_trips_through_u32() {
        fn check<T>(raw: u32)
        where
            T: From<U32> + Into<U32>,
        {
            let back: U32 = T::from(U32::new(raw)).into();
            assert_eq!(back.get(), raw, "{}", core::any::type_name::<T>());
        }
        for raw in [0, u32::MAX, 0xDEAD_BEEF, 0x8000_0001, 0x0123_4567] {
            check::<Cdw10CreateIoQueue>(raw);
            check::<Cdw11CreateIoCq>(raw);
            check::<Cdw11CreateIoSq>(raw);
            check::<Cdw10DeleteIoQueue>(raw);
            check::<Cdw10Abort>(raw);
            check::<Cdw10Identify>(raw);
            check::<Cdw11Identify>(raw);
            check::<Cdw10GetLogPage>(raw);
            check::<Cdw11GetLogPage>(raw);
            check::<Cdw10GetFeatures>(raw);
            check::<Cdw10SetFeatures>(raw);
            check::<Cdw10NsManagement>(raw);
            check::<Cdw11NsManagement>(raw);
            check::<Cdw10NsAttachment>(raw);
            check::<Cdw10FormatNvm>(raw);
            check::<Cdw10FirmwareCommit>(raw);
            check::<Cdw10Sanitize>(raw);
            check::<Cdw10DeviceSelfTest>(raw);
            check::<Cdw12ReadWrite>(raw);
            check::<Cdw13ReadWrite>(raw);
            check::<Cdw12WriteZeroes>(raw);
            check::<Cdw12Copy>(raw);
            check::<Cdw10Dsm>(raw);
            check::<Cdw11Dsm>(raw);
            check::<AsyncEventCompletion>(raw);
        }
    }

    #[test]
    fn sanitize_fields_sit_where_the_spec_puts_them() {
        let cdw10: u32 = Cdw10Sanitize::new()
            .with_sanact(3)
            .with_ause(true)
            .with_owpass(5)
            .with_oipbp(true)
            .with_ndas(true)
            .into();
        assert_eq!(cdw10, 3 | (1 << 3) | (5 << 4) | (1 << 8) | (1 << 9));
        assert!(Cdw10Sanitize::from_bits(1 << 10).emvs());
        assert_eq!(Cdw10DeviceSelfTest::from_bits(0xFFFF_FFF2).stc(), 2);
    }

    #[test]
    fn create_queue_fields_sit_where_the_spec_puts_them() {
        let cdw10: u32 = Cdw10CreateIoQueue::new()
            .with_qid(3)
            .with_qsize_z(63)
            .into();
        assert_eq!(cdw10, 3 | (63 << 16));
        let cq: u32 = Cdw11CreateIoCq::new()
            .with_pc(true)
            .with_ien(true)
            .with_iv(2)
            .into();
        assert_eq!(cq, 1 | (1 << 1) | (2 << 16));
        let sq: u32 = Cdw11CreateIoSq::new()
            .with_pc(true)
            .with_qprio(2)
            .with_cqid(5)
            .into();
        assert_eq!(sq, 1 | (2 << 1) | (5 << 16));
    }

    #[test]
    fn identify_and_features_fields_sit_where_the_spec_puts_them() {
        let id = Cdw10Identify::from_bits(0x0042_0013);
        assert_eq!((id.cns(), id.cntid()), (Cns(0x13), 0x42));
        assert_eq!(Cdw11Identify::from_bits(0x0200_0000).csi(), 2);
        let get = Cdw10GetFeatures::from_bits(0x0000_0307);
        assert_eq!((get.fid(), get.sel()), (FeatureId::NUMBER_OF_QUEUES, 3));
        let set = Cdw10SetFeatures::from_bits(0x8000_0006);
        assert_eq!(set.fid(), FeatureId::VOLATILE_WRITE_CACHE);
        assert!(set.sv(), "SV is bit 31");
    }

    #[test]
    fn get_log_page_fields_sit_where_the_spec_puts_them() {
        let cdw10 = Cdw10GetLogPage::from_bits(0x1234_8102);
        assert_eq!(cdw10.lid(), LogPageId::SMART_HEALTH);
        assert_eq!(cdw10.lsp(), 1);
        assert!(cdw10.rae(), "RAE is bit 15");
        assert_eq!(cdw10.numdl(), 0x1234);
        assert_eq!(Cdw11GetLogPage::from_bits(0x0005_0007).numdu(), 7);
    }

    #[test]
    fn io_fields_sit_where_the_spec_puts_them() {
        let rw = Cdw12ReadWrite::from_bits((1 << 30) | 7);
        assert_eq!((rw.nlb_z(), rw.fua(), rw.lr()), (7, true, false));
        assert_eq!(Cdw12ReadWrite::from_bits(0xF << 26).prinfo(), 0xF);
        let wz = Cdw12WriteZeroes::from_bits(1 << 25);
        assert!(wz.deac() && !wz.fua(), "DEAC is bit 25");
        assert_eq!(Cdw10Dsm::from_bits(0xFF).nr_z(), 255);
        assert!(Cdw11Dsm::from_bits(1 << 2).ad(), "AD is bit 2");
        // libnvme's nvme_init_copy: NR 7:0, format 11:8, PRINFOR 15:12,
        // DTYPE 23:20, PRINFOW 29:26, FUA 30, LR 31.
        let copy =
            Cdw12Copy::from_bits(5 | (1 << 8) | (3 << 12) | (2 << 20) | (9 << 26) | (1 << 30));
        assert_eq!((copy.nr_z(), copy.desfmt(), copy.prinfor()), (5, 1, 3));
        assert_eq!((copy.dtype(), copy.prinfow()), (2, 9));
        assert!(copy.fua() && !copy.lr() && !copy.stcw());
    }

    #[test]
    fn format_nvm_joins_the_two_halves_of_lbaf() {
        // LBAFU (13:12) = 2, LBAFL (3:0) = 5, MSET, PI 1, SES 1.
        let f = Cdw10FormatNvm::from_bits((2 << 12) | 5 | (1 << 4) | (1 << 5) | (1 << 9));
        assert_eq!(f.lbaf(), 0x25);
        assert!(f.mset());
        assert_eq!((f.pi(), f.ses(), f.pil()), (1, 1, false));
        assert_eq!(
            Cdw10FormatNvm::new().with_lbaf(0x25).into_bits(),
            (2 << 12) | 5
        );
    }

    #[test]
    fn namespace_commands_select_in_bits_3_to_0() {
        assert_eq!(Cdw10NsManagement::from_bits(0x31).sel(), 1);
        assert_eq!(Cdw10NsAttachment::from_bits(0x10).sel(), 0);
        assert_eq!(Cdw11NsManagement::from_bits(0x0100_0000).csi(), 1);
    }

    #[test]
    fn firmware_commit_fields_sit_where_the_spec_puts_them() {
        // libnvme's nvme_init_fw_commit: FS 2:0, CA 5:3, BPID 31.
        let c = Cdw10FirmwareCommit::from_bits(2 | (3 << 3) | (1 << 31));
        assert_eq!((c.fs(), c.ca(), c.bpid()), (2, 3, true));
        assert_eq!(Cdw10FirmwareCommit::from_bits(0x7 << 3).fs(), 0);
    }

    #[test]
    fn async_event_completion_fields_sit_where_the_spec_puts_them() {
        let e = AsyncEventCompletion::new()
            .with_aet(2)
            .with_aei(0x01)
            .with_lid(0x04);
        assert_eq!(e.into_bits(), 2 | (1 << 8) | (4 << 16));
    }
}
