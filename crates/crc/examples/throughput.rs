//! ns per block of `crc-fast` and of this crate, for both guards, on the
//! block sizes PI formats use:
//! `cargo run --release -p vnvme-crc --example throughput`.

use std::hint::black_box;
use std::time::Instant;

use crc_fast::CrcAlgorithm;

type Crc = fn(&[u8]) -> u64;

/// Mean ns per call of `crc` over `bytes`, the best of five runs (the
/// machine is shared, and the best run is the one least disturbed).
fn ns_per_call(bytes: &[u8], crc: Crc) -> f64 {
    let calls = (200_000_000 / (bytes.len() + 64)).max(1000);
    (0..5)
        .map(|_| {
            let start = Instant::now();
            let mut sink = 0;
            for _ in 0..calls {
                sink ^= crc(black_box(bytes));
            }
            black_box(sink);
            start.elapsed().as_nanos() as f64 / calls as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let crcs: [(&str, Crc, Crc); 2] = [
        (
            "CRC-16 T10-DIF",
            |b| crc_fast::checksum(CrcAlgorithm::Crc16T10Dif, b),
            |b| vnvme_crc::crc16_t10dif(b).into(),
        ),
        (
            "CRC-64 NVMe",
            |b| crc_fast::checksum(CrcAlgorithm::Crc64Nvme, b),
            vnvme_crc::crc64_nvme,
        ),
    ];
    let data: Vec<u8> = (0..65536u32 + 64)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    println!("| bytes | CRC | crc-fast ns | vnvme-crc ns | speedup |");
    println!("|---|---|---|---|---|");
    for len in [512, 520, 4096, 4104, 4160, 65536] {
        // Not 16-byte aligned, as a block behind 8 bytes of another
        // block's metadata would be.
        let bytes = &data[8..8 + len];
        for (name, theirs, ours) in crcs {
            let theirs = ns_per_call(bytes, theirs);
            let ours = ns_per_call(bytes, ours);
            println!(
                "| {len} | {name} | {theirs:.0} | {ours:.0} | {:.2}x |",
                theirs / ours
            );
        }
    }
}
