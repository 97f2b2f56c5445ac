//! `vnvme bench --verify`: every write carries a pattern that names what it
//! is, and every read is checked against the last completed write of its
//! block (zeroes if there was none).
//!
//! Each 512-byte sector starts with a header (magic, sector number,
//! generation, thread) followed by filler derived from the header, so a
//! misplaced write (wrong sector), a lost or stale one (wrong generation), a
//! torn one (sectors of different generations) or corrupted data all fail.
//! Each thread owns a stripe of the namespace and never has two commands in
//! flight on one block, so the expected contents are known exactly.

use std::fmt;

/// The unit the pattern repeats in, whatever the namespace's LBA size.
pub const SECTOR: usize = 512;
const MAGIC: u32 = 0x5645_4E56; // "VNEV" little-endian
const HEADER: usize = 24;
/// Sentinel generation: a write to the block failed, its contents are unknown
/// until the next successful write.
const UNKNOWN: u32 = u32::MAX;
/// Mismatches printed per thread; the rest are only counted.
const REPORT_FIRST: u32 = 5;

/// What a read of a block must return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Never written.
    Zeroes,
    /// The pattern of this write.
    Written { gen: u32, thread: u32 },
}

/// A sector header as found on the medium.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub magic: u32,
    pub sector: u64,
    pub gen: u32,
    pub thread: u32,
}

impl Header {
    fn parse(s: &[u8; SECTOR]) -> Self {
        let u32_at = |at: usize| u32::from_le_bytes([s[at], s[at + 1], s[at + 2], s[at + 3]]);
        let mut sector = [0; 8];
        sector.copy_from_slice(&s[4..12]);
        Self {
            magic: u32_at(0),
            sector: u64::from_le_bytes(sector),
            gen: u32_at(12),
            thread: u32_at(16),
        }
    }
}

/// The first sector of a block that did not read back as expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    /// 512-byte sector number in the namespace.
    pub sector: u64,
    pub expected: Expect,
    pub found: Header,
    /// The header was right but the filler after it was not.
    pub header_ok: bool,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sector {}: expected ", self.sector)?;
        match self.expected {
            Expect::Zeroes => write!(f, "zeroes")?,
            Expect::Written { gen, thread } => write!(f, "gen {gen} of thread {thread}")?,
        }
        let h = &self.found;
        write!(
            f,
            ", found magic {:#010x} sector {} gen {} thread {}",
            h.magic, h.sector, h.gen, h.thread
        )?;
        if self.header_ok {
            write!(f, " (header right, data after it wrong)")?;
        }
        Ok(())
    }
}

/// splitmix64: one well-mixed word per input.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Writes the pattern of (`sector`, `gen`, `thread`) into one sector.
fn fill_sector(s: &mut [u8; SECTOR], sector: u64, gen: u32, thread: u32) {
    s[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    s[4..12].copy_from_slice(&sector.to_le_bytes());
    s[12..16].copy_from_slice(&gen.to_le_bytes());
    s[16..20].copy_from_slice(&thread.to_le_bytes());
    s[20..HEADER].fill(0);
    let mut x = mix(sector ^ (u64::from(gen) << 32) ^ u64::from(thread).rotate_left(17));
    for word in s[HEADER..].chunks_exact_mut(8) {
        x = mix(x);
        word.copy_from_slice(&x.to_le_bytes());
    }
}

/// Fills `buf` (whole sectors) with the pattern of a write of generation
/// `gen` by `thread` whose first 512-byte sector is `first_sector`.
pub fn fill(buf: &mut [u8], first_sector: u64, gen: u32, thread: u32) {
    for (i, chunk) in buf.chunks_exact_mut(SECTOR).enumerate() {
        let s: &mut [u8; SECTOR] = chunk.try_into().expect("chunks_exact gives SECTOR bytes");
        fill_sector(s, first_sector + i as u64, gen, thread);
    }
}

/// Checks that `buf` (whole sectors, read from `first_sector`) is what
/// `expect` says; the first bad sector otherwise.
pub fn check(buf: &[u8], first_sector: u64, expect: Expect) -> Result<(), Mismatch> {
    let mut want = [0u8; SECTOR];
    for (i, chunk) in buf.chunks_exact(SECTOR).enumerate() {
        let got: &[u8; SECTOR] = chunk.try_into().expect("chunks_exact gives SECTOR bytes");
        let sector = first_sector + i as u64;
        if let Expect::Written { gen, thread } = expect {
            fill_sector(&mut want, sector, gen, thread);
        }
        if got != &want {
            return Err(Mismatch {
                sector,
                expected: expect,
                found: Header::parse(got),
                header_ok: got[..HEADER] == want[..HEADER],
            });
        }
    }
    Ok(())
}

/// One thread's share of the namespace and what it last wrote there. Kept
/// across the points of a mode, since the namespace keeps its data.
#[derive(Debug)]
pub struct Stripe {
    thread: u32,
    /// First block (in bench blocks, not LBAs) of the stripe.
    pub first_block: u64,
    /// Per block: generation of the last completed write, 0 if never
    /// written, [`UNKNOWN`] after a failed write. 4 bytes per block bounds
    /// the table at 1/1024 of a 4 KiB-block namespace.
    gens: Vec<u32>,
    /// Per block, one bit: a command is in flight. A read racing a write of
    /// the same block, or two writes, would have no single right answer.
    busy: Vec<u64>,
    next_gen: u32,
    reported: u32,
}

impl Stripe {
    pub fn new(thread: u32, first_block: u64, blocks: usize) -> Self {
        Self {
            thread,
            first_block,
            gens: vec![0; blocks],
            busy: vec![0; blocks.div_ceil(64)],
            next_gen: 1,
            reported: 0,
        }
    }

    pub fn blocks(&self) -> u64 {
        self.gens.len() as u64
    }

    /// Whether block `i` of the stripe has a command in flight.
    pub fn is_busy(&self, i: u64) -> bool {
        self.busy[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    fn set_busy(&mut self, i: u64, on: bool) {
        let (word, bit) = ((i / 64) as usize, 1u64 << (i % 64));
        if on {
            self.busy[word] |= bit;
        } else {
            self.busy[word] &= !bit;
        }
    }

    /// Marks block `i` in flight for a read.
    pub fn start_read(&mut self, i: u64) {
        self.set_busy(i, true);
    }

    /// Marks block `i` in flight for a write; the generation to write.
    pub fn start_write(&mut self, i: u64) -> u32 {
        self.set_busy(i, true);
        let gen = self.next_gen;
        // 0 and UNKNOWN are not generations; wrapping needs 4 G writes.
        self.next_gen = match gen.wrapping_add(1) {
            0 | UNKNOWN => 1,
            g => g,
        };
        gen
    }

    /// A write of `gen` to block `i` completed (`ok`: successfully). Only now
    /// does a read have to see it.
    pub fn end_write(&mut self, i: u64, gen: u32, ok: bool) {
        self.set_busy(i, false);
        self.gens[i as usize] = if ok { gen } else { UNKNOWN };
    }

    /// A read of block `i` completed; what it must hold (`None`: unknown
    /// after a failed write).
    pub fn end_read(&mut self, i: u64) -> Option<Expect> {
        self.set_busy(i, false);
        match self.gens[i as usize] {
            0 => Some(Expect::Zeroes),
            UNKNOWN => None,
            gen => Some(Expect::Written {
                gen,
                thread: self.thread,
            }),
        }
    }

    pub fn thread(&self) -> u32 {
        self.thread
    }

    /// Prints the first few mismatches of this thread.
    pub fn report(&mut self, m: &Mismatch) {
        if self.reported < REPORT_FIRST {
            self.reported += 1;
            eprintln!("bench: verify: thread {}: {m}", self.thread);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(first_sector: u64, gen: u32, thread: u32) -> Vec<u8> {
        let mut b = vec![0; 4096];
        fill(&mut b, first_sector, gen, thread);
        b
    }

    fn written(gen: u32, thread: u32) -> Expect {
        Expect::Written { gen, thread }
    }

    #[test]
    fn check_accepts_the_pattern_it_wrote_and_zeroes_when_never_written() {
        assert_eq!(check(&block(80, 7, 2), 80, written(7, 2)), Ok(()));
        assert_eq!(check(&[0; 4096], 80, Expect::Zeroes), Ok(()));
    }

    #[test]
    fn check_detects_a_stale_generation() {
        let err = check(&block(80, 6, 2), 80, written(7, 2)).unwrap_err();
        assert_eq!((err.sector, err.found.gen, err.header_ok), (80, 6, false));
    }

    #[test]
    fn check_detects_data_from_another_lba() {
        let err = check(&block(88, 7, 2), 80, written(7, 2)).unwrap_err();
        assert_eq!((err.sector, err.found.sector), (80, 88));
    }

    #[test]
    fn check_detects_another_threads_data() {
        let err = check(&block(80, 7, 1), 80, written(7, 2)).unwrap_err();
        assert_eq!(err.found.thread, 1);
    }

    #[test]
    fn check_detects_a_torn_write() {
        // Sectors 0-3 from the new write, 4-7 left from the old one.
        let mut b = block(80, 8, 2);
        b[2048..].copy_from_slice(&block(80, 7, 2)[2048..]);
        let err = check(&b, 80, written(8, 2)).unwrap_err();
        assert_eq!((err.sector, err.found.gen), (84, 7));
    }

    #[test]
    fn check_detects_a_flipped_byte_after_a_good_header() {
        let mut b = block(80, 7, 2);
        b[3 * SECTOR + 300] ^= 1;
        let err = check(&b, 80, written(7, 2)).unwrap_err();
        assert_eq!((err.sector, err.header_ok), (83, true));
        assert!(err.to_string().contains("data after it wrong"), "{err}");
    }

    #[test]
    fn check_detects_data_where_zeroes_were_expected() {
        let err = check(&block(80, 1, 0), 80, Expect::Zeroes).unwrap_err();
        assert_eq!(err.found.magic, MAGIC);
    }

    #[test]
    fn stripe_expects_a_write_only_once_it_completes() {
        let mut s = Stripe::new(3, 0, 100);
        let gen = s.start_write(5);
        assert!(s.is_busy(5));
        s.end_write(5, gen, true);
        assert!(!s.is_busy(5));
        s.start_read(5);
        assert_eq!(s.end_read(5), Some(written(gen, 3)));
        let gen2 = s.start_write(5);
        assert_ne!(gen2, gen);
        s.end_write(5, gen2, false);
        s.start_read(5);
        assert_eq!(
            s.end_read(5),
            None,
            "a failed write leaves the block unknown"
        );
        s.start_read(6);
        assert_eq!(s.end_read(6), Some(Expect::Zeroes));
    }
}
