//! The folding kernel on x86-64: eight 256-bit registers of two 16-byte
//! blocks each fold 256 bytes a round with VPCLMULQDQ, are folded into one
//! 16-byte block, and the whole 16-byte blocks after the last round are
//! folded into it with PCLMULQDQ. What comes out is a block whose
//! polynomial is congruent modulo P to the bytes folded (the CRC register
//! at the start XORed in), so the CRC of that block followed by the bytes
//! left over, from a register of zero, is the CRC of the whole.

use std::arch::x86_64::{
    __m128i, __m256i, _mm256_castsi256_si128, _mm256_clmulepi64_epi128, _mm256_extracti128_si256,
    _mm256_loadu_si256, _mm256_set_epi64x, _mm256_shuffle_epi8, _mm256_xor_si256,
    _mm_clmulepi64_si128, _mm_loadu_si128, _mm_prefetch, _mm_set_epi64x, _mm_shuffle_epi8,
    _mm_storeu_si128, _mm_xor_si128, _MM_HINT_T0,
};

use crate::keys::Kernel;

/// Bytes a round folds: eight registers of 32 bytes.
pub(crate) const ROUND: usize = 256;

/// Folds `first` and the whole 16-byte blocks of `rest`, with `register`
/// (the CRC register before them, without xorout) XORed into the start as
/// the CRC would take it, into one 16-byte block in message order. Returns
/// the block and the bytes of `rest` left over (fewer than 16).
///
/// After each round `folded` gets how many bytes of the message (`first`
/// then `rest`) are folded so far: a copy of the message can follow the
/// fold a round behind, from bytes the fold just brought into the cache.
///
/// Needs AVX2, PCLMULQDQ and VPCLMULQDQ: calling it is unsafe, and sound
/// only once they are detected.
#[target_feature(enable = "avx2,pclmulqdq,vpclmulqdq")]
pub(crate) fn fold<'a>(
    kernel: &Kernel,
    register: u64,
    first: &[u8; ROUND],
    rest: &'a [u8],
    mut folded: impl FnMut(usize),
) -> ([u8; 16], &'a [u8]) {
    let order = Order::new(kernel.reflected);
    let [k2048, k1024, k512, k256, k128] = kernel.keys;

    let (firsts, _) = first.as_chunks::<32>();
    let mut acc = [_mm256_set_epi64x(0, 0, 0, 0); 8];
    for (a, chunk) in acc.iter_mut().zip(firsts) {
        *a = order.load256(chunk);
    }
    // The register enters where the CRC would XOR it into the message: the
    // first bytes, least significant first when reflected (bits 0.. of the
    // first block), most significant first when not (bits 127.. once the
    // block's bytes are reversed).
    let (lo, hi) = if kernel.reflected {
        (register, 0)
    } else {
        (0, register << (64 - kernel.width))
    };
    acc[0] = _mm256_xor_si256(acc[0], _mm256_set_epi64x(0, 0, hi as i64, lo as i64));
    folded(ROUND);

    let (rounds, rest) = rest.as_chunks::<ROUND>();
    let k = keys256(k2048);
    for (i, round) in rounds.iter().enumerate() {
        let (chunks, _) = round.as_chunks::<32>();
        for (a, chunk) in acc.iter_mut().zip(chunks) {
            *a = fold256(*a, k, order.load256(chunk));
        }
        folded((i + 2) * ROUND);
    }

    // Eight registers into one: each pair lies 128, 64, then 32 bytes apart.
    let k = keys256(k1024);
    for i in 0..4 {
        acc[i + 4] = fold256(acc[i], k, acc[i + 4]);
    }
    let k = keys256(k512);
    for i in 4..6 {
        acc[i + 2] = fold256(acc[i], k, acc[i + 2]);
    }
    acc[7] = fold256(acc[6], keys256(k256), acc[7]);

    let k = keys128(k128);
    let mut block = fold128(
        _mm256_castsi256_si128(acc[7]),
        k,
        _mm256_extracti128_si256::<1>(acc[7]),
    );
    let (blocks, tail) = rest.as_chunks::<16>();
    for b in blocks {
        block = fold128(block, k, order.load128(b));
    }
    (order.store128(block), tail)
}

/// How 16 bytes of the message map onto a 128-bit register: as they are
/// when reflected (bit i is x^(127-i)), reversed when not (bit i is x^i).
#[derive(Debug, Clone, Copy)]
struct Order {
    reflected: bool,
    reverse128: __m128i,
    reverse256: __m256i,
}

impl Order {
    #[target_feature(enable = "avx2")]
    fn new(reflected: bool) -> Self {
        // Byte indices 15..0 in each 128-bit lane.
        const LO: i64 = 0x0809_0A0B_0C0D_0E0F;
        const HI: i64 = 0x0001_0203_0405_0607;
        Order {
            reflected,
            reverse128: _mm_set_epi64x(HI, LO),
            reverse256: _mm256_set_epi64x(HI, LO, HI, LO),
        }
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn load256(self, bytes: &[u8; 32]) -> __m256i {
        // SAFETY: `bytes` is 32 readable bytes, and an unaligned load asks
        // for no alignment.
        let v = unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) };
        if self.reflected {
            v
        } else {
            _mm256_shuffle_epi8(v, self.reverse256)
        }
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn load128(self, bytes: &[u8; 16]) -> __m128i {
        // SAFETY: `bytes` is 16 readable bytes, and an unaligned load asks
        // for no alignment.
        let v = unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) };
        if self.reflected {
            v
        } else {
            _mm_shuffle_epi8(v, self.reverse128)
        }
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn store128(self, v: __m128i) -> [u8; 16] {
        let v = if self.reflected {
            v
        } else {
            _mm_shuffle_epi8(v, self.reverse128)
        };
        let mut out = [0u8; 16];
        // SAFETY: `out` is 16 writable bytes, and an unaligned store asks
        // for no alignment.
        unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), v) };
        out
    }
}

#[inline]
#[target_feature(enable = "avx2")]
fn keys256([lo, hi]: [u64; 2]) -> __m256i {
    _mm256_set_epi64x(hi as i64, lo as i64, hi as i64, lo as i64)
}

#[inline]
#[target_feature(enable = "avx2")]
fn keys128([lo, hi]: [u64; 2]) -> __m128i {
    _mm_set_epi64x(hi as i64, lo as i64)
}

/// `acc` moved on by the keys' distance, plus `next`, in each 128-bit lane.
#[inline]
#[target_feature(enable = "avx2,vpclmulqdq")]
fn fold256(acc: __m256i, keys: __m256i, next: __m256i) -> __m256i {
    let lo = _mm256_clmulepi64_epi128::<0x00>(acc, keys);
    let hi = _mm256_clmulepi64_epi128::<0x11>(acc, keys);
    _mm256_xor_si256(_mm256_xor_si256(lo, next), hi)
}

/// `acc` moved on by the keys' distance, plus `next`.
#[inline]
#[target_feature(enable = "avx2,pclmulqdq")]
fn fold128(acc: __m128i, keys: __m128i, next: __m128i) -> __m128i {
    let lo = _mm_clmulepi64_si128::<0x00>(acc, keys);
    let hi = _mm_clmulepi64_si128::<0x11>(acc, keys);
    _mm_xor_si128(_mm_xor_si128(lo, next), hi)
}

/// Asks for `bytes` in the first-level cache, a line at a time, without
/// waiting for them: the loads of a fold then find the lines on their way
/// while it computes, instead of waiting on memory one round after another.
pub(crate) fn prefetch(bytes: &[u8]) {
    for line in bytes.chunks(64) {
        // SAFETY: a prefetch reads nothing and never faults, whatever the
        // address; this one is of bytes we may read anyway.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
    }
}
