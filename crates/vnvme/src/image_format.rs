//! The sector size a disk image was made for, read from its first sectors,
//! so a `file` (or `nbd`) namespace over an existing image gets the LBA
//! format its partition table is written in.
//!
//! Disk images (every cloud image) are made for 512-byte sectors; a
//! partition table's offsets count those sectors, so the same image served
//! with 4096-byte LBAs shows no partitions and firmware cannot boot it.
//! What is read:
//!
//! * a GPT header ("EFI PART", UEFI 2.10 §5.3.2) in LBA 1: at byte 512 the
//!   image was made for 512-byte sectors, at byte 4096 for 4096-byte ones;
//! * else an MBR (UEFI 2.10 §5.2.1: signature 55AAh at byte 510 and a
//!   partition table whose entries are plausible): 512 (MBR is a 512-byte
//!   sector format);
//! * anything else (a new, empty or zeroed file, or data with no partition
//!   table, such as a namespace a guest wrote raw): the default format, so
//!   a file vnvme created keeps its format across restarts.

use vnvme_blockdev::{BlockDevice, BlockError};
use vnvme_controller::{format_index_for, DEFAULT_FORMAT_INDEX};

/// Bytes read from the start of an image: LBA 1 of a 4096-byte disk, whole.
pub const HEAD_BYTES: usize = 4096 + 512;

const GPT_SIGNATURE: &[u8; 8] = b"EFI PART";
/// MBR: the partition table's offset, its four 16-byte entries, the
/// boot signature's offset (UEFI 2.10 Table 5.1 "Legacy MBR").
const MBR_TABLE: usize = 446;
const MBR_ENTRY: usize = 16;
const MBR_SIGNATURE_AT: usize = 510;

/// What an image's first sectors show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageLayout {
    /// A GPT header at byte 512: 512-byte sectors.
    GptAt512,
    /// A GPT header at byte 4096 (and none at 512): 4096-byte sectors.
    GptAt4096,
    /// An MBR partition table, no GPT: 512-byte sectors.
    Mbr,
    /// Nothing but zeroes (a new, empty or zeroed file).
    Blank,
    /// Data, but no partition table.
    Unrecognised,
}

impl ImageLayout {
    /// Reads the layout from an image's first bytes (fewer than
    /// [`HEAD_BYTES`] if the image is shorter; any length is accepted).
    pub fn of(head: &[u8]) -> Self {
        let gpt_at = |at: usize| head.get(at..at + GPT_SIGNATURE.len()) == Some(GPT_SIGNATURE);
        if gpt_at(512) {
            Self::GptAt512
        } else if gpt_at(4096) {
            Self::GptAt4096
        } else if is_mbr(head) {
            Self::Mbr
        } else if head.iter().all(|&b| b == 0) {
            Self::Blank
        } else {
            Self::Unrecognised
        }
    }

    /// The sector size the image was made for; `None` when it does not say.
    pub fn sector_size(self) -> Option<u32> {
        match self {
            Self::GptAt512 | Self::Mbr => Some(512),
            Self::GptAt4096 => Some(4096),
            Self::Blank | Self::Unrecognised => None,
        }
    }

    /// Why the format was chosen, for the log.
    pub fn describe(self) -> &'static str {
        match self {
            Self::GptAt512 => "a GPT header at byte 512 (512-byte sectors)",
            Self::GptAt4096 => "a GPT header at byte 4096 (4096-byte sectors)",
            Self::Mbr => "an MBR partition table (512-byte sectors)",
            Self::Blank => "no data in its first sectors (a new or empty image)",
            Self::Unrecognised => "no partition table",
        }
    }

    /// The LBA format to serve the image in: its sector size without
    /// metadata, or [`DEFAULT_FORMAT_INDEX`] when it does not say.
    pub fn format_index(self) -> u8 {
        self.sector_size()
            .and_then(format_index_for)
            .unwrap_or(DEFAULT_FORMAT_INDEX)
    }
}

/// The signature, and four entries each of which is empty or has a boot
/// indicator of 00h or 80h, a type, a start and a size; at least one is
/// used. Random data (a namespace a guest filled) has the signature once in
/// 65536 blocks, and with it entries like these about once in 10^9 more; a
/// bare boot sector or a FAT file system without a table is not taken.
fn is_mbr(head: &[u8]) -> bool {
    if head.get(MBR_SIGNATURE_AT..MBR_SIGNATURE_AT + 2) != Some(&[0x55, 0xAA]) {
        return false;
    }
    let Some(table) = head.get(MBR_TABLE..MBR_SIGNATURE_AT) else {
        return false;
    };
    let mut used = 0;
    for entry in table.chunks_exact(MBR_ENTRY) {
        if entry.iter().all(|&b| b == 0) {
            continue;
        }
        let le32 = |at: usize| {
            entry
                .get(at..at + 4)
                .and_then(|b| b.try_into().ok())
                .map_or(0, u32::from_le_bytes)
        };
        // Boot indicator, OS type, StartingLBA (LBA 0 is the MBR itself),
        // SizeInLBA.
        let plausible = matches!(entry.first(), Some(0x00 | 0x80))
            && entry.get(4).is_some_and(|&t| t != 0)
            && le32(8) != 0
            && le32(12) != 0;
        if !plausible {
            return false;
        }
        used += 1;
    }
    used > 0
}

/// Reads the first [`HEAD_BYTES`] of `device` (all of it if it is smaller)
/// and tells its layout.
pub fn detect(device: &dyn BlockDevice) -> Result<ImageLayout, BlockError> {
    let len = usize::try_from(device.size()).map_or(HEAD_BYTES, |s| s.min(HEAD_BYTES));
    let mut head = vec![0u8; len];
    device.read(0, &mut head)?;
    Ok(ImageLayout::of(&head))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vnvme_blockdev::RamDevice;

    fn gpt_at(at: usize) -> Vec<u8> {
        let mut head = vec![0u8; 1 << 20];
        // The protective MBR both layouts carry: one entry of type EEh.
        head[MBR_TABLE + 4] = 0xEE;
        head[MBR_TABLE + 8] = 1;
        head[MBR_TABLE + 12..MBR_TABLE + 16].copy_from_slice(&u32::MAX.to_le_bytes());
        head[MBR_SIGNATURE_AT..MBR_SIGNATURE_AT + 2].copy_from_slice(&[0x55, 0xAA]);
        head[at..at + 8].copy_from_slice(GPT_SIGNATURE);
        head
    }

    fn mbr() -> Vec<u8> {
        let mut head = vec![0u8; 1 << 20];
        head[..3].copy_from_slice(&[0xEB, 0x63, 0x90]); // boot code
        let e = MBR_TABLE;
        head[e] = 0x80;
        head[e + 4] = 0x83; // Linux
        head[e + 8..e + 12].copy_from_slice(&2048u32.to_le_bytes());
        head[e + 12..e + 16].copy_from_slice(&4096u32.to_le_bytes());
        head[MBR_SIGNATURE_AT..MBR_SIGNATURE_AT + 2].copy_from_slice(&[0x55, 0xAA]);
        head
    }

    fn device(bytes: &[u8]) -> RamDevice {
        let dev = RamDevice::new(bytes.len() as u64);
        dev.write(0, bytes).unwrap();
        dev
    }

    #[test]
    fn a_gpt_at_byte_512_means_512_byte_sectors() {
        let layout = detect(&device(&gpt_at(512))).unwrap();
        assert_eq!(layout, ImageLayout::GptAt512);
        assert_eq!(layout.format_index(), 0, "512 + 0");
    }

    #[test]
    fn a_gpt_at_byte_4096_means_4096_byte_sectors() {
        let layout = detect(&device(&gpt_at(4096))).unwrap();
        assert_eq!(layout, ImageLayout::GptAt4096);
        assert_eq!(layout.format_index(), DEFAULT_FORMAT_INDEX);
        assert_eq!(layout.sector_size(), Some(4096));
    }

    #[test]
    fn an_mbr_alone_means_512_byte_sectors() {
        let layout = detect(&device(&mbr())).unwrap();
        assert_eq!(layout, ImageLayout::Mbr);
        assert_eq!(layout.format_index(), 0);
    }

    #[test]
    fn an_image_without_a_partition_table_keeps_the_default() {
        // What a guest leaves in a namespace it wrote raw (fio's buffers).
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let data: Vec<u8> = (0..1 << 16)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let layout = detect(&device(&data)).unwrap();
        assert_eq!(layout, ImageLayout::Unrecognised);
        assert_eq!(layout.format_index(), DEFAULT_FORMAT_INDEX);
        // A boot sector without a table (55AA, code where entries would be).
        let mut boot = vec![0x90u8; 4096];
        boot[MBR_SIGNATURE_AT..MBR_SIGNATURE_AT + 2].copy_from_slice(&[0x55, 0xAA]);
        assert_eq!(ImageLayout::of(&boot), ImageLayout::Unrecognised);
        // The signature with four empty entries.
        let mut empty = vec![0u8; 4096];
        empty[MBR_SIGNATURE_AT..MBR_SIGNATURE_AT + 2].copy_from_slice(&[0x55, 0xAA]);
        assert_eq!(ImageLayout::of(&empty), ImageLayout::Unrecognised);
    }

    #[test]
    fn a_new_or_empty_image_keeps_the_default() {
        let layout = detect(&RamDevice::new(1 << 20)).unwrap();
        assert_eq!(layout, ImageLayout::Blank);
        assert_eq!(layout.format_index(), DEFAULT_FORMAT_INDEX);
        assert_eq!(ImageLayout::of(&[]), ImageLayout::Blank);
        assert_eq!(detect(&RamDevice::new(0)).unwrap(), ImageLayout::Blank);
    }

    #[test]
    fn short_and_odd_sized_heads_are_read_without_panic() {
        let gpt = gpt_at(512);
        for len in [
            0, 1, 446, 447, 511, 512, 513, 519, 520, 4095, 4097, 4103, 4104,
        ] {
            let head = &gpt[..len];
            let layout = ImageLayout::of(head);
            let want = if len >= 520 {
                ImageLayout::GptAt512
            } else if len >= 512 {
                ImageLayout::Mbr
            } else if head.iter().all(|&b| b == 0) {
                ImageLayout::Blank
            } else {
                ImageLayout::Unrecognised
            };
            assert_eq!(layout, want, "GPT image cut at {len} bytes");
        }
        let gpt = gpt_at(4096);
        assert_eq!(
            ImageLayout::of(&gpt[..4103]),
            ImageLayout::Mbr,
            "signature cut"
        );
        assert_eq!(ImageLayout::of(&gpt[..4104]), ImageLayout::GptAt4096);
        // An entry whose boot indicator is neither 00h nor 80h: not a table.
        let mut bad = mbr();
        bad[MBR_TABLE] = 0x7F;
        assert_eq!(ImageLayout::of(&bad), ImageLayout::Unrecognised);
        // A device smaller than HEAD_BYTES is read whole.
        let small = device(&gpt_at(512)[..1024]);
        assert_eq!(detect(&small).unwrap(), ImageLayout::GptAt512);
    }
}
