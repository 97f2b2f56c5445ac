//! Folding keys: powers of x modulo a CRC's polynomial, worked out at
//! compile time with carry-less arithmetic. The method is the folding of
//! Intel's "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ
//! Instruction" (2009), with our own derivation of the keys below.
//!
//! A 128-bit block A = H·x^64 + L that lies D bits before another is moved
//! onto it by A·x^D ≡ H·(x^(D+64) mod P) + L·(x^D mod P): two 64×64-bit
//! carry-less products whose sum is congruent to A·x^D modulo P. Only that
//! congruence matters; the sum need not be reduced.
//!
//! The final reduction (`reduce`) takes the 128-bit block V a fold leaves
//! to the register V·x^w mod P, w the CRC's width, in the manner of the
//! paper's Barrett reduction. It works modulo P' = P·x^(64-w), of degree 64
//! whatever w is: V·x^64 mod P' = (V·x^w mod P)·x^(64-w), the register in
//! the top w bits of 64. With V = H·x^64 + L:
//!
//! 1. S = H·(x^128 mod P') + L·x^64 ≡ V·x^64, of degree below 128.
//! 2. q = ⌊S/P'⌋ = ⌊Sh·µ/x^64⌋, Sh = ⌊S/x^64⌋ and µ = ⌊x^128/P'⌋ (Barrett).
//!    Over GF(2) this is exact, not an estimate: Sh·x^128 = Sh·µ·P' + Sh·r,
//!    r = x^128 mod P', and Sh·r/P' has degree below 64, so it cannot reach
//!    the bits the division by x^64 keeps.
//! 3. S + q·P' is S mod P', of degree below 64: only the low quadwords of S
//!    and of q·P' count, and q·x^64 has none, so it is Sl + lo(q·(P' - x^64)).

use crc_fast::CrcAlgorithm;

/// One CRC as the folding kernel sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Kernel {
    /// The crc-fast algorithm that handles short inputs and finishes folds.
    pub algorithm: CrcAlgorithm,
    /// Bits of the CRC register.
    pub width: u32,
    /// The register before the first byte.
    pub init: u64,
    /// XORed into the register after the last byte.
    pub xorout: u64,
    /// Input and output bit-reflected (least significant bit first).
    pub reflected: bool,
    /// Keys moving a block on by 2048, 1024, 512, 256 and 128 bits, as
    /// `[for the low quadword, for the high quadword]` of a register.
    pub keys: [[u64; 2]; 5],
    /// Keys moving a block on by 8, 16, .., 120 bits, past a tail of 1 to
    /// 15 bytes, as [`Kernel::keys`] are laid out.
    pub tail_keys: [[u64; 2]; 15],
    /// The constants of the final reduction.
    pub barrett: Barrett,
}

/// The constants of the final reduction, as a register holds them: bit i
/// is x^i when not reflected; reflected (a 64-bit CRC), bit i is x^(63-i)
/// and each constant is shifted to cancel the x that a carry-less product
/// of reflected values gains (see [`fold_key`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Barrett {
    /// Step 1's key for H: x^128 mod P', or reflected x^127 mod P, which
    /// the product's extra x makes x^128.
    pub fold: u64,
    /// µ = ⌊x^128/P'⌋ without its x^64 term (step 2); reflected, ⌊µ/x⌋,
    /// the product's extra x taking it back to µ but for µ's constant
    /// term, whose part of Sh·µ lies below x^64 and does not count.
    pub mu: u64,
    /// P' without its x^64 term (step 3); reflected, ⌊P/x⌋ without x^63,
    /// the product's extra x taking it back to P but for P's constant
    /// term, whose part of q·P (q itself) the reduction adds on its own.
    pub poly: u64,
}

/// Distances, in bits, that the kernel folds over, in the order of
/// [`Kernel::keys`].
pub(crate) const DISTANCES: [u32; 5] = [2048, 1024, 512, 256, 128];

/// CRC-16 T10-DIF: P = x^16 + 0x8BB7, not reflected, init 0, xorout 0.
pub(crate) const CRC16_T10DIF: Kernel =
    Kernel::new(CrcAlgorithm::Crc16T10Dif, 16, 0x8BB7, false, [0, 0]);

/// CRC-64 NVMe: P = x^64 + 0xAD93D23594C93659 (Rocksoft), reflected, init
/// and xorout all ones.
pub(crate) const CRC64_NVME: Kernel = Kernel::new(
    CrcAlgorithm::Crc64Nvme,
    64,
    0xAD93_D235_94C9_3659,
    true,
    [u64::MAX, u64::MAX],
);

impl Kernel {
    const fn new(
        algorithm: CrcAlgorithm,
        width: u32,
        poly: u64,
        reflected: bool,
        [init, xorout]: [u64; 2],
    ) -> Self {
        let mut keys = [[0; 2]; 5];
        let mut i = 0;
        while i < DISTANCES.len() {
            keys[i] = fold_key(width, poly, reflected, DISTANCES[i]);
            i += 1;
        }
        let mut tail_keys = [[0; 2]; 15];
        let mut i = 0;
        while i < tail_keys.len() {
            tail_keys[i] = fold_key(width, poly, reflected, 8 * (i as u32 + 1));
            i += 1;
        }
        Kernel {
            algorithm,
            width,
            init,
            xorout,
            reflected,
            keys,
            tail_keys,
            barrett: barrett(width, poly, reflected),
        }
    }
}

/// x^k mod P, P = x^width + `poly` (`poly` without its top term), with bit
/// i the coefficient of x^i.
pub(crate) const fn x_pow_mod(k: u32, width: u32, poly: u64) -> u64 {
    let top = 1u64 << (width - 1);
    let mask = u64::MAX >> (64 - width);
    let mut r = 1u64;
    let mut i = 0;
    while i < k {
        let carry = r & top != 0;
        r = (r << 1) & mask;
        if carry {
            r ^= poly;
        }
        i += 1;
    }
    r
}

/// ⌊x^k/P⌋, P = x^width + `poly`, with bit i the coefficient of x^i: the
/// quotient of the long division whose remainder is [`x_pow_mod`]. Each
/// power is x times the one before, and where that reaches x^width, P goes
/// into it once more: the quotient, shifted up, gains its constant term.
pub(crate) const fn x_pow_div(k: u32, width: u32, poly: u64) -> u128 {
    assert!(k < width + 128, "the quotient must fit 128 bits");
    let top = 1u64 << (width - 1);
    let mask = u64::MAX >> (64 - width);
    let mut r = 1u64;
    let mut q = 0u128;
    let mut i = 0;
    while i < k {
        let carry = r & top != 0;
        r = (r << 1) & mask;
        q <<= 1;
        if carry {
            r ^= poly;
            q |= 1;
        }
        i += 1;
    }
    q
}

/// The pair of keys that moves a 128-bit block `distance` bits on.
///
/// Not reflected, a register holds the block as it reads (bit i is x^i,
/// once the bytes are reversed): the low quadword is L, the high one H, so
/// the keys are x^D and x^(D+64). Reflected, bit i is x^(127-i): the low
/// quadword is H reflected, the high one L reflected, and the carry-less
/// product of two reflected 64-bit values is the reflected 128-bit product
/// times x (clmul(a', b') = (a·b·x)'), which the keys take back by one
/// power: x^(D+63) and x^(D-1), each reflected.
const fn fold_key(width: u32, poly: u64, reflected: bool, distance: u32) -> [u64; 2] {
    if reflected {
        [
            x_pow_mod(distance + 63, width, poly).reverse_bits(),
            x_pow_mod(distance - 1, width, poly).reverse_bits(),
        ]
    } else {
        [
            x_pow_mod(distance, width, poly),
            x_pow_mod(distance + 64, width, poly),
        ]
    }
}

/// The constants of the final reduction for P = x^width + `poly`.
///
/// Not reflected, they are those of P' = P·x^(64-width) = x^64 + `poly`
/// shifted up. Reflected, only a 64-bit CRC, where P' is P: the reflected
/// reduction leans on P's constant term (every CRC has one), which P'
/// loses when shifted.
const fn barrett(width: u32, poly: u64, reflected: bool) -> Barrett {
    if reflected {
        assert!(width == 64 && poly & 1 == 1, "reflected: a 64-bit CRC");
        Barrett {
            fold: x_pow_mod(127, 64, poly).reverse_bits(),
            mu: ((x_pow_div(128, 64, poly) >> 1) as u64).reverse_bits(),
            poly: (poly >> 1).reverse_bits(),
        }
    } else {
        let poly = poly << (64 - width);
        Barrett {
            fold: x_pow_mod(128, 64, poly),
            // µ has degree 128 - 64: its x^64 term is cut off here.
            mu: x_pow_div(128, 64, poly) as u64,
            poly,
        }
    }
}
