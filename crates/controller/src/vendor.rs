//! Vendor specific commands (NVMe Base 2.0 §5, Figure 138 and NVM Command
//! Set §3, Figure 17: opcodes C0h to FFh): the extension point.
//!
//! A handler implements [`VendorCommand`] and is registered for an admin or
//! an I/O opcode in [`VendorCommands`], which lives in
//! [`ControllerConfig::vendor`](crate::ControllerConfig::vendor). Registered
//! opcodes are reported in the Commands Supported and Effects log page with
//! the effects the handler declares; an unregistered vendor opcode completes
//! with Invalid Command Opcode. A handler sees the command and a
//! [`VendorContext`] through which it reaches the host buffer (PRPs) and the
//! namespaces; it returns completion dword 0 or an NVMe status.
//!
//! Like every other command, a vendor opcode states its data direction in
//! bits 1:0 (00b none, 01b host to controller, 10b controller to host), and
//! the driver's passthrough refuses a buffer that contradicts them. The two
//! built-in examples follow that rule, which is why their opcodes are what
//! they are:
//!
//! * admin C2h **vendor info** (10b, controller to host): CDW10 is NUMD, the
//!   number of dwords to return, 0's based, like Get Log Page. Returns a
//!   64-byte [`VendorInfo`] (zero-padded past its end, truncated before).
//! * I/O C0h **checksum LBA range** (00b, no data): NSID, SLBA in CDW10-11,
//!   NLB (0's based) in CDW12 15:0. Completion dword 0 is the CRC32C
//!   (Castagnoli, reflected, initial value and final XOR FFFFFFFFh, as in
//!   iSCSI and ext4 metadata) of the range's data, read on the controller
//!   side: no data crosses to the host. At most
//!   [`MAX_CHECKSUM_BYTES`] per command (Invalid Field beyond), so one
//!   command cannot hold a queue worker for long.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use vnvme_spec::cdw::Cdw12ReadWrite;
use vnvme_spec::log::effects;
use vnvme_spec::status::invalid_field;
use vnvme_spec::{Command, Status};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{Immutable, IntoBytes, KnownLayout};

/// Admin opcode of the built-in "vendor info" command.
pub const VENDOR_INFO: u8 = 0xC2;
/// I/O opcode of the built-in "checksum LBA range" command.
pub const CHECKSUM_LBA_RANGE: u8 = 0xC0;
/// Largest range one checksum command may cover.
pub const MAX_CHECKSUM_BYTES: u64 = 16 << 20;

/// The command set an opcode belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CommandSet {
    Admin,
    Io,
}

/// A handler of one vendor specific opcode.
pub trait VendorCommand: Send + Sync {
    /// A short name, for logs and `Debug`.
    fn name(&self) -> &'static str;

    /// Commands Supported and Effects bits (§5.16.1.6) reported for the
    /// opcode: CSUPP plus, for a command that changes data, LBCC.
    fn effects(&self) -> u32 {
        effects::CSUPP
    }

    /// Executes `cmd`; `Ok` is completion dword 0. The command is as the
    /// host sent it: every field is untrusted.
    fn execute(&self, cx: &mut VendorContext<'_, '_>, cmd: &Command) -> Result<u32, Status>;
}

/// A vendor opcode outside C0h..=FFh.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("opcode {0:#04x} is not vendor specific (C0h to FFh)")]
pub struct NotVendorSpecific(pub u8);

/// The vendor commands a controller accepts, by command set and opcode.
#[derive(Clone, Default)]
pub struct VendorCommands {
    handlers: BTreeMap<(CommandSet, u8), Arc<dyn VendorCommand>>,
}

impl fmt::Debug for VendorCommands {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(
                self.handlers
                    .iter()
                    .map(|((set, op), h)| (format!("{set:?} {op:#04x}"), h.name())),
            )
            .finish()
    }
}

impl VendorCommands {
    /// No vendor command at all.
    pub fn none() -> Self {
        Self::default()
    }

    /// The built-in examples: admin [`VENDOR_INFO`], I/O [`CHECKSUM_LBA_RANGE`].
    pub fn builtin() -> Self {
        let mut v = Self::none();
        v.handlers.insert(
            (CommandSet::Admin, VENDOR_INFO),
            Arc::new(VendorInfoCommand),
        );
        v.handlers.insert(
            (CommandSet::Io, CHECKSUM_LBA_RANGE),
            Arc::new(ChecksumCommand),
        );
        v
    }

    /// Registers `handler` for `opcode` of `set`, replacing any earlier one.
    pub fn register(
        &mut self,
        set: CommandSet,
        opcode: u8,
        handler: Arc<dyn VendorCommand>,
    ) -> Result<(), NotVendorSpecific> {
        if opcode < 0xC0 {
            return Err(NotVendorSpecific(opcode));
        }
        self.handlers.insert((set, opcode), handler);
        Ok(())
    }

    /// The handler of `opcode` in `set`, if registered.
    pub fn get(&self, set: CommandSet, opcode: u8) -> Option<&Arc<dyn VendorCommand>> {
        self.handlers.get(&(set, opcode))
    }

    /// Opcodes registered, both sets.
    pub fn len(&self) -> usize {
        self.handlers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.handlers.is_empty()
    }

    /// Registered opcodes of `set` with their effects bits.
    pub fn effects(&self, set: CommandSet) -> impl Iterator<Item = (u8, u32)> + '_ {
        self.handlers
            .iter()
            .filter(move |((s, _), _)| *s == set)
            .map(|((_, op), h)| (*op, h.effects() | effects::CSUPP))
    }
}

/// What a vendor handler may reach: the command's data buffer and the
/// namespaces. Wraps the worker's context without exposing it.
pub struct VendorContext<'a, 'b> {
    host: &'a mut (dyn VendorHost + 'b),
}

impl fmt::Debug for VendorContext<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VendorContext").finish_non_exhaustive()
    }
}

/// What the command layer gives a vendor handler (behind
/// [`VendorContext`], so handlers see methods, not the worker's state).
pub(crate) trait VendorHost {
    fn send(&mut self, cmd: &Command, data: &[u8]) -> Result<(), Status>;
    fn receive(&mut self, cmd: &Command, len: usize) -> Result<Vec<u8>, Status>;
    fn namespace(&self, nsid: u32) -> Result<NamespaceGeometry, Status>;
    fn read_blocks(&mut self, nsid: u32, slba: u64, out: &mut [u8]) -> Result<(), Status>;
    /// The controller as [`VENDOR_INFO`] reports it.
    fn vendor_info(&self) -> VendorInfo;
    /// MDTS in bytes.
    fn max_transfer(&self) -> u64;
    /// A worker buffer to reuse (given back with `put_buffer`).
    fn take_buffer(&mut self) -> Vec<u8>;
    fn put_buffer(&mut self, buf: Vec<u8>);
}

/// A namespace as a vendor handler sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceGeometry {
    pub lba_size: u32,
    /// Size in logical blocks (NSZE).
    pub nsze: u64,
}

impl<'a, 'b> VendorContext<'a, 'b> {
    pub(crate) fn new(host: &'a mut (dyn VendorHost + 'b)) -> Self {
        Self { host }
    }

    /// Copies `data` to the host buffer the command's PRPs describe
    /// (controller to host; at most MDTS).
    pub fn send(&mut self, cmd: &Command, data: &[u8]) -> Result<(), Status> {
        self.host.send(cmd, data)
    }

    /// Copies `len` bytes from the host buffer the command's PRPs describe
    /// (host to controller; at most MDTS).
    pub fn receive(&mut self, cmd: &Command, len: usize) -> Result<Vec<u8>, Status> {
        self.host.receive(cmd, len)
    }

    /// Active namespace `nsid`, or Invalid Namespace or Format.
    pub fn namespace(&self, nsid: u32) -> Result<NamespaceGeometry, Status> {
        self.host.namespace(nsid)
    }

    /// Reads whole blocks from `slba` of namespace `nsid` into `out`
    /// (its length a multiple of the LBA size), or LBA Out of Range, or
    /// Unrecovered Read Error (a block marked by Write Uncorrectable).
    pub fn read_blocks(&mut self, nsid: u32, slba: u64, out: &mut [u8]) -> Result<(), Status> {
        self.host.read_blocks(nsid, slba, out)
    }
}

/// The data of [`VENDOR_INFO`]: 64 bytes, little endian.
#[repr(C)]
#[derive(Debug, Clone, Copy, IntoBytes, Immutable, KnownLayout)]
pub struct VendorInfo {
    /// "VNVMEVND".
    pub magic: [u8; 8],
    /// Layout version of this structure: 1.
    pub version: U32,
    /// Active namespaces.
    pub namespaces: U32,
    pub max_io_queues: U16,
    pub mdts: u8,
    /// Vendor opcodes registered (admin + I/O).
    pub vendor_commands: u8,
    pub host_read_commands: U64,
    pub host_write_commands: U64,
    /// Firmware revision, ASCII, space padded.
    pub firmware: [u8; 8],
    /// Serial number, ASCII, space padded.
    pub serial: [u8; 20],
}

const _: () = assert!(core::mem::size_of::<VendorInfo>() == 64);

impl VendorInfo {
    pub const MAGIC: [u8; 8] = *b"VNVMEVND";
    pub const SIZE: usize = 64;
}

struct VendorInfoCommand;

impl VendorCommand for VendorInfoCommand {
    fn name(&self) -> &'static str {
        "vendor-info"
    }

    fn execute(&self, cx: &mut VendorContext<'_, '_>, cmd: &Command) -> Result<u32, Status> {
        let info = cx.host.vendor_info();
        // NUMD, 0's based dwords: what the host buffer holds.
        let len = (u64::from(cmd.cdw10.get()) + 1) * 4;
        if len > cx.host.max_transfer() {
            return Err(invalid_field());
        }
        let mut data = info.as_bytes().to_vec();
        data.resize(len as usize, 0);
        cx.send(cmd, &data)?;
        Ok(0)
    }
}

struct ChecksumCommand;

impl VendorCommand for ChecksumCommand {
    fn name(&self) -> &'static str {
        "checksum-lba-range"
    }

    fn execute(&self, cx: &mut VendorContext<'_, '_>, cmd: &Command) -> Result<u32, Status> {
        const CHUNK: u64 = 128 << 10;
        let nsid = cmd.nsid.get();
        let geometry = cx.namespace(nsid)?;
        // SLBA and NLB where a Read has them.
        let slba = cmd.slba();
        let nlb = u64::from(Cdw12ReadWrite::from(cmd.cdw12).nlb_z()) + 1;
        let lba_size = u64::from(geometry.lba_size);
        if nlb * lba_size > MAX_CHECKSUM_BYTES {
            return Err(invalid_field());
        }
        match slba.checked_add(nlb) {
            Some(end) if end <= geometry.nsze => {}
            _ => return Err(Status::LBA_OUT_OF_RANGE.with_dnr(true)),
        }
        let per_chunk = (CHUNK / lba_size).max(1);
        let mut buf = cx.host.take_buffer();
        let mut crc = Crc32c::new();
        let mut lba = slba;
        let mut left = nlb;
        let result = loop {
            if left == 0 {
                break Ok(crc.finish());
            }
            let n = left.min(per_chunk);
            buf.resize((n * lba_size) as usize, 0);
            if let Err(s) = cx.read_blocks(nsid, lba, &mut buf) {
                break Err(s);
            }
            crc.update(&buf);
            lba += n;
            left -= n;
        };
        cx.host.put_buffer(buf);
        result
    }
}

/// CRC32C (Castagnoli, polynomial 82F63B78h reflected).
#[derive(Debug, Clone, Copy)]
pub struct Crc32c(u32);

const CRC32C_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0x82F6_3B78 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

impl Default for Crc32c {
    fn default() -> Self {
        Self::new()
    }
}

impl Crc32c {
    pub fn new() -> Self {
        Self(!0)
    }

    pub fn update(&mut self, data: &[u8]) {
        let mut c = self.0;
        for &b in data {
            c = CRC32C_TABLE[usize::from((c as u8) ^ b)] ^ (c >> 8);
        }
        self.0 = c;
    }

    pub fn finish(self) -> u32 {
        !self.0
    }

    /// The CRC32C of `data` in one call.
    pub fn checksum(data: &[u8]) -> u32 {
        let mut c = Self::new();
        c.update(data);
        c.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_check_value() {
        // The catalogue's check value for CRC-32/ISCSI.
        assert_eq!(Crc32c::checksum(b"123456789"), 0xE306_9283);
        let mut split = Crc32c::new();
        split.update(b"1234");
        split.update(b"56789");
        assert_eq!(split.finish(), 0xE306_9283);
        assert_eq!(Crc32c::checksum(&[]), 0);
    }

    #[test]
    fn register_refuses_opcodes_below_c0h() {
        let mut v = VendorCommands::none();
        assert_eq!(
            v.register(CommandSet::Io, 0x80, Arc::new(ChecksumCommand)),
            Err(NotVendorSpecific(0x80))
        );
        v.register(CommandSet::Io, 0xFF, Arc::new(ChecksumCommand))
            .unwrap();
        assert!(v.get(CommandSet::Io, 0xFF).is_some());
        assert!(v.get(CommandSet::Admin, 0xFF).is_none());
    }

    #[test]
    fn builtin_opcodes_follow_the_data_transfer_bits() {
        let v = VendorCommands::builtin();
        let admin: Vec<_> = v.effects(CommandSet::Admin).collect();
        let io: Vec<_> = v.effects(CommandSet::Io).collect();
        assert_eq!(admin, [(VENDOR_INFO, effects::CSUPP)]);
        assert_eq!(io, [(CHECKSUM_LBA_RANGE, effects::CSUPP)]);
        assert_eq!(VENDOR_INFO & 3, 0b10, "vendor info: controller to host");
        assert_eq!(CHECKSUM_LBA_RANGE & 3, 0b00, "checksum: no data");
    }
}
