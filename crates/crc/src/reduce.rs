//! The final reduction on x86-64: the 16-byte block a fold leaves and the
//! bytes after it (fewer than 16) into the CRC register, with PCLMULQDQ.
//! The tail is taken in by moving the block on past it (a fold by 8 bits a
//! byte, keys from `keys`), then the 128-bit sum goes from 128 to 64 bits
//! and by Barrett's method to the register; `keys` gives the steps and why
//! they are exact.
//!
//! How a register holds 128 bits is the folding kernel's (`fold`): bit i is
//! x^i when not reflected (the bytes reversed), x^(127-i) when reflected
//! (the bytes as they are), and a carry-less product of reflected values
//! comes out reflected and times x, which the reflected keys take back.

use std::arch::x86_64::{
    __m128i, _mm_clmulepi64_si128, _mm_cvtsi128_si64, _mm_cvtsi64_si128, _mm_extract_epi64,
    _mm_set_epi64x, _mm_slli_si128, _mm_srli_si128, _mm_xor_si128,
};

use crate::keys::Kernel;

/// The CRC register (before xorout) after `block` then `tail`, from a
/// register of zero: what `fold` leaves, finished. `tail` is shorter than
/// 16 bytes.
///
/// Needs the features `fold` needs (AVX2 implies the SSE4.1 this uses) and
/// PCLMULQDQ: calling it is unsafe, and sound only once they are detected.
#[target_feature(enable = "avx2,pclmulqdq")]
pub(crate) fn reduce(kernel: &Kernel, block: &[u8; 16], tail: &[u8]) -> u64 {
    // One branch on the bit order, so each side is compiled for its own.
    if kernel.reflected {
        barrett_reflected(kernel, with_tail::<true>(kernel, block, tail))
    } else {
        barrett(kernel, with_tail::<false>(kernel, block, tail))
    }
}

/// `block` followed by `tail` as one 128-bit value congruent to them: the
/// block moved on by the tail's bits, plus the tail as a block of its own
/// (zeroes before it add nothing).
#[inline]
#[target_feature(enable = "avx2,pclmulqdq")]
fn with_tail<const REFLECTED: bool>(kernel: &Kernel, block: &[u8; 16], tail: &[u8]) -> __m128i {
    let block = register::<REFLECTED>(u128::from_le_bytes(*block));
    let Some(keys) = tail.len().checked_sub(1).map(|i| kernel.tail_keys[i]) else {
        return block;
    };
    let keys = _mm_set_epi64x(keys[1] as i64, keys[0] as i64);
    let lo = _mm_clmulepi64_si128::<0x00>(block, keys);
    let hi = _mm_clmulepi64_si128::<0x11>(block, keys);
    _mm_xor_si128(_mm_xor_si128(lo, hi), register::<REFLECTED>(padded(tail)))
}

/// 16 bytes in message order, read little-endian into `bytes`, as a
/// register holds them: as they are when reflected, reversed when not.
#[inline]
#[target_feature(enable = "avx2")]
fn register<const REFLECTED: bool>(bytes: u128) -> __m128i {
    let bytes = if REFLECTED { bytes } else { bytes.swap_bytes() };
    _mm_set_epi64x((bytes >> 64) as i64, bytes as i64)
}

/// `tail` (1 to 15 bytes) at the end of 16 bytes that are otherwise zero,
/// read little-endian: tail byte i is byte 16 - len + i. Read in place, the
/// first and the last 8, 4 or 1 bytes, overlapping where they meet, rather
/// than copied into a buffer of 16: that costs a call to memcpy and a load
/// that the narrower stores before it cannot forward to. (The throughput
/// example does not tell the two apart: there the next call hides the
/// wait.)
#[inline]
fn padded(tail: &[u8]) -> u128 {
    let len = tail.len();
    debug_assert!((1..16).contains(&len));
    // Bytes 8..16 of the 16, and what starts before them.
    let (lo, hi) = if let (Some(first), Some(last)) = (tail.first_chunk(), tail.last_chunk()) {
        // 8..15 bytes: the first 8 start at 16 - len, in the low half but
        // for what the last 8 cover; shifted in two steps, so that all 64
        // bits go out when len is 8.
        let first = u64::from_le_bytes(*first) << (8 * (15 - len)) << 8;
        (first, u64::from_le_bytes(*last))
    } else if let (Some(first), Some(last)) = (tail.first_chunk(), tail.last_chunk()) {
        // 4..7 bytes, all in the high half: the last 4 end it.
        let first = u64::from(u32::from_le_bytes(*first)) << (8 * (8 - len));
        (0, first | u64::from(u32::from_le_bytes(*last)) << 32)
    } else {
        // 1..3 bytes: the middle one is the second of 2 or 3.
        let byte = |i: usize| u64::from(tail[i]) << (8 * (8 - len + i));
        (0, byte(0) | byte(len / 2) | byte(len - 1))
    };
    u128::from(hi) << 64 | u128::from(lo)
}

/// A constant in the low quadword, where the products below take it.
#[inline]
#[target_feature(enable = "avx2")]
fn constant(c: u64) -> __m128i {
    _mm_cvtsi64_si128(c as i64)
}

/// V·x^w mod P, not reflected: bit i of `v` is x^i, so the low quadword is
/// L and the high one H. Works modulo P' = P·x^(64-w), whose remainder
/// holds the register in its top w bits.
#[inline]
#[target_feature(enable = "avx2,pclmulqdq")]
fn barrett(kernel: &Kernel, v: __m128i) -> u64 {
    let c = kernel.barrett;
    // 1. S = H·(x^128 mod P') + L·x^64: low quadword Sl, high Sh.
    let s = _mm_xor_si128(
        _mm_clmulepi64_si128::<0x01>(v, constant(c.fold)),
        _mm_slli_si128::<8>(v),
    );
    // 2. q = ⌊Sh·µ/x^64⌋ = Sh + the high quadword of Sh·(µ - x^64), in the
    //    high quadword.
    let q = _mm_xor_si128(s, _mm_clmulepi64_si128::<0x01>(s, constant(c.mu)));
    // 3. Sl + the low quadword of q·(P' - x^64).
    let r = _mm_xor_si128(s, _mm_clmulepi64_si128::<0x01>(q, constant(c.poly)));
    (_mm_cvtsi128_si64(r) as u64) >> (64 - kernel.width)
}

/// V·x^64 mod P, reflected (a 64-bit CRC): bit i of `v` is x^(127-i), so
/// the low quadword is H reflected and the high one L reflected, and what
/// comes out is the register reflected, as the CRC keeps it.
#[inline]
#[target_feature(enable = "avx2,pclmulqdq")]
fn barrett_reflected(kernel: &Kernel, v: __m128i) -> u64 {
    let c = kernel.barrett;
    // 1. S = H·(x^127 mod P)·x + L·x^64: low quadword Sh, high Sl.
    let s = _mm_xor_si128(
        _mm_clmulepi64_si128::<0x00>(v, constant(c.fold)),
        _mm_srli_si128::<8>(v),
    );
    // 2. q = ⌊Sh·µ/x^64⌋ = ⌊Sh·⌊µ/x⌋·x/x^64⌋ (µ's constant term adds to
    //    bits below x^64 only), in the low quadword.
    let q = _mm_clmulepi64_si128::<0x00>(s, constant(c.mu));
    // 3. Sl + the low quadword of q·P, P = (x^63 + ⌊poly/x⌋)·x + 1: q·x^64
    //    lies above it, q·⌊poly/x⌋·x is the product, and q is added as it
    //    is; in the high quadword.
    let qp = _mm_xor_si128(
        _mm_clmulepi64_si128::<0x00>(q, constant(c.poly)),
        _mm_slli_si128::<8>(q),
    );
    _mm_extract_epi64::<1>(_mm_xor_si128(s, qp)) as u64
}
