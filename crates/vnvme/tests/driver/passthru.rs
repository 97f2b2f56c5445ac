//! Passthrough (sync and async) and vendor commands: commands the caller
//! builds, checked by the driver before anything is sent and completed with
//! the controller's own status.

use std::collections::HashMap;
use std::time::Duration;

use vnvme_controller::vendor::{VendorInfo, CHECKSUM_LBA_RANGE, VENDOR_INFO};
use vnvme_driver::{
    AsyncCompletion, AsyncQueue, BufferSlice, DataDirection, Error, InitOptions, IoQueue,
    PassthruData, QueueCounters,
};
use vnvme_spec::identify::IDENTIFY_SIZE;
use vnvme_spec::{AdminOpcode, Command, NvmOpcode, Status};
use zerocopy::IntoBytes;

use crate::crc32c::crc32c;
use crate::rig::{self, eventually, DeviceOptions, Rig};

fn start(opts: InitOptions) -> Rig {
    rig::start(DeviceOptions::default(), &["64M:ram"], opts)
}

/// Bytes unique to `seed` even among neighbouring seeds (the tokens here),
/// which [`rig::pattern`] tells apart only in a few bytes.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed * 977) >> 7) as u8)
        .collect()
}

/// One 4096-byte block (the namespace's LBA size) at `lba`.
fn rw(op: NvmOpcode, lba: u64) -> Command {
    let mut c = Command::new(op.0, 0);
    c.nsid = 1.into();
    c.cdw10 = (lba as u32).into();
    c.cdw11 = ((lba >> 32) as u32).into();
    c
}

fn checksum(lba: u64, nlb: u32) -> Command {
    let mut c = Command::new(CHECKSUM_LBA_RANGE, 0);
    c.nsid = 1.into();
    c.cdw10 = (lba as u32).into();
    c.cdw12 = (nlb - 1).into();
    c
}

/// What reaches the device: entries written and doorbells (any kind).
fn sent(c: QueueCounters) -> (u64, u64) {
    (
        c.submitted,
        c.sq_doorbell_writes + c.sq_shadow_updates + c.sq_mapped_writes,
    )
}

#[test]
fn admin_identify_through_passthru_equals_controller_identify() {
    let rig = start(InitOptions::default());
    let (access, ctrl) = (&rig.access, &rig.ctrl);
    let buf = access.dma_alloc(IDENTIFY_SIZE).unwrap();
    let mut cmd = Command::new(AdminOpcode::IDENTIFY.0, 0);
    cmd.cdw10 = 1.into(); // CNS 01h: Identify Controller
    let done = ctrl
        .admin_passthru(cmd, Some(PassthruData::read(&buf, IDENTIFY_SIZE)))
        .unwrap();
    assert!(done.is_success(), "{:?}", done.status);
    assert_eq!(buf.to_vec(), ctrl.identify().as_bytes());
}

#[test]
fn io_passthru_write_reads_back_through_the_block_api() {
    let rig = start(InitOptions::default());
    let (access, ctrl) = (&rig.access, &rig.ctrl);
    let mut q = ctrl.take_io_queue(0).unwrap();
    let data = pattern(1, 8192);
    let wbuf = access.dma_alloc(data.len()).unwrap();
    wbuf.write_bytes(0, &data).unwrap();
    let mut cmd = rw(NvmOpcode::WRITE, 40);
    cmd.cdw12 = 1.into(); // two blocks
    let done = q
        .passthru(cmd, Some(PassthruData::write(&wbuf, data.len())))
        .unwrap();
    assert_eq!(done.into_result(), Ok(0));
    let mut rbuf = access.dma_alloc(data.len()).unwrap();
    q.read(1, 40, 2, &mut rbuf).unwrap();
    assert_eq!(rbuf.to_vec(), data);
}

#[test]
fn io_passthru_device_error_is_a_status_not_an_err() {
    let rig = start(InitOptions::default());
    let (access, ctrl) = (&rig.access, &rig.ctrl);
    let mut q = ctrl.take_io_queue(0).unwrap();
    let buf = access.dma_alloc(4096).unwrap();
    let beyond = 64 << 20 >> 12; // first LBA past the 64 MiB namespace
    let done = q
        .passthru(
            rw(NvmOpcode::READ, beyond),
            Some(PassthruData::read(&buf, 4096)),
        )
        .unwrap();
    assert!(done.status.same_code(Status::LBA_OUT_OF_RANGE));
    assert!(done.dnr());
}

#[test]
fn async_reaps_150_tokens_in_any_order_with_registered_buffers() {
    let rig = start(InitOptions::default());
    let (access, ctrl) = (&rig.access, &rig.ctrl);
    let mut aq = AsyncQueue::new(ctrl.take_io_queue(0).unwrap());
    const N: usize = 150;
    let bufs: Vec<_> = (0..N).map(|_| access.dma_alloc(4096).unwrap()).collect();
    let first = aq.register_buffers(bufs);
    // Writes of a block each, submitted in a scrambled order, tagged by
    // tokens unrelated to that order.
    let order: Vec<usize> = (0..N).map(|i| (i * 61) % N).collect();
    let token = |i: usize| 0xDEAD_0000_0000 + (i as u64) * 7919;
    for &i in &order {
        aq.buffer(first + i)
            .unwrap()
            .write_bytes(0, &pattern(i as u64, 4096))
            .unwrap();
        let data = BufferSlice::write(first + i, 4096);
        aq.prepare(rw(NvmOpcode::WRITE, 1000 + i as u64), Some(data), token(i))
            .unwrap();
    }
    assert_eq!(aq.submit().unwrap(), N, "one doorbell for the batch");
    let mut done: Vec<AsyncCompletion> = Vec::new();
    while aq.in_flight() > 0 {
        aq.wait(&mut done, 16, Duration::from_secs(10)).unwrap();
    }
    assert_eq!(done.len(), N);
    let mut seen: HashMap<u64, usize> = HashMap::new();
    for c in &done {
        assert!(c.completion.is_success(), "{:?}", c.completion.status);
        *seen.entry(c.token).or_default() += 1;
    }
    assert!((0..N).all(|i| seen.get(&token(i)) == Some(&1)));

    // Read them back into zeroed buffers, and checksum each on the
    // controller side, interleaved; reaped by polling.
    for i in 0..N {
        aq.buffer(first + i).unwrap().fill(0, 4096, 0).unwrap();
    }
    done.clear();
    for &i in order.iter().rev() {
        let data = BufferSlice::read(first + i, 4096);
        aq.prepare(rw(NvmOpcode::READ, 1000 + i as u64), Some(data), token(i))
            .unwrap();
        if i % 10 == 0 {
            aq.prepare(checksum(1000 + i as u64, 1), None, u64::MAX - i as u64)
                .unwrap();
        }
    }
    aq.submit().unwrap();
    while aq.in_flight() > 0 {
        aq.reap(&mut done, 32).unwrap();
    }
    assert_eq!(done.len(), N + N / 10);
    for c in &done {
        assert!(c.completion.is_success());
        if c.token >= u64::MAX - N as u64 {
            let i = (u64::MAX - c.token) as usize;
            assert_eq!(c.completion.result, crc32c(&pattern(i as u64, 4096)));
        } else {
            let i = ((c.token - 0xDEAD_0000_0000) / 7919) as usize;
            assert_eq!(
                aq.buffer(first + i).unwrap().to_vec(),
                pattern(i as u64, 4096),
                "token {:#x}",
                c.token
            );
        }
    }
}

#[test]
fn async_completion_by_polling_without_interrupts() {
    let opts = InitOptions {
        interrupts: false,
        ..InitOptions::default()
    };
    let rig = start(opts);
    let ctrl = &rig.ctrl;
    let mut aq = AsyncQueue::new(ctrl.take_io_queue(0).unwrap());
    assert!(!aq.has_interrupt());
    let mut flush = Command::new(NvmOpcode::FLUSH.0, 0);
    flush.nsid = 1.into();
    aq.submit_one(flush, None, 42).unwrap();
    let mut done = Vec::new();
    aq.wait(&mut done, 1, Duration::from_secs(10)).unwrap();
    assert_eq!(done[0].token, 42);
    assert!(done[0].completion.is_success());
}

#[test]
fn vendor_commands_through_passthru() {
    let rig = start(InitOptions::default());
    let (access, ctrl) = (&rig.access, &rig.ctrl);
    // Admin C2h: vendor info, NUMD = 15 (64 bytes).
    let buf = access.dma_alloc(4096).unwrap();
    let mut info = Command::new(VENDOR_INFO, 0);
    info.cdw10 = 15.into();
    let done = ctrl
        .admin_passthru(info, Some(PassthruData::read(&buf, VendorInfo::SIZE)))
        .unwrap();
    assert!(done.is_success());
    let bytes = buf.to_vec();
    assert_eq!(&bytes[..8], &VendorInfo::MAGIC);
    assert_eq!(&bytes[8..12], &1u32.to_le_bytes(), "layout version");
    assert_eq!(&bytes[12..16], &1u32.to_le_bytes(), "one namespace");
    let serial = vnvme::identity::Origin::embedded().serial();
    assert_eq!(&bytes[44..64], serial.as_bytes());
    assert!(
        bytes[64..].iter().all(|&b| b == 0),
        "NUMD bounds the transfer"
    );

    // I/O C0h: CRC32C of an LBA range, no data transferred.
    let mut q = ctrl.take_io_queue(0).unwrap();
    let data = pattern(9, 3 * 4096);
    let wbuf = access.dma_alloc(data.len()).unwrap();
    wbuf.write_bytes(0, &data).unwrap();
    q.write(1, 77, 3, &wbuf).unwrap();
    let done = q.passthru(checksum(77, 3), None).unwrap();
    assert_eq!(done.into_result(), Ok(crc32c(&data)));
    let done = q.passthru(checksum((64 << 20 >> 12) - 1, 2), None).unwrap();
    assert!(done.status.same_code(Status::LBA_OUT_OF_RANGE));

    // Unregistered vendor opcodes: Invalid Command Opcode, DNR.
    let done = ctrl.admin_passthru(Command::new(0xC4, 0), None).unwrap();
    assert!(done.status.same_code(Status::INVALID_OPCODE) && done.dnr());
    let mut c = Command::new(0xFC, 0);
    c.nsid = 1.into();
    let done = q.passthru(c, None).unwrap();
    assert!(done.status.same_code(Status::INVALID_OPCODE) && done.dnr());

    // Both are listed in the Commands Supported and Effects log (LID 05h).
    let log = access.dma_alloc(4096).unwrap();
    let mut get = Command::new(AdminOpcode::GET_LOG_PAGE.0, 0);
    get.cdw10 = (0x05 | (1023 << 16)).into();
    ctrl.admin_passthru(get, Some(PassthruData::read(&log, 4096)))
        .unwrap()
        .into_result()
        .unwrap();
    let entry = |at: usize| log.load_u32(at * 4).unwrap();
    assert_eq!(entry(usize::from(VENDOR_INFO)) & 1, 1, "ACS CSUPP");
    assert_eq!(
        entry(256 + usize::from(CHECKSUM_LBA_RANGE)) & 1,
        1,
        "IOCS CSUPP"
    );
    assert_eq!(entry(0xC4), 0);
}

#[test]
fn misuse_is_refused_before_anything_is_sent() {
    let rig = start(InitOptions::default());
    let (access, ctrl) = (&rig.access, &rig.ctrl);
    let mut q: IoQueue = ctrl.take_io_queue(0).unwrap();
    let max = q.max_transfer();
    let big = access.dma_alloc(max + 4096).unwrap();
    let small = access.dma_alloc(4096).unwrap();
    let device_commands = || rig.stats().commands;
    // The driver does not wait for the controller to fetch the Asynchronous
    // Event Request it left outstanding; that fetch must not be counted as
    // one of ours.
    eventually("the Asynchronous Event Request fetched", || {
        rig.admin_received("async-event-request") == 1
    });
    let (io_before, admin_before, cmds_before) =
        (sent(q.counters()), ctrl.admin_counters(), device_commands());
    let admin_sent_before = ctrl.admin_commands();

    // Larger than MDTS.
    let r = q.passthru(
        rw(NvmOpcode::READ, 0),
        Some(PassthruData::read(&big, max + 4096)),
    );
    assert!(matches!(r, Err(Error::TransferTooLarge { .. })), "{r:?}");
    // A Read (10b) with a buffer for the controller to read.
    let r = q.passthru(
        rw(NvmOpcode::READ, 0),
        Some(PassthruData::write(&small, 4096)),
    );
    assert!(
        matches!(r, Err(Error::WrongDirection { opcode: 0x02, .. })),
        "{r:?}"
    );
    // A Flush (00b) with any buffer.
    let r = q.passthru(
        rw(NvmOpcode::FLUSH, 0),
        Some(PassthruData::read(&small, 4096)),
    );
    assert!(matches!(r, Err(Error::WrongDirection { .. })), "{r:?}");
    // A range past the end of its buffer.
    let r = q.passthru(
        rw(NvmOpcode::READ, 0),
        Some(PassthruData {
            buf: &small,
            offset: 2048,
            len: 4096,
            direction: DataDirection::ControllerToHost,
        }),
    );
    assert!(matches!(r, Err(Error::BufferTooSmall { .. })), "{r:?}");
    // Admin: Identify (10b) with a host-to-controller buffer, and too large.
    let mut identify = Command::new(AdminOpcode::IDENTIFY.0, 0);
    identify.cdw10 = 1.into();
    let r = ctrl.admin_passthru(identify, Some(PassthruData::write(&small, 4096)));
    assert!(matches!(r, Err(Error::WrongDirection { .. })), "{r:?}");
    let r = ctrl.admin_passthru(identify, Some(PassthruData::read(&big, max + 4096)));
    assert!(matches!(r, Err(Error::TransferTooLarge { .. })), "{r:?}");

    assert_eq!(sent(q.counters()), io_before, "no SQ entry, no doorbell");
    assert_eq!(q.outstanding(), 0, "no CID kept");
    assert_eq!(ctrl.admin_counters(), admin_before);
    assert_eq!(ctrl.admin_commands(), admin_sent_before);

    // Async: a buffer index out of range, then a full queue.
    let mut aq = AsyncQueue::new(q);
    let first = aq.register_buffers([small.clone()]);
    let r = aq.prepare(
        rw(NvmOpcode::READ, 0),
        Some(BufferSlice::read(first + 1, 4096)),
        1,
    );
    assert!(
        matches!(r, Err(Error::NoSuchBuffer { index: 1, count: 1 })),
        "{r:?}"
    );
    let mut flush = Command::new(NvmOpcode::FLUSH.0, 0);
    flush.nsid = 1.into();
    for t in 0..aq.capacity() {
        aq.prepare(flush, None, t as u64).unwrap();
    }
    let prepared = sent(aq.queue().counters());
    let r = aq.prepare(flush, None, 9999);
    assert!(matches!(r, Err(Error::QueueFull(1))), "{r:?}");
    assert_eq!(sent(aq.queue().counters()), prepared);
    assert_eq!(
        prepared.1, io_before.1,
        "prepared commands wait for submit's doorbell"
    );
    assert_eq!(device_commands(), cmds_before, "the device saw nothing");
    assert_eq!(aq.submit().unwrap(), aq.capacity());
    let mut done = Vec::new();
    while aq.in_flight() > 0 {
        aq.wait(&mut done, 64, Duration::from_secs(10)).unwrap();
    }
    assert_eq!(done.len(), aq.capacity());
    assert!(done.iter().all(|c| c.token != 9999));
}
