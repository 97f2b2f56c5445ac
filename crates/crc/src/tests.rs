use crc_fast::CrcAlgorithm;

use super::*;
use crate::keys::{x_pow_div, x_pow_mod, DISTANCES};

/// Numbers that look random, the same on every run (xorshift64).
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| (self.next() >> 24) as u8).collect()
    }
}

fn noise(len: usize, seed: u64) -> Vec<u8> {
    Noise(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1).bytes(len)
}

/// Both guards of `bytes` by this crate, by its forced fallback, and by
/// `crc-fast` alone, which must all agree.
fn assert_matches_crc_fast(bytes: &[u8]) {
    let want16 = crc_fast::checksum(CrcAlgorithm::Crc16T10Dif, bytes) as u16;
    let want64 = crc_fast::checksum(CrcAlgorithm::Crc64Nvme, bytes);
    let len = bytes.len();
    assert_eq!(crc16_t10dif(bytes), want16, "CRC-16, {len} bytes");
    assert_eq!(crc64_nvme(bytes), want64, "CRC-64, {len} bytes");
    assert_eq!(
        update_register(&CRC16_T10DIF, 0, bytes, false) as u16,
        want16,
        "CRC-16 fallback, {len} bytes"
    );
    assert_eq!(
        update_register(&CRC64_NVME, u64::MAX, bytes, false) ^ u64::MAX,
        want64,
        "CRC-64 fallback, {len} bytes"
    );
}

#[test]
fn check_values_match_the_catalogue() {
    assert_eq!(crc16_t10dif(b"123456789"), 0xD0DB);
    assert_eq!(crc64_nvme(b"123456789"), 0xAE8B_1486_0A79_9888);
    // The same message repeated past a round, so the fold runs.
    let long = b"123456789".repeat(100);
    assert_matches_crc_fast(&long);
}

#[test]
fn every_length_to_1100_at_every_offset_to_64_matches_crc_fast() {
    let data = noise(1100 + 64, 1);
    for len in 0..=1100 {
        for offset in 0..64 {
            assert_matches_crc_fast(&data[offset..offset + len]);
        }
    }
}

#[test]
fn block_sizes_at_every_offset_to_64_match_crc_fast() {
    let data = noise(65536 + 64, 2);
    for len in [4096, 4097, 4104, 4111, 4112, 4160, 8192, 65535, 65536] {
        for offset in 0..64 {
            assert_matches_crc_fast(&data[offset..offset + len]);
        }
    }
}

#[test]
fn all_zeroes_and_all_ones_match_crc_fast() {
    for fill in [0x00, 0xFF] {
        for len in [256, 257, 511, 4096, 4104] {
            assert_matches_crc_fast(&vec![fill; len]);
        }
    }
}

/// Parts of `bytes` cut at `cuts` (ascending), through the SIMD path where
/// it runs and through the forced fallback; both must agree.
fn in_parts(bytes: &[u8], cuts: &[usize]) -> (u16, u64) {
    let mut crc16 = Crc16T10Dif::new();
    let mut crc64 = Crc64Nvme::new();
    let mut fallback16 = CRC16_T10DIF.init;
    let mut fallback64 = CRC64_NVME.init;
    let mut start = 0;
    for &end in cuts.iter().chain([&bytes.len()]) {
        let part = &bytes[start..end];
        crc16.update(part);
        crc64.update(part);
        fallback16 = update_register(&CRC16_T10DIF, fallback16, part, false);
        fallback64 = update_register(&CRC64_NVME, fallback64, part, false);
        start = end;
    }
    assert_eq!(
        u64::from(crc16.finalize()),
        fallback16,
        "CRC-16 fallback, cuts {cuts:?}"
    );
    assert_eq!(
        crc64.finalize(),
        fallback64 ^ u64::MAX,
        "CRC-64 fallback, cuts {cuts:?}"
    );
    (crc16.finalize(), crc64.finalize())
}

#[test]
fn two_parts_cut_anywhere_equal_one_shot() {
    let data = noise(1100, 3);
    let whole = (crc16_t10dif(&data), crc64_nvme(&data));
    for cut in 0..=data.len() {
        assert_eq!(in_parts(&data, &[cut]), whole, "cut at {cut}");
    }
}

#[test]
fn many_parts_cut_at_random_equal_one_shot() {
    let data = noise(4160, 4);
    let whole = (crc16_t10dif(&data), crc64_nvme(&data));
    let mut noise = Noise(5);
    for trial in 0..300 {
        let mut cuts: Vec<usize> = (0..noise.below(6))
            .map(|_| noise.below(data.len() + 1))
            .collect();
        cuts.sort_unstable();
        assert_eq!(
            in_parts(&data, &cuts),
            whole,
            "trial {trial}, cuts {cuts:?}"
        );
    }
    // A block with a separate metadata buffer, as `checksum_parts` sees it.
    let (block, metadata) = data.split_at(4096);
    assert_eq!(in_parts(&data, &[4096]), whole);
    let mut crc = Crc64Nvme::new();
    crc.update(block);
    crc.update(&metadata[..56]);
    assert_eq!(crc.finalize(), crc64_nvme(&data[..4152]));
}

/// `update_copy` of `bytes` from a register that is not init, and in two
/// parts cut at `cut`: the same CRCs as `update`, and a copy equal to
/// `bytes`.
fn assert_copies(bytes: &[u8], cut: usize) {
    let (mut want16, mut want64) = (Crc16T10Dif::new(), Crc64Nvme::new());
    want16.update(b"head");
    want64.update(b"head");
    let (mut got16, mut got64) = (want16, want64);
    want16.update(bytes);
    want64.update(bytes);
    let len = bytes.len();
    let (a, b) = bytes.split_at(cut);
    let mut copy16 = vec![0u8; len];
    let (c, d) = copy16.split_at_mut(cut);
    got16.update_copy(a, c);
    got16.update_copy(b, d);
    let mut copy64 = vec![0u8; len];
    got64.update_copy(bytes, &mut copy64);
    assert_eq!(got16, want16, "CRC-16, {len} bytes cut at {cut}");
    assert_eq!(got64, want64, "CRC-64, {len} bytes");
    assert!(copy16 == bytes && copy64 == bytes, "copies of {len} bytes");
}

#[test]
fn update_copy_copies_and_equals_update() {
    let data = noise(65536 + 64, 7);
    let mut noise = Noise(8);
    for len in (0..=1100).chain([4096, 4104, 4160, 8192, 65536]) {
        let offset = noise.below(64);
        let cut = noise.below(len + 1);
        assert_copies(&data[offset..offset + len], cut);
    }
}

#[test]
#[should_panic(expected = "a copy as long as the bytes")]
fn update_copy_to_a_shorter_buffer_panics() {
    Crc16T10Dif::new().update_copy(&[0; 300], &mut [0; 299]);
}

/// x^k mod P through `crc-fast`: the CRC, from a register of zero, of a
/// message whose only set bit is k - width places from its end. Its own
/// derivation of the folding keys, to check ours against.
fn power_by_crc_fast(kernel: &Kernel, k: u32) -> u64 {
    let bit = k - kernel.width;
    let mut message = vec![0u8; bit as usize / 8 + 1];
    if kernel.reflected {
        // The first byte's least significant bit is the highest power.
        message[0] = 0x80 >> (bit % 8);
        from_zero(kernel, &message).reverse_bits()
    } else {
        message[0] = 1 << (bit % 8);
        from_zero(kernel, &message)
    }
}

fn from_zero(kernel: &Kernel, message: &[u8]) -> u64 {
    let mut digest = crc_fast::Digest::new_with_init_state(kernel.algorithm, 0);
    digest.update(message);
    digest.get_state()
}

#[test]
fn folding_keys_equal_crc_fast_powers_of_x() {
    for kernel in [CRC16_T10DIF, CRC64_NVME] {
        let (width, poly) = match kernel.algorithm {
            CrcAlgorithm::Crc16T10Dif => (16, 0x8BB7),
            _ => (64, 0xAD93_D235_94C9_3659),
        };
        for k in width..2200 {
            assert_eq!(
                x_pow_mod(k, width, poly),
                power_by_crc_fast(&kernel, k),
                "{:?}: x^{k}",
                kernel.algorithm
            );
        }
        for (keys, d) in kernel.keys.into_iter().zip(DISTANCES) {
            let want = if kernel.reflected {
                [
                    power_by_crc_fast(&kernel, d + 63).reverse_bits(),
                    power_by_crc_fast(&kernel, d - 1).reverse_bits(),
                ]
            } else {
                [
                    power_by_crc_fast(&kernel, d),
                    power_by_crc_fast(&kernel, d + 64),
                ]
            };
            assert_eq!(keys, want, "{:?}: keys for {d} bits", kernel.algorithm);
        }
        for (keys, d) in kernel.tail_keys.into_iter().zip((8..=120).step_by(8)) {
            let want = if kernel.reflected {
                [
                    power(&kernel, d + 63).reverse_bits(),
                    power(&kernel, d - 1).reverse_bits(),
                ]
            } else {
                [power(&kernel, d), power(&kernel, d + 64)]
            };
            assert_eq!(keys, want, "{:?}: tail keys for {d} bits", kernel.algorithm);
        }
    }
}

/// x^k mod P, below the width too, where it is x^k itself.
fn power(kernel: &Kernel, k: u32) -> u64 {
    if k < kernel.width {
        1 << k
    } else {
        power_by_crc_fast(kernel, k)
    }
}

/// A polynomial over GF(2) as its coefficients, the lowest power first.
type Poly = Vec<bool>;

fn poly_from_bits(bits: u128) -> Poly {
    (0..128).map(|i| bits >> i & 1 != 0).collect()
}

fn poly_to_bits(p: &[bool]) -> u128 {
    assert!(p.iter().skip(128).all(|&c| !c), "wider than 128 bits");
    p.iter()
        .take(128)
        .enumerate()
        .fold(0, |bits, (i, &c)| bits | u128::from(c) << i)
}

fn x_to_the(k: usize) -> Poly {
    let mut p = vec![false; k + 1];
    p[k] = true;
    p
}

/// P as a polynomial: x^width + `poly`.
fn crc_poly(width: u32, poly: u64) -> Poly {
    let mut p = poly_from_bits(poly.into());
    p.truncate(width as usize);
    p.push(true);
    p
}

/// Quotient and remainder by schoolbook long division, one bit at a time:
/// the slow way, to check the constants of keys.rs against.
fn divide(dividend: &[bool], divisor: &[bool]) -> (Poly, Poly) {
    let n = divisor.iter().rposition(|&c| c).expect("a divisor");
    let mut rem = dividend.to_vec();
    let mut quot = vec![false; dividend.len().saturating_sub(n).max(1)];
    for i in (n..dividend.len()).rev() {
        if rem[i] {
            quot[i - n] = true;
            for (r, &d) in rem[i - n..=i].iter_mut().zip(&divisor[..=n]) {
                *r ^= d;
            }
        }
    }
    rem.truncate(n);
    (quot, rem)
}

fn multiply(a: &[bool], b: &[bool]) -> Poly {
    let mut product = vec![false; a.len() + b.len()];
    for (i, _) in a.iter().enumerate().filter(|(_, &c)| c) {
        for (j, _) in b.iter().enumerate().filter(|(_, &c)| c) {
            product[i + j] ^= true;
        }
    }
    product
}

fn add(a: &[bool], b: &[bool]) -> Poly {
    let len = a.len().max(b.len());
    let coef = |p: &[bool], i: usize| p.get(i).copied().unwrap_or(false);
    (0..len).map(|i| coef(a, i) ^ coef(b, i)).collect()
}

fn trimmed(mut p: Poly) -> Poly {
    while p.last() == Some(&false) {
        p.pop();
    }
    p
}

#[test]
fn x_pow_div_and_x_pow_mod_equal_long_division() {
    for (width, poly) in [(16, 0x8BB7), (64, 0xAD93_D235_94C9_3659)] {
        let p = crc_poly(width, poly);
        for k in 0..width + 128 {
            let (quot, rem) = divide(&x_to_the(k as usize), &p);
            assert_eq!(x_pow_div(k, width, poly), poly_to_bits(&quot), "x^{k}/P");
            assert_eq!(
                u128::from(x_pow_mod(k, width, poly)),
                poly_to_bits(&rem),
                "x^{k} mod P"
            );
            // What division means: x^k = quot·P + rem.
            assert_eq!(
                trimmed(add(&multiply(&quot, &p), &rem)),
                x_to_the(k as usize)
            );
        }
    }
}

#[test]
fn final_reduction_constants_equal_long_division() {
    for kernel in [CRC16_T10DIF, CRC64_NVME] {
        let (width, poly) = match kernel.algorithm {
            CrcAlgorithm::Crc16T10Dif => (16, 0x8BB7u64),
            _ => (64, 0xAD93_D235_94C9_3659),
        };
        let name = kernel.algorithm;
        let c = kernel.barrett;
        // P' = P·x^(64-w).
        let p = multiply(&crc_poly(width, poly), &x_to_the(64 - width as usize));
        let (mu, x128_mod) = divide(&x_to_the(128), &p);
        let mu = poly_to_bits(&mu);
        assert_eq!(mu >> 64, 1, "{name:?}: µ has degree 64");
        let poly_bits = poly_to_bits(&p) as u64;
        if kernel.reflected {
            let (_, x127_mod) = divide(&x_to_the(127), &p);
            let x127_mod = poly_to_bits(&x127_mod) as u64;
            assert_eq!(c.fold, x127_mod.reverse_bits(), "{name:?}: x^127");
            assert_eq!(c.mu, ((mu >> 1) as u64).reverse_bits(), "{name:?}: µ");
            assert_eq!(c.poly, (poly_bits >> 1).reverse_bits(), "{name:?}: P");
        } else {
            assert_eq!(
                u128::from(c.fold),
                poly_to_bits(&x128_mod),
                "{name:?}: x^128"
            );
            assert_eq!(c.mu, mu as u64, "{name:?}: µ");
            assert_eq!(c.poly, poly_bits, "{name:?}: P'");
        }
    }
}

/// `block` followed by `tail` through the final reduction, where the CPU
/// runs it.
fn reduced(kernel: &Kernel, block: &[u8; 16], tail: &[u8]) -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        // SAFETY: simd_available() saw AVX2 and PCLMULQDQ, the features
        // `reduce` is compiled for.
        return Some(unsafe { reduce::reduce(kernel, block, tail) });
    }
    let _ = (kernel, block, tail);
    None
}

#[test]
fn final_reduction_of_any_block_and_tail_matches_crc_fast() {
    let mut noise = Noise(7);
    let mut blocks: Vec<[u8; 16]> = vec![[0; 16], [0xFF; 16]];
    // Every single bit, to catch an order or a reflection off by one.
    for bit in 0..128 {
        let mut block = [0u8; 16];
        block[bit / 8] = 1 << (bit % 8);
        blocks.push(block);
    }
    blocks.extend((0..2000).map(|_| <[u8; 16]>::try_from(noise.bytes(16)).unwrap()));
    for kernel in [CRC16_T10DIF, CRC64_NVME] {
        for block in &blocks {
            for len in 0..16 {
                let tail = noise.bytes(len);
                let Some(ours) = reduced(&kernel, block, &tail) else {
                    return;
                };
                let message = [&block[..], &tail].concat();
                assert_eq!(
                    ours,
                    from_zero(&kernel, &message),
                    "{:?}: block {block:02x?}, tail {tail:02x?}",
                    kernel.algorithm
                );
            }
        }
    }
}

#[test]
fn simd_path_from_any_register_matches_the_fallback() {
    let data = noise(70_000, 8);
    let mut noise = Noise(9);
    let lengths = (256..=1100).chain([4096, 4104, 4111, 65536, 65551, 69_999]);
    for len in lengths {
        let offset = noise.below(data.len() - len + 1);
        let bytes = &data[offset..offset + len];
        for kernel in [CRC16_T10DIF, CRC64_NVME] {
            let register = noise.next() >> (64 - kernel.width);
            assert_eq!(
                update_register(&kernel, register, bytes, true),
                update_register(&kernel, register, bytes, false),
                "{:?}: {len} bytes at {offset} from {register:#x}",
                kernel.algorithm
            );
        }
    }
}

/// The fold must run wherever the CPU has what it needs, so the tests above
/// check it and not only the fallback twice.
#[test]
fn fold_runs_where_the_cpu_lists_avx2_pclmulqdq_and_vpclmulqdq() {
    let cpu_has_them = match std::fs::read_to_string("/proc/cpuinfo") {
        Ok(cpuinfo) => cpuinfo
            .lines()
            .find(|line| line.starts_with("flags"))
            .is_some_and(|flags| {
                let flags: Vec<&str> = flags.split_whitespace().collect();
                ["avx2", "pclmulqdq", "vpclmulqdq"]
                    .iter()
                    .all(|f| flags.contains(f))
            }),
        // Not Linux: what std detects is all there is to go by.
        Err(_) => simd_available(),
    };
    assert_eq!(
        simd_available(),
        cpu_has_them && cfg!(target_arch = "x86_64")
    );
    let round = noise(256, 6);
    assert_eq!(
        fold_and_finish(&CRC64_NVME, u64::MAX, &round, None).is_some(),
        simd_available()
    );
    assert_eq!(
        fold_and_finish(&CRC64_NVME, u64::MAX, &round[..255], None),
        None
    );
}
