//! Wire format of vfio-user messages (QEMU `docs/interop/vfio-user.rst`).
//!
//! All fields are in host byte order, as the specification says for this
//! protocol revision. Structures are `zerocopy` types so a payload is parsed by
//! a bounds-checked read, never a cast of unchecked bytes.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Command numbers (vfio-user.rst "Commands").
pub mod cmd {
    pub const VERSION: u16 = 1;
    pub const DMA_MAP: u16 = 2;
    pub const DMA_UNMAP: u16 = 3;
    pub const DEVICE_GET_INFO: u16 = 4;
    pub const DEVICE_GET_REGION_INFO: u16 = 5;
    pub const DEVICE_GET_REGION_IO_FDS: u16 = 6;
    pub const DEVICE_GET_IRQ_INFO: u16 = 7;
    pub const DEVICE_SET_IRQS: u16 = 8;
    pub const REGION_READ: u16 = 9;
    pub const REGION_WRITE: u16 = 10;
    pub const DMA_READ: u16 = 11;
    pub const DMA_WRITE: u16 = 12;
    pub const DEVICE_RESET: u16 = 13;
}

/// Header flag bits.
pub mod flags {
    /// Type field, bits 0-3.
    pub const TYPE_MASK: u32 = 0xf;
    pub const TYPE_COMMAND: u32 = 0;
    pub const TYPE_REPLY: u32 = 1;
    pub const NO_REPLY: u32 = 1 << 4;
    pub const ERROR: u32 = 1 << 5;
}

/// `VFIO_DEVICE_FLAGS_*` (linux/vfio.h).
pub const VFIO_DEVICE_FLAGS_RESET: u32 = 1 << 0;
pub const VFIO_DEVICE_FLAGS_PCI: u32 = 1 << 1;

/// `VFIO_REGION_INFO_FLAG_*` (linux/vfio.h).
pub const VFIO_REGION_INFO_FLAG_READ: u32 = 1 << 0;
pub const VFIO_REGION_INFO_FLAG_WRITE: u32 = 1 << 1;
pub const VFIO_REGION_INFO_FLAG_MMAP: u32 = 1 << 2;
pub const VFIO_REGION_INFO_FLAG_CAPS: u32 = 1 << 3;
/// `VFIO_REGION_INFO_CAP_SPARSE_MMAP`, version 1.
pub const VFIO_REGION_INFO_CAP_SPARSE_MMAP: u16 = 1;

/// `VFIO_IRQ_INFO_*` (linux/vfio.h).
pub const VFIO_IRQ_INFO_EVENTFD: u32 = 1 << 0;
pub const VFIO_IRQ_INFO_MASKABLE: u32 = 1 << 1;
pub const VFIO_IRQ_INFO_AUTOMASKED: u32 = 1 << 2;
pub const VFIO_IRQ_INFO_NORESIZE: u32 = 1 << 3;

/// `VFIO_IRQ_SET_*` (linux/vfio.h).
pub const VFIO_IRQ_SET_DATA_NONE: u32 = 1 << 0;
pub const VFIO_IRQ_SET_DATA_BOOL: u32 = 1 << 1;
pub const VFIO_IRQ_SET_DATA_EVENTFD: u32 = 1 << 2;
pub const VFIO_IRQ_SET_ACTION_MASK: u32 = 1 << 3;
pub const VFIO_IRQ_SET_ACTION_UNMASK: u32 = 1 << 4;
pub const VFIO_IRQ_SET_ACTION_TRIGGER: u32 = 1 << 5;
pub const VFIO_IRQ_SET_DATA_MASK: u32 =
    VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_DATA_BOOL | VFIO_IRQ_SET_DATA_EVENTFD;
pub const VFIO_IRQ_SET_ACTION_MASK_ALL: u32 =
    VFIO_IRQ_SET_ACTION_MASK | VFIO_IRQ_SET_ACTION_UNMASK | VFIO_IRQ_SET_ACTION_TRIGGER;

/// DMA_MAP flags.
pub const DMA_MAP_FLAG_READ: u32 = 1 << 0;
pub const DMA_MAP_FLAG_WRITE: u32 = 1 << 1;
/// DMA_UNMAP flags: bit 0 asks for a dirty bitmap (unsupported), bit 1
/// (`VFIO_DMA_UNMAP_FLAG_ALL`) unmaps everything.
pub const DMA_UNMAP_FLAG_GET_DIRTY_BITMAP: u32 = 1 << 0;
pub const DMA_UNMAP_FLAG_ALL: u32 = 1 << 1;

/// The 16-byte header that precedes every message.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct Header {
    pub msg_id: u16,
    pub command: u16,
    /// Size of the whole message, header included.
    pub msg_size: u32,
    pub flags: u32,
    pub error: u32,
}

pub const HEADER_SIZE: usize = size_of::<Header>();

impl Header {
    pub fn msg_type(&self) -> u32 {
        self.flags & flags::TYPE_MASK
    }
    pub fn is_reply(&self) -> bool {
        self.msg_type() == flags::TYPE_REPLY
    }
    pub fn no_reply(&self) -> bool {
        self.flags & flags::NO_REPLY != 0
    }
    pub fn is_error(&self) -> bool {
        self.flags & flags::ERROR != 0
    }
}

/// VERSION request and reply, followed by an optional NUL-terminated JSON string.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct Version {
    pub major: u16,
    pub minor: u16,
}

/// DMA_MAP request.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct DmaMap {
    pub argsz: u32,
    pub flags: u32,
    pub offset: u64,
    pub address: u64,
    pub size: u64,
}

/// DMA_UNMAP request and reply.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct DmaUnmap {
    pub argsz: u32,
    pub flags: u32,
    pub address: u64,
    pub size: u64,
}

/// DEVICE_GET_INFO reply (`struct vfio_device_info`).
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct DeviceInfoWire {
    pub argsz: u32,
    pub flags: u32,
    pub num_regions: u32,
    pub num_irqs: u32,
}

/// DEVICE_GET_REGION_INFO request and reply (`struct vfio_region_info`).
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct RegionInfoWire {
    pub argsz: u32,
    pub flags: u32,
    pub index: u32,
    pub cap_offset: u32,
    pub size: u64,
    pub offset: u64,
}

/// `struct vfio_info_cap_header`.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct CapHeader {
    pub id: u16,
    pub version: u16,
    pub next: u32,
}

/// `struct vfio_region_info_cap_sparse_mmap` without its header and areas.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct SparseMmapWire {
    pub nr_areas: u32,
    pub reserved: u32,
}

/// `struct vfio_region_sparse_mmap_area`.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct SparseAreaWire {
    pub offset: u64,
    pub size: u64,
}

/// DEVICE_GET_IRQ_INFO request and reply (`struct vfio_irq_info`).
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct IrqInfoWire {
    pub argsz: u32,
    pub flags: u32,
    pub index: u32,
    pub count: u32,
}

/// DEVICE_SET_IRQS request (`struct vfio_irq_set`), followed by data for DATA_BOOL.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct IrqSet {
    pub argsz: u32,
    pub flags: u32,
    pub index: u32,
    pub start: u32,
    pub count: u32,
}

/// REGION_READ / REGION_WRITE request and reply prefix.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct RegionAccess {
    pub offset: u64,
    pub region: u32,
    pub count: u32,
}

/// DMA_READ / DMA_WRITE request and reply prefix.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct DmaAccess {
    pub address: u64,
    pub count: u64,
}

/// Reads a `T` from the start of `bytes`, or `None` if it is too short.
pub fn read_prefix<T: FromBytes>(bytes: &[u8]) -> Option<T> {
    T::read_from_prefix(bytes).ok().map(|(v, _)| v)
}
