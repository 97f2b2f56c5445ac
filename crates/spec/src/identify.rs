//! Identify data structures (§5.17.2).

pub mod nvm;
pub mod virtualization;

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Controller or Namespace Structure (CNS) values of Identify (§5.17.1, Figure 273).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cns(pub u8);

impl Cns {
    /// For bitfield structs that hold a CNS value (`#[bits(8)]`).
    pub const fn from_bits(bits: u8) -> Self {
        Self(bits)
    }

    pub const fn into_bits(self) -> u8 {
        self.0
    }

    /// Identify Namespace (NVM command set).
    pub const NAMESPACE: Self = Self(0x00);
    /// Identify Controller.
    pub const CONTROLLER: Self = Self(0x01);
    /// Active Namespace ID list.
    pub const ACTIVE_NAMESPACES: Self = Self(0x02);
    /// Namespace Identification Descriptor list.
    pub const NS_DESCRIPTORS: Self = Self(0x03);
    /// I/O Command Set specific Identify Namespace, for the CSI given.
    pub const NAMESPACE_IOCS: Self = Self(0x05);
    /// I/O Command Set specific Identify Controller, for the CSI given.
    pub const CONTROLLER_IOCS: Self = Self(0x06);
    /// Active Namespace ID list of the namespaces of one I/O command set.
    pub const ACTIVE_NAMESPACES_IOCS: Self = Self(0x07);
    /// I/O Command Set Independent Identify Namespace.
    pub const NS_INDEPENDENT: Self = Self(0x08);
    /// Allocated Namespace ID list.
    pub const ALLOCATED_NAMESPACES: Self = Self(0x10);
    /// Identify Namespace for an allocated NSID.
    pub const ALLOCATED_NAMESPACE: Self = Self(0x11);
    /// Controller list attached to an NSID.
    pub const NS_CONTROLLERS: Self = Self(0x12);
    /// Controller list in the subsystem.
    pub const CONTROLLERS: Self = Self(0x13);
    /// Primary Controller Capabilities (SR-IOV).
    pub const PRIMARY_CONTROLLER_CAPS: Self = Self(0x14);
    /// Secondary Controller list (SR-IOV).
    pub const SECONDARY_CONTROLLERS: Self = Self(0x15);
    /// UUID List (UUIDs for vendor specific information).
    pub const UUID_LIST: Self = Self(0x17);
    /// Domain List.
    pub const DOMAIN_LIST: Self = Self(0x18);
    /// Allocated Namespace ID list of the namespaces of one I/O command set.
    pub const ALLOCATED_NAMESPACES_IOCS: Self = Self(0x1A);
    /// I/O Command Set specific Identify Namespace for an allocated NSID.
    pub const ALLOCATED_NAMESPACE_IOCS: Self = Self(0x1B);
    /// Identify I/O Command Set data structure: the command set combinations.
    pub const IO_COMMAND_SETS: Self = Self(0x1C);
}

/// Command Set Identifier values (Identify CDW11.CSI, §5.17.1).
pub mod csi {
    /// The NVM Command Set.
    pub const NVM: u8 = 0x00;
    /// The Zoned Namespace Command Set.
    pub const ZNS: u8 = 0x02;

    /// The bit of command set `csi` in an I/O Command Set Vector (Identify
    /// CNS 1Ch, §5.17.2): bit 0 NVM, bit 1 Key Value, bit 2 Zoned.
    pub const fn vector_bit(csi: u8) -> u64 {
        1 << (csi & 63)
    }
}

/// Size of every identify data structure.
pub const IDENTIFY_SIZE: usize = 4096;

/// OACS — Optional Admin Command Support bits (§5.17.2.1).
pub mod oacs {
    pub const SECURITY: u16 = 1 << 0;
    pub const FORMAT_NVM: u16 = 1 << 1;
    pub const FIRMWARE: u16 = 1 << 2;
    pub const NS_MANAGEMENT: u16 = 1 << 3;
    pub const SELF_TEST: u16 = 1 << 4;
    pub const DIRECTIVES: u16 = 1 << 5;
    pub const NVME_MI: u16 = 1 << 6;
    pub const VIRTUALIZATION: u16 = 1 << 7;
    /// Doorbell Buffer Config command supported.
    pub const DOORBELL_BUFFER_CONFIG: u16 = 1 << 8;
    pub const GET_LBA_STATUS: u16 = 1 << 9;
}

/// CTRATT — Controller Attributes bits of Identify Controller (§5.17.2.1).
pub mod ctratt {
    /// HIDS: a 128-bit Host Identifier is supported (Host Identifier
    /// feature with EXHID set).
    pub const HOST_ID_128: u32 = 1 << 0;
    /// Endurance Groups: ENDGIDMAX and the namespaces' ENDGID are reported.
    pub const ENDURANCE_GROUPS: u32 = 1 << 4;
    /// ELBAS: the Extended LBA Formats (Identify CNS 05h ELBAF) and the LBA
    /// Format Extension Enable field of Host Behavior Support.
    pub const EXTENDED_LBA_FORMATS: u32 = 1 << 15;
}

/// DPC — End-to-end Data Protection Capabilities of Identify Namespace
/// (NVM Command Set 1.0 §4.1.5.1).
pub mod dpc {
    pub const TYPE1: u8 = 1 << 0;
    pub const TYPE2: u8 = 1 << 1;
    pub const TYPE3: u8 = 1 << 2;
    /// Protection information in the first bytes of metadata.
    pub const FIRST: u8 = 1 << 3;
    /// Protection information in the last bytes of metadata.
    pub const LAST: u8 = 1 << 4;
}

/// DPS — End-to-end Data Protection Type Settings of Identify Namespace:
/// PIT in bits 2:0 (0 none, 1 to 3 the type), PIP in bit 3.
pub mod dps {
    pub const PIT_MASK: u8 = 0x7;
    /// Protection information in the first bytes of metadata (else last).
    pub const FIRST: u8 = 1 << 3;
}

/// Optional Asynchronous Events Supported (OAES) bits of Identify
/// Controller (§5.17.2.1): which notices the controller can send, in the
/// places of the Asynchronous Event Configuration feature's bits.
pub mod oaes {
    /// Namespace Attribute Notices.
    pub const NAMESPACE_ATTRIBUTE: u32 = crate::feature::aec::NAMESPACE_ATTRIBUTE;
    /// Firmware Activation Notices.
    pub const FIRMWARE_ACTIVATION: u32 = crate::feature::aec::FIRMWARE_ACTIVATION;
    /// Zone Descriptor Changed Notices (ZNS 1.1 §4.1.5).
    pub const ZONE_DESCRIPTOR_CHANGED: u32 = crate::feature::aec::ZONE_DESCRIPTOR_CHANGED;
    /// Asymmetric Namespace Access Change Notices.
    pub const ANA_CHANGE: u32 = crate::feature::aec::ANA_CHANGE;
}

/// CMIC — Controller Multi-Path I/O and Namespace Sharing Capabilities of
/// Identify Controller (§5.17.2.1).
pub mod cmic {
    /// The NVM subsystem may have two or more ports.
    pub const MULTI_PORT: u8 = 1 << 0;
    /// The NVM subsystem may have two or more controllers.
    pub const MULTI_CONTROLLER: u8 = 1 << 1;
    /// The controller supports Asymmetric Namespace Access Reporting.
    pub const ANA_REPORTING: u8 = 1 << 3;
}

/// FRMW — Firmware Updates bits of Identify Controller (§5.17.2.1).
pub mod frmw {
    /// Slot 1 is read only.
    pub const SLOT1_READ_ONLY: u8 = 1 << 0;
    /// NOFS (3:1): the number of firmware slots, 1 to 7.
    pub const fn nofs(slots: u8) -> u8 {
        (slots & 0x7) << 1
    }
    /// Firmware activation without a reset (Commit Action 011b).
    pub const ACTIVATION_WITHOUT_RESET: u8 = 1 << 4;
}

/// ONCS — Optional NVM Command Support bits (§5.17.2.1).
pub mod oncs {
    pub const COMPARE: u16 = 1 << 0;
    pub const WRITE_UNCORRECTABLE: u16 = 1 << 1;
    pub const DATASET_MANAGEMENT: u16 = 1 << 2;
    pub const WRITE_ZEROES: u16 = 1 << 3;
    pub const SAVE_SELECT: u16 = 1 << 4;
    pub const RESERVATIONS: u16 = 1 << 5;
    pub const TIMESTAMP: u16 = 1 << 6;
    pub const VERIFY: u16 = 1 << 7;
    pub const COPY: u16 = 1 << 8;
}

/// OCFS — Optional Copy Formats Supported bits (§5.17.2.1): which Copy
/// source range entry formats (CDW12 DESFMT) the controller takes.
pub mod ocfs {
    /// Format 0h: 32-byte entries, SLBA and NLB in this namespace.
    pub const FORMAT_0: u16 = 1 << 0;
}

/// SGLS — SGL Support bits (§5.17.2.1).
pub mod sgls {
    /// Bits 1:0 = 01b: SGLs supported, no address or length alignment.
    pub const SUPPORTED: u32 = 1 << 0;
    pub const BIT_BUCKET: u32 = 1 << 16;
    /// MPTR may hold the address of an SGL segment of exactly one qword
    /// aligned descriptor that describes the metadata (PSDT 10b); Linux's
    /// `NVME_CTRL_SGLS_MSDS`.
    pub const MSDS: u32 = 1 << 19;
}

/// LPA — Log Page Attributes bits of Identify Controller (§5.17.2.1).
pub mod lpa {
    /// Commands Supported and Effects log page.
    pub const COMMANDS_SUPPORTED_AND_EFFECTS: u8 = 1 << 1;
    /// Extended data for Get Log Page (NUMDU, Log Page Offset).
    pub const EXTENDED_DATA: u8 = 1 << 2;
    /// Telemetry Host-Initiated and Controller-Initiated log pages.
    pub const TELEMETRY: u8 = 1 << 3;
    /// Persistent Event Log.
    pub const PERSISTENT_EVENT: u8 = 1 << 4;
}

/// SANICAP — Sanitize Capabilities bits (§5.17.2.1).
pub mod sanicap {
    /// Crypto Erase, Block Erase, Overwrite supported.
    pub const CES: u32 = 1 << 0;
    pub const BES: u32 = 1 << 1;
    pub const OWS: u32 = 1 << 2;
    /// No-Deallocate Inhibited: the controller deallocates anyway.
    pub const NDI: u32 = 1 << 29;
    /// No-Deallocate Modifies Media After Sanitize (31:30) = 01b: media
    /// is not modified further after a sanitize with No-Deallocate.
    pub const NODMMAS_NOT_MODIFIED: u32 = 1 << 30;
}

/// DSTO — Device Self-test Options bits (§5.17.2.1).
pub mod dsto {
    /// Single Device Self-test Operation: one at a time in the NVM
    /// subsystem.
    pub const SDSO: u8 = 1 << 0;
}

/// Identify Controller data structure (CNS 01h, §5.17.2.1, Figure 275).
#[repr(C)]
#[derive(Clone, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct IdentifyController {
    /// PCI Vendor ID.
    pub vid: U16,
    /// PCI Subsystem Vendor ID.
    pub ssvid: U16,
    /// Serial Number, ASCII, space padded.
    pub sn: [u8; 20],
    /// Model Number, ASCII, space padded.
    pub mn: [u8; 40],
    /// Firmware Revision, ASCII, space padded.
    pub fr: [u8; 8],
    /// Recommended Arbitration Burst.
    pub rab: u8,
    pub ieee: [u8; 3],
    pub cmic: u8,
    /// Maximum Data Transfer Size, as a power of two of CAP.MPSMIN pages (0: no limit).
    pub mdts: u8,
    pub cntlid: U16,
    /// Version, as in the VS register.
    pub ver: U32,
    pub rtd3r: U32,
    pub rtd3e: U32,
    /// Optional Asynchronous Events Supported.
    pub oaes: U32,
    pub ctratt: U32,
    pub rrls: U16,
    _rsvd102: [u8; 9],
    pub cntrltype: u8,
    pub fguid: [u8; 16],
    pub crdt: [U16; 3],
    _rsvd134: [u8; 122],
    /// Optional Admin Command Support ([`oacs`]).
    pub oacs: U16,
    /// Abort Command Limit, 0's based.
    pub acl: u8,
    /// Asynchronous Event Request Limit, 0's based.
    pub aerl: u8,
    /// Firmware Updates ([`frmw`]).
    pub frmw: u8,
    /// Log Page Attributes.
    pub lpa: u8,
    /// Error Log Page Entries, 0's based.
    pub elpe: u8,
    pub npss: u8,
    pub avscc: u8,
    pub apsta: u8,
    pub wctemp: U16,
    pub cctemp: U16,
    /// Maximum Time for Firmware Activation, 100 ms units.
    pub mtfa: U16,
    pub hmpre: U32,
    pub hmmin: U32,
    pub tnvmcap: [u8; 16],
    pub unvmcap: [u8; 16],
    pub rpmbs: U32,
    pub edstt: U16,
    pub dsto: u8,
    /// Firmware Update Granularity, 4 KiB units (0: not reported, FFh:
    /// no restriction).
    pub fwug: u8,
    pub kas: U16,
    pub hctma: U16,
    pub mntmt: U16,
    pub mxtmt: U16,
    pub sanicap: U32,
    pub hmminds: U32,
    pub hmmaxd: U16,
    pub nsetidmax: U16,
    pub endgidmax: U16,
    pub anatt: u8,
    pub anacap: u8,
    pub anagrpmax: U32,
    pub nanagrpid: U32,
    pub pels: U32,
    pub domainid: U16,
    _rsvd358: [u8; 10],
    pub megcap: [u8; 16],
    _rsvd384: [u8; 128],
    /// Submission Queue Entry Size: required (3:0) and maximum (7:4), powers of two.
    pub sqes: u8,
    /// Completion Queue Entry Size: required (3:0) and maximum (7:4).
    pub cqes: u8,
    pub maxcmd: U16,
    /// Number of Namespaces: the largest valid NSID.
    pub nn: U32,
    /// Optional NVM Command Support ([`oncs`]).
    pub oncs: U16,
    pub fuses: U16,
    /// Format NVM Attributes.
    pub fna: u8,
    /// Volatile Write Cache: bit 0 present.
    pub vwc: u8,
    pub awun: U16,
    pub awupf: U16,
    pub icsvscc: u8,
    pub nwpc: u8,
    pub acwu: U16,
    /// Optional Copy Formats Supported ([`ocfs`]).
    pub ocfs: U16,
    /// SGL Support (0: SGLs not supported).
    pub sgls: U32,
    /// Maximum Number of Allowed Namespaces.
    pub mnan: U32,
    _rsvd544: [u8; 224],
    /// NVM Subsystem NVMe Qualified Name.
    pub subnqn: [u8; 256],
    _rsvd1024: [u8; 1024],
    /// Power State Descriptors 0 to 31, 32 bytes each.
    pub psd: [[u8; 32]; 32],
    pub vs: [u8; 1024],
}

const _: () = assert!(core::mem::size_of::<IdentifyController>() == IDENTIFY_SIZE);

/// LBA Format data structure (§5.17.2.1 of the NVM Command Set Spec, Figure 98).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct LbaFormat {
    /// Metadata Size in bytes per LBA.
    pub ms: U16,
    /// LBA Data Size, as a power of two (9 = 512 bytes).
    pub lbads: u8,
    /// Relative Performance (1:0).
    pub rp: u8,
}

/// Identify Namespace data structure, NVM command set (CNS 00h; NVM Command
/// Set Spec §4.1.5.1, Figure 97).
#[repr(C)]
#[derive(Clone, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct IdentifyNamespace {
    /// Namespace Size, in logical blocks.
    pub nsze: U64,
    /// Namespace Capacity, in logical blocks.
    pub ncap: U64,
    /// Namespace Utilization, in logical blocks.
    pub nuse: U64,
    /// Namespace Features.
    pub nsfeat: u8,
    /// Number of LBA Formats, 0's based.
    pub nlbaf_z: u8,
    /// Formatted LBA Size: format index (3:0, and 6:5 as bits 5:4), metadata
    /// at end of data (bit 4, extended LBA).
    pub flbas: u8,
    /// Metadata Capabilities.
    pub mc: u8,
    pub dpc: u8,
    pub dps: u8,
    pub nmic: u8,
    pub rescap: u8,
    pub fpi: u8,
    /// Deallocate Logical Block Features: bits 2:0 = 001b reads return zeroes.
    pub dlfeat: u8,
    pub nawun: U16,
    pub nawupf: U16,
    pub nacwu: U16,
    pub nabsn: U16,
    pub nabo: U16,
    pub nabspf: U16,
    pub noiob: U16,
    pub nvmcap: [u8; 16],
    pub npwg: U16,
    pub npwa: U16,
    pub npdg: U16,
    pub npda: U16,
    pub nows: U16,
    /// Maximum Single Source Range Length of a Copy, in logical blocks.
    pub mssrl: U16,
    /// Maximum Copy Length: all source ranges of a Copy, in logical blocks.
    pub mcl: U32,
    /// Maximum Source Range Count of a Copy, 0's based.
    pub msrc_z: u8,
    _rsvd81: [u8; 11],
    pub anagrpid: U32,
    _rsvd96: [u8; 3],
    pub nsattr: u8,
    pub nvmsetid: U16,
    pub endgid: U16,
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
    /// LBA Format 0 to 63.
    pub lbaf: [LbaFormat; 64],
    pub vs: [u8; 3712],
}

const _: () = assert!(core::mem::size_of::<IdentifyNamespace>() == IDENTIFY_SIZE);

impl IdentifyNamespace {
    /// Index of the LBA format in use (FLBAS bits 3:0 and 6:5).
    pub fn format_index(&self) -> usize {
        usize::from((self.flbas & 0xF) | ((self.flbas >> 1) & 0x30))
    }

    /// Whether metadata is transferred at the end of each LBA's data (FLBAS bit 4).
    pub fn extended_lba(&self) -> bool {
        self.flbas & 0x10 != 0
    }

    /// The LBA format in use.
    pub fn current_format(&self) -> LbaFormat {
        self.lbaf
            .get(self.format_index())
            .copied()
            .unwrap_or_default()
    }

    /// Encodes a format index into FLBAS, keeping the extended-LBA bit.
    pub fn set_format_index(&mut self, index: u8, extended: bool) {
        self.flbas = (index & 0xF) | ((index & 0x30) << 1) | if extended { 0x10 } else { 0 };
    }
}

/// I/O Command Set Independent Identify Namespace (CNS 08h, §5.17.2.8).
#[repr(C)]
#[derive(Clone, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct IdentifyNsIndependent {
    pub nsfeat: u8,
    pub nmic: u8,
    pub rescap: u8,
    pub fpi: u8,
    pub anagrpid: U32,
    pub nsattr: u8,
    _rsvd9: u8,
    pub nvmsetid: U16,
    pub endgid: U16,
    /// Namespace Status: bit 0 namespace ready.
    pub nstat: u8,
    _rsvd15: [u8; 4081],
}

const _: () = assert!(core::mem::size_of::<IdentifyNsIndependent>() == IDENTIFY_SIZE);

/// A namespace identification descriptor (CNS 03h, §5.17.2.3): type, length, value.
pub mod ns_descriptor {
    pub const EUI64: u8 = 1;
    pub const NGUID: u8 = 2;
    pub const UUID: u8 = 3;
    pub const CSI: u8 = 4;
}

/// A list of up to 1024 NSIDs or controller ids, zero terminated (CNS 02h, 10h).
pub type IdList = [U32; 1024];

macro_rules! zeroed {
    ($t:ty) => {
        impl $t {
            /// An all-zero structure, boxed (4 KiB does not belong on a guest-driven stack).
            pub fn new_boxed() -> Box<Self> {
                <Self as zerocopy::FromZeros>::new_box_zeroed()
                    .unwrap_or_else(|_| std::process::abort())
            }
        }
    };
}
// For the submodules' structures too.
pub(crate) use zeroed;

zeroed!(IdentifyController);
zeroed!(IdentifyNamespace);
zeroed!(IdentifyNsIndependent);

/// Copies `s` into a space-padded ASCII field, truncating if needed.
pub fn fill_ascii(field: &mut [u8], s: &str) {
    for (i, b) in field.iter_mut().enumerate() {
        *b = s
            .as_bytes()
            .get(i)
            .copied()
            .filter(u8::is_ascii_graphic)
            .unwrap_or(b' ');
    }
}

/// Reads a space-padded ASCII field as a trimmed string.
pub fn ascii_field(field: &[u8]) -> String {
    String::from_utf8_lossy(field)
        .trim_end_matches([' ', '\0'])
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn identify_controller_offsets_match_the_spec() {
        assert_eq!(offset_of!(IdentifyController, sn), 4);
        assert_eq!(offset_of!(IdentifyController, mn), 24);
        assert_eq!(offset_of!(IdentifyController, fr), 64);
        assert_eq!(offset_of!(IdentifyController, mdts), 77);
        assert_eq!(offset_of!(IdentifyController, ver), 80);
        assert_eq!(offset_of!(IdentifyController, oaes), 92);
        assert_eq!(offset_of!(IdentifyController, cntrltype), 111);
        assert_eq!(offset_of!(IdentifyController, oacs), 256);
        assert_eq!(offset_of!(IdentifyController, elpe), 262);
        assert_eq!(offset_of!(IdentifyController, tnvmcap), 280);
        assert_eq!(offset_of!(IdentifyController, megcap), 368);
        assert_eq!(offset_of!(IdentifyController, sqes), 512);
        assert_eq!(offset_of!(IdentifyController, nn), 516);
        assert_eq!(offset_of!(IdentifyController, oncs), 520);
        assert_eq!(offset_of!(IdentifyController, vwc), 525);
        assert_eq!(offset_of!(IdentifyController, ocfs), 534);
        assert_eq!(offset_of!(IdentifyController, sgls), 536);
        assert_eq!(offset_of!(IdentifyController, mnan), 540);
        assert_eq!(offset_of!(IdentifyController, subnqn), 768);
        assert_eq!(offset_of!(IdentifyController, psd), 2048);
        assert_eq!(offset_of!(IdentifyController, vs), 3072);
    }

    #[test]
    fn identify_namespace_offsets_match_the_spec() {
        assert_eq!(offset_of!(IdentifyNamespace, nsfeat), 24);
        assert_eq!(offset_of!(IdentifyNamespace, flbas), 26);
        assert_eq!(offset_of!(IdentifyNamespace, dlfeat), 33);
        assert_eq!(offset_of!(IdentifyNamespace, nvmcap), 48);
        assert_eq!(offset_of!(IdentifyNamespace, mssrl), 74);
        assert_eq!(offset_of!(IdentifyNamespace, mcl), 76);
        assert_eq!(offset_of!(IdentifyNamespace, msrc_z), 80);
        assert_eq!(offset_of!(IdentifyNamespace, anagrpid), 92);
        assert_eq!(offset_of!(IdentifyNamespace, nsattr), 99);
        assert_eq!(offset_of!(IdentifyNamespace, nguid), 104);
        assert_eq!(offset_of!(IdentifyNamespace, eui64), 120);
        assert_eq!(offset_of!(IdentifyNamespace, lbaf), 128);
        assert_eq!(offset_of!(IdentifyNsIndependent, nstat), 14);
    }

    #[test]
    fn flbas_format_index_uses_high_bits() {
        let mut ns = IdentifyNamespace::new_boxed();
        ns.set_format_index(0x13, true);
        assert_eq!(ns.format_index(), 0x13);
        assert!(ns.extended_lba());
        assert_eq!(ns.flbas, 0x03 | 0x10 | 0x20);
    }

    #[test]
    fn ascii_fields_are_space_padded() {
        let mut f = [0u8; 8];
        fill_ascii(&mut f, "1.0");
        assert_eq!(&f, b"1.0     ");
        assert_eq!(ascii_field(&f), "1.0");
    }
}
