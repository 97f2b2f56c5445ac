//! CRC-16 T10-DIF and CRC-64 NVMe, the guards of NVMe protection
//! information, folded with 256-bit carry-less multiplication (AVX2 +
//! VPCLMULQDQ) where the CPU has it.
//!
//! `crc-fast` 1.10 folds with VPCLMULQDQ only on cores with AVX-512VL; on a
//! core with VPCLMULQDQ but no AVX-512 (AMD Zen 3, Intel Alder Lake and
//! later client cores) it takes its 128-bit PCLMULQDQ path. This crate folds
//! 256 bytes a round in eight 256-bit registers instead: half the carry-less
//! multiplications per byte, and on that core a 256-bit one issues as often
//! as a 128-bit one. It leaves the rest to `crc-fast`: inputs shorter
//! than a round and CPUs without the features. What a fold leaves, a
//! 16-byte block congruent to everything folded and the tail after it (0
//! to 15 bytes), it finishes itself (`reduce`): the tail folded in, then
//! 128 bits reduced to 64 and, by Barrett's method, to the register.
//!
//! Measured on the development machine's AMD EPYC (AVX2 and VPCLMULQDQ, no
//! AVX-512, 2.45 GHz), ns per call with
//! `cargo run --release -p vnvme-crc --example throughput`, the least of
//! twenty runs (the machine is shared; medians came out 0-6% slower, single
//! runs up to 40%):
//!
//! | bytes | CRC-16 T10-DIF: `crc-fast` | this crate | CRC-64 NVMe: `crc-fast` | this crate |
//! |---|---|---|---|---|
//! | 512 | 87 | 29 (3.0x) | 76 | 28 (2.7x) |
//! | 520 | 74 | 31 (2.4x) | 62 | 30 (2.1x) |
//! | 4096 | 375 | 167 (2.2x) | 353 | 167 (2.1x) |
//! | 4104 | 362 | 170 (2.1x) | 340 | 168 (2.0x) |
//! | 4160 | 376 | 175 (2.1x) | 353 | 171 (2.1x) |
//! | 65536 | 5306 | 2559 (2.1x) | 5145 | 2550 (2.0x) |
//!
//! The fold itself is twice as fast (64 KiB: a 256-bit carry-less multiply
//! issues as often as a 128-bit one); on shorter inputs the fixed costs
//! decide the rest. Finishing a fold with `crc-fast` (a CRC of the 16 to 31
//! bytes it leaves) cost about 15 ns a call more than our own reduction:
//! with it, in twenty runs alternating with the ones above, 512 bytes took
//! 44 and 47 ns (CRC-16, CRC-64), 4096 bytes 182 and 185, 4104 bytes 184
//! and 187 (the least of twenty again; medians 45-192); 64 KiB did not
//! move.
//!
//! Unsafe lives only in the folding kernel (`fold`), in its loads and
//! stores, and in the calls into it and into the final reduction
//! (`reduce`, which needs none of its own) once the CPU features are
//! detected.

mod keys;

#[cfg(target_arch = "x86_64")]
mod fold;

#[cfg(target_arch = "x86_64")]
mod reduce;

#[cfg(test)]
mod tests;

use keys::{Kernel, CRC16_T10DIF, CRC64_NVME};

/// CRC-16 T10-DIF of `bytes` (poly 0x8BB7, not reflected, init 0, xorout
/// 0): the 16-bit guard of NVMe protection information.
pub fn crc16_t10dif(bytes: &[u8]) -> u16 {
    let mut crc = Crc16T10Dif::new();
    crc.update(bytes);
    crc.finalize()
}

/// CRC-64 NVMe of `bytes` (poly 0xAD93D23594C93659, reflected, init and
/// xorout all ones): the 64-bit guard of NVMe protection information.
pub fn crc64_nvme(bytes: &[u8]) -> u64 {
    let mut crc = Crc64Nvme::new();
    crc.update(bytes);
    crc.finalize()
}

/// CRC-16 T10-DIF over bytes that come in parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crc16T10Dif {
    register: u16,
}

impl Crc16T10Dif {
    /// The CRC of no bytes yet.
    pub const fn new() -> Self {
        Crc16T10Dif {
            register: CRC16_T10DIF.init as u16,
        }
    }

    /// Takes `bytes` as the next part of the message.
    pub fn update(&mut self, bytes: &[u8]) {
        self.register = update_register(&CRC16_T10DIF, self.register.into(), bytes, true) as u16;
    }

    /// Copies `bytes` to `dst`, which must be as long (it panics otherwise,
    /// as `copy_from_slice` does), and takes them as the next part of the
    /// message, reading them once: from memory, the fold costs little
    /// more than the copy alone.
    pub fn update_copy(&mut self, bytes: &[u8], dst: &mut [u8]) {
        self.register =
            update_register_copy(&CRC16_T10DIF, self.register.into(), bytes, Some(dst), true)
                as u16;
    }

    /// The CRC of the parts so far.
    pub fn finalize(&self) -> u16 {
        self.register ^ CRC16_T10DIF.xorout as u16
    }
}

impl Default for Crc16T10Dif {
    fn default() -> Self {
        Self::new()
    }
}

/// CRC-64 NVMe over bytes that come in parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crc64Nvme {
    register: u64,
}

impl Crc64Nvme {
    /// The CRC of no bytes yet.
    pub const fn new() -> Self {
        Crc64Nvme {
            register: CRC64_NVME.init,
        }
    }

    /// Takes `bytes` as the next part of the message.
    pub fn update(&mut self, bytes: &[u8]) {
        self.register = update_register(&CRC64_NVME, self.register, bytes, true);
    }

    /// Copies `bytes` to `dst`, which must be as long (it panics otherwise,
    /// as `copy_from_slice` does), and takes them as the next part of the
    /// message, reading them once: from memory, the fold costs little
    /// more than the copy alone.
    pub fn update_copy(&mut self, bytes: &[u8], dst: &mut [u8]) {
        self.register = update_register_copy(&CRC64_NVME, self.register, bytes, Some(dst), true);
    }

    /// The CRC of the parts so far.
    pub fn finalize(&self) -> u64 {
        self.register ^ CRC64_NVME.xorout
    }
}

impl Default for Crc64Nvme {
    fn default() -> Self {
        Self::new()
    }
}

/// How far ahead of the fold `update_copy` prefetches.
#[cfg(target_arch = "x86_64")]
const AHEAD: usize = 4096;

/// The longest input that `crc_fast_register` copies to XOR a register
/// into: a part too short to fold.
const SHORT: usize = 256;

/// The CRC register (before xorout) after `bytes`, from `register`. With
/// `simd` false, `crc-fast` does all of it, which tests use to check the
/// fold on any machine.
fn update_register(kernel: &Kernel, register: u64, bytes: &[u8], simd: bool) -> u64 {
    update_register_copy(kernel, register, bytes, None, simd)
}

/// [`update_register`], copying `bytes` to `copy_to` (as long) on the way.
fn update_register_copy(
    kernel: &Kernel,
    register: u64,
    bytes: &[u8],
    mut copy_to: Option<&mut [u8]>,
    simd: bool,
) -> u64 {
    if let Some(dst) = &copy_to {
        assert_eq!(dst.len(), bytes.len(), "a copy as long as the bytes");
    }
    if simd {
        if let Some(register) = fold_and_finish(kernel, register, bytes, copy_to.as_deref_mut()) {
            return register;
        }
    }
    if let Some(dst) = copy_to {
        dst.copy_from_slice(bytes);
    }
    crc_fast_register(kernel, register, bytes)
}

/// Folds `bytes` with the SIMD kernel and finishes the block out of the
/// fold and the tail with a reduction of our own. The register is linear
/// in the message and the block already carries `register` and everything
/// before the tail, so the rest is a CRC from a register of zero. `None`
/// where the CPU lacks the features or `bytes` is shorter than a round
/// (then nothing is copied).
///
/// With `copy_to` (as long as `bytes`), each round is copied there once it
/// is folded, from the cache: `bytes`, likely cold, are read from memory
/// once, prefetched [`AHEAD`] bytes ahead of the fold so that its
/// arithmetic runs while memory delivers the next lines. (With a copy of
/// 4 KiB from memory, then a fold of it, the fold added 240-300 ns to the
/// copy's 700-800 ns on the development machine; folded and copied this way,
/// 160-210 ns.)
#[cfg(target_arch = "x86_64")]
fn fold_and_finish(
    kernel: &Kernel,
    register: u64,
    bytes: &[u8],
    mut copy_to: Option<&mut [u8]>,
) -> Option<u64> {
    if !simd_available() {
        return None;
    }
    let (first, rest) = bytes.split_first_chunk::<{ fold::ROUND }>()?;
    let mut copied = 0;
    if copy_to.is_some() {
        fold::prefetch(&bytes[..AHEAD.min(bytes.len())]);
    }
    let mut copy = |upto: usize| {
        if let Some(dst) = copy_to.as_deref_mut() {
            dst[copied..upto].copy_from_slice(&bytes[copied..upto]);
            let ahead = (upto + AHEAD).min(bytes.len());
            fold::prefetch(&bytes[(copied + AHEAD).min(ahead)..ahead]);
            copied = upto;
        }
    };
    // SAFETY: simd_available() saw AVX2, PCLMULQDQ and VPCLMULQDQ, the
    // features `fold` is compiled for.
    let (block, tail) = unsafe { fold::fold(kernel, register, first, rest, &mut copy) };
    copy(bytes.len());
    // SAFETY: the same features cover AVX2 and PCLMULQDQ, those `reduce`
    // is compiled for.
    Some(unsafe { reduce::reduce(kernel, &block, tail) })
}

#[cfg(not(target_arch = "x86_64"))]
fn fold_and_finish(_: &Kernel, _: u64, _: &[u8], _: Option<&mut [u8]>) -> Option<u64> {
    None
}

/// Whether this CPU runs the folding kernel, detected once.
#[cfg(target_arch = "x86_64")]
fn simd_available() -> bool {
    static DETECTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DETECTED.get_or_init(|| {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("pclmulqdq")
            && is_x86_feature_detected!("vpclmulqdq")
    })
}

#[cfg(not(target_arch = "x86_64"))]
fn simd_available() -> bool {
    false
}

/// `crc-fast` from `register` over `bytes`. Its one-shot `checksum` starts
/// from init, and costs about half of what a `Digest` started from another
/// register does on a short input (18 against 45 ns for 16 bytes), so
/// another register is XORed into a copy of a short input instead, which
/// the CRC takes the same way.
fn crc_fast_register(kernel: &Kernel, register: u64, bytes: &[u8]) -> u64 {
    if register == kernel.init {
        return checksum_from_init(kernel, bytes);
    }
    let mut copy = [0u8; SHORT];
    if bytes.len() >= kernel.width as usize / 8 {
        if let Some(copy) = copy.get_mut(..bytes.len()) {
            copy.copy_from_slice(bytes);
            xor_register(kernel, register ^ kernel.init, copy);
            return checksum_from_init(kernel, copy);
        }
    }
    // crc-fast's state is the register before xorout for both CRCs (init
    // 0 for CRC-16 T10-DIF; the all-ones init of CRC-64 NVMe reads the same
    // reflected).
    let mut digest = crc_fast::Digest::new_with_init_state(kernel.algorithm, register);
    digest.update(bytes);
    digest.get_state()
}

/// The register after `bytes` from init, by `crc-fast`.
fn checksum_from_init(kernel: &Kernel, bytes: &[u8]) -> u64 {
    crc_fast::checksum(kernel.algorithm, bytes) ^ kernel.xorout
}

/// XORs `value` into the start of `bytes` where the CRC takes its register
/// in: least significant byte first when reflected, most significant first
/// when not.
fn xor_register(kernel: &Kernel, value: u64, bytes: &mut [u8]) {
    let value = if kernel.reflected {
        value.to_le_bytes()
    } else {
        (value << (64 - kernel.width)).to_be_bytes()
    };
    let width = kernel.width as usize / 8;
    for (byte, v) in bytes.iter_mut().zip(&value[..width]) {
        *byte ^= v;
    }
}
