//! The driver against the controller in one process, over a real vfio-user
//! socketpair.

use std::sync::Arc;

use vnvme::device::DeviceOptions;
use vnvme::inproc::InProcess;
use vnvme::namespace::NamespaceSpec;
use vnvme_driver::{Controller, DeviceAccess, InitOptions};
use vnvme_spec::identify::ascii_field;

fn start(namespaces: &[&str], opts: InitOptions) -> (InProcess, Arc<dyn DeviceAccess>, Controller) {
    let specs: Vec<NamespaceSpec> = namespaces.iter().map(|s| s.parse().unwrap()).collect();
    let device = DeviceOptions::default().build(&specs).unwrap();
    InProcess::start_driver(device, opts).unwrap()
}

#[test]
fn enable_and_identify_over_vfio_user() {
    let (_srv, _access, ctrl) = start(&["64M:ram", "16M:null"], InitOptions::default());
    let id = ctrl.identify();
    assert_eq!(ascii_field(&id.mn), "vnvme");
    assert_eq!(ascii_field(&id.sn), "VNVME0001");
    assert_eq!(id.nn.get(), 2);
    let ns = ctrl.namespaces();
    assert_eq!(ns.len(), 2);
    assert_eq!(ns[0].size_bytes(), 64 << 20);
    assert_eq!(ns[1].size_bytes(), 16 << 20);
}

#[test]
fn write_then_read_back_a_ram_namespace() {
    let (_srv, access, ctrl) = start(&["64M:ram"], InitOptions::default());
    let mut q = ctrl.take_io_queue(0).unwrap();
    let pattern: Vec<u8> = (0..16384u32).map(|i| (i * 7 + 3) as u8).collect();
    let wbuf = access.dma_alloc(pattern.len()).unwrap();
    wbuf.write_bytes(0, &pattern).unwrap();
    q.write(1, 100, 4, &wbuf).unwrap();
    let mut rbuf = access.dma_alloc(pattern.len()).unwrap();
    q.read(1, 100, 4, &mut rbuf).unwrap();
    assert_eq!(rbuf.to_vec(), pattern);
}

/// A pattern unique to (thread, block) so misdirected data is caught.
fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

#[test]
fn four_queue_pairs_on_four_threads() {
    let opts = InitOptions {
        io_queues: 4,
        ..InitOptions::default()
    };
    let (_srv, access, ctrl) = start(&["64M:ram"], opts);
    assert_eq!(ctrl.io_queue_count(), 4);
    let queues: Vec<_> = (0..4).map(|i| ctrl.take_io_queue(i).unwrap()).collect();
    std::thread::scope(|s| {
        for (t, mut q) in queues.into_iter().enumerate() {
            let access = Arc::clone(&access);
            s.spawn(move || {
                // Each thread owns its own LBA range: blocks t*1000 ...
                for i in 0..50u32 {
                    let data = pattern(t as u32 * 1000 + i, 8192);
                    let w = access.dma_alloc(data.len()).unwrap();
                    w.write_bytes(0, &data).unwrap();
                    let lba = t as u64 * 1000 + u64::from(i) * 2;
                    q.write(1, lba, 2, &w).unwrap();
                    let mut r = access.dma_alloc(data.len()).unwrap();
                    q.read(1, lba, 2, &mut r).unwrap();
                    assert_eq!(r.to_vec(), data, "thread {t} block {i}");
                }
            });
        }
    });
}

#[test]
fn transfers_that_need_prp_lists_cross_pages() {
    let (_srv, access, ctrl) = start(&["64M:ram"], InitOptions::default());
    let mut q = ctrl.take_io_queue(0).unwrap();
    // 128 KiB (MDTS) needs a PRP list of 31 entries; 12 KiB needs PRP1 + PRP2 + list.
    for blocks in [1u32, 2, 3, 17, 32] {
        let data = pattern(blocks, blocks as usize * 4096);
        let w = access.dma_alloc(data.len()).unwrap();
        w.write_bytes(0, &data).unwrap();
        q.write(1, 500, blocks, &w).unwrap();
        let mut r = access.dma_alloc(data.len()).unwrap();
        q.read(1, 500, blocks, &mut r).unwrap();
        assert_eq!(r.to_vec(), data, "{blocks} blocks");
    }
}

#[test]
fn reset_and_reenable_keeps_ram_data() {
    let (_srv, access, mut ctrl) = start(&["64M:ram"], InitOptions::default());
    let data = pattern(7, 4096);
    {
        let mut q = ctrl.take_io_queue(0).unwrap();
        let w = access.dma_alloc(4096).unwrap();
        w.write_bytes(0, &data).unwrap();
        q.write(1, 9, 1, &w).unwrap();
    }
    ctrl.reset().unwrap();
    let mut q = ctrl.take_io_queue(0).unwrap();
    let mut r = access.dma_alloc(4096).unwrap();
    q.read(1, 9, 1, &mut r).unwrap();
    assert_eq!(r.to_vec(), data);
}

#[test]
fn a_command_past_the_end_fails_with_lba_out_of_range() {
    let (_srv, access, ctrl) = start(&["1M:ram"], InitOptions::default());
    let mut q = ctrl.take_io_queue(0).unwrap();
    let mut r = access.dma_alloc(4096).unwrap();
    let err = q.read(1, 256, 1, &mut r).unwrap_err();
    assert_eq!(
        err.status(),
        Some(vnvme_spec::Status::LBA_OUT_OF_RANGE.with_dnr(true)),
        "{err}"
    );
}

#[test]
fn a_full_batch_of_commands_completes_once_each() {
    let opts = InitOptions {
        queue_depth: 64,
        ..InitOptions::default()
    };
    let (_srv, access, ctrl) = start(&["16M:null"], opts);
    let mut q = ctrl.take_io_queue(0).unwrap();
    let bufs: Vec<_> = (0..32).map(|_| access.dma_alloc(4096).unwrap()).collect();
    for round in 0..50 {
        let mut cids: Vec<u16> = bufs
            .iter()
            .enumerate()
            .map(|(i, b)| {
                q.enqueue_rw(vnvme_spec::NvmOpcode::READ, 1, i as u64, 1, b)
                    .unwrap()
            })
            .collect();
        q.ring().unwrap();
        let mut seen = Vec::new();
        while seen.len() < 32 {
            let mut out = Vec::new();
            q.wait(&mut out, 256, std::time::Duration::from_secs(5))
                .unwrap();
            seen.extend(out.iter().map(|c| c.cid()));
        }
        assert_eq!(q.outstanding(), 0, "round {round}");
        seen.sort_unstable();
        cids.sort_unstable();
        assert_eq!(seen, cids, "round {round}");
    }
}
