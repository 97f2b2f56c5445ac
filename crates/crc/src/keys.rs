//! Folding keys: powers of x modulo a CRC's polynomial, worked out at
//! compile time with carry-less arithmetic. The method is the folding of
//! Intel's "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ
//! Instruction" (2009), with our own derivation of the keys below.
//!
//! A 128-bit block A = H·x^64 + L that lies D bits before another is moved
//! onto it by A·x^D ≡ H·(x^(D+64) mod P) + L·(x^D mod P): two 64×64-bit
//! carry-less products whose sum is congruent to A·x^D modulo P. Only that
//! congruence matters; the sum need not be reduced.

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
        Kernel {
            algorithm,
            width,
            init,
            xorout,
            reflected,
            keys,
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
