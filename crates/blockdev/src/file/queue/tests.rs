use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use super::*;
use crate::file::tests::{pattern, temp_dir};
use crate::file::FileDevice;
use crate::mapped::tests::{contents, HeapMemory};
use crate::BlockDevice;
use crate::{IoBuf, MappedBuf};

/// Long enough for any loaded machine; a test waits this long only when
/// it is about to fail.
const WAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A device on a fresh file of `size` bytes, in a directory named for the test.
fn device(name: &str, size: u64) -> (FileDevice, PathBuf) {
    let dir = temp_dir(&format!("queue-{name}"));
    let dev = FileDevice::open(dir.join("ns.img"), Some(size)).unwrap();
    (dev, dir)
}

/// A queue whose waker sends on the returned channel.
fn open_queue(dev: &FileDevice) -> (Box<dyn BlockQueue>, Receiver<()>, Waker) {
    let (tx, rx) = mpsc::channel();
    let waker: Waker = Arc::new(move || {
        let _ = tx.send(());
    });
    let queue = dev.as_async().unwrap().queue(Arc::clone(&waker)).unwrap();
    (queue, rx, waker)
}

/// Polls until `n` completions have come, sleeping on the waker between
/// polls that find nothing: hangs (then fails) if a wake is missed.
fn collect(queue: &mut dyn BlockQueue, woken: &Receiver<()>, n: usize) -> Vec<BlockCompletion> {
    let mut out = Vec::new();
    while out.len() < n {
        let want = n - out.len();
        if queue.poll(&mut out, want) == 0 {
            woken
                .recv_timeout(WAKE_TIMEOUT)
                .expect("the waker is called when a completion arrives");
        }
    }
    out
}

fn filled(data: &[u8]) -> IoBuf {
    let mut buf = IoBuf::zeroed(data.len());
    buf.copy_from_slice(data);
    buf
}

fn read(offset: u64, len: usize) -> BlockRequest {
    BlockRequest::Read {
        offset,
        data: IoBuf::zeroed(len).into(),
    }
}

fn write(offset: u64, data: &[u8], fua: bool) -> BlockRequest {
    BlockRequest::Write {
        offset,
        data: filled(data).into(),
        fua,
    }
}

/// The completions by token, each checked to have succeeded.
fn succeeded(completions: Vec<BlockCompletion>) -> HashMap<u64, Option<IoBuf>> {
    let mut by_token = HashMap::new();
    for c in completions {
        assert!(c.result.is_ok(), "token {}: {:?}", c.token, c.result);
        assert!(
            by_token
                .insert(c.token, c.data.and_then(Data::into_buf))
                .is_none(),
            "token {} twice",
            c.token
        );
    }
    by_token
}

#[test]
fn thirty_two_reads_are_in_flight_at_once_until_polled() {
    let (dev, dir) = device("depth", 1 << 20);
    dev.write(0, &pattern(1, 32 * 4096)).unwrap();
    let before = dev.counters();
    let (mut queue, woken, _waker) = open_queue(&dev);
    for i in 0..32u64 {
        queue.submit(read(i * 4096, 4096), i).unwrap();
    }
    queue.commit();
    assert_eq!(queue.in_flight(), 32);
    woken.recv_timeout(WAKE_TIMEOUT).unwrap();
    assert_eq!(queue.in_flight(), 32, "finished but not yet polled");
    let done = succeeded(collect(&mut *queue, &woken, 32));
    assert_eq!(queue.in_flight(), 0);
    let all = pattern(1, 32 * 4096);
    for (token, buf) in done {
        let at = token as usize * 4096;
        assert_eq!(buf.as_deref(), Some(&all[at..at + 4096]), "token {token}");
    }
    let c = dev.counters();
    let direct = c.direct_ops - before.direct_ops;
    assert_eq!(direct, if dev.direct_io() { 32 } else { 0 }, "{c:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn writes_then_reads_round_trip_distinct_patterns() {
    let (dev, dir) = device("round-trip", 1 << 20);
    let (mut queue, woken, _waker) = open_queue(&dev);
    for i in 0..16u8 {
        let offset = u64::from(i) * 16384;
        queue
            .submit(write(offset, &pattern(i, 16384), false), i.into())
            .unwrap();
    }
    assert_eq!(succeeded(collect(&mut *queue, &woken, 16)).len(), 16);
    for i in 0..16u64 {
        queue.submit(read(i * 16384, 16384), 100 + i).unwrap();
    }
    for (token, buf) in succeeded(collect(&mut *queue, &woken, 16)) {
        let i = (token - 100) as u8;
        assert_eq!(
            buf.as_deref(),
            Some(&pattern(i, 16384)[..]),
            "token {token}"
        );
    }
    // Another reader of the file sees the same bytes.
    let raw = std::fs::read(dir.join("ns.img")).unwrap();
    assert_eq!(&raw[5 * 16384..6 * 16384], &pattern(5, 16384)[..]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn completions_carry_the_tokens_of_their_requests() {
    let (dev, dir) = device("tokens", 4 << 20);
    let all = pattern(9, 4 << 20);
    dev.write(0, &all).unwrap();
    let (mut queue, woken, _waker) = open_queue(&dev);
    // Sizes from 4 KiB to 512 KiB, so they may finish out of order.
    let requests: Vec<(u64, usize)> = (0..24u64)
        .map(|i| (i * 131072 + 4096 * (i % 3), 4096 << (i % 8)))
        .collect();
    for (i, &(offset, len)) in requests.iter().enumerate() {
        queue
            .submit(read(offset, len), 0xC0DE_0000 + i as u64)
            .unwrap();
    }
    let done = succeeded(collect(&mut *queue, &woken, requests.len()));
    assert_eq!(done.len(), requests.len());
    for (token, buf) in done {
        let (offset, len) = requests[(token - 0xC0DE_0000) as usize];
        let want = &all[offset as usize..offset as usize + len];
        assert!(buf.as_deref() == Some(want), "token {token:#x}: wrong data");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fua_write_counts_a_dsync_write_and_flush_a_flush() {
    let (dev, dir) = device("fua", 1 << 20);
    let (mut queue, woken, _waker) = open_queue(&dev);
    queue
        .submit(write(8192, &pattern(3, 4096), true), 1)
        .unwrap();
    queue.submit(write(0, &pattern(4, 4096), false), 2).unwrap();
    queue.submit(BlockRequest::Flush, 3).unwrap();
    let c = dev.counters();
    assert_eq!((c.dsync_writes, c.flushes), (1, 1), "{c:?}");
    let done = succeeded(collect(&mut *queue, &woken, 3));
    assert!(done[&3].is_none(), "a flush has no buffer");
    assert_eq!(done[&1].as_ref().map(|b| b.len()), Some(4096));
    let raw = std::fs::read(dir.join("ns.img")).unwrap();
    assert_eq!(&raw[8192..12288], &pattern(3, 4096)[..]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_waker_is_called_when_a_completion_arrives_and_released_on_drop() {
    let (dev, dir) = device("waker", 2 << 20);
    let (mut queue, woken, waker) = open_queue(&dev);
    assert_eq!(Arc::strong_count(&waker), 2, "held by the wake thread");
    queue.submit(read(0, 1 << 20), 7).unwrap();
    queue.commit();
    woken
        .recv_timeout(WAKE_TIMEOUT)
        .expect("the waker is called");
    let mut out = Vec::new();
    assert_eq!(
        queue.poll(&mut out, 8),
        1,
        "the completion is visible once woken"
    );
    assert_eq!(out[0].token, 7);
    drop(queue);
    assert_eq!(
        Arc::strong_count(&waker),
        1,
        "the wake thread has exited and dropped the waker"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn with_waking_off_completions_wait_silently_for_poll() {
    let (dev, dir) = device("waking-off", 2 << 20);
    let (mut queue, woken, _waker) = open_queue(&dev);
    queue.set_waking(false);
    queue.submit(read(0, 4096), 3).unwrap();
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + WAKE_TIMEOUT;
    while queue.poll(&mut out, 8) == 0 {
        assert!(std::time::Instant::now() < deadline, "the read completes");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(out[0].token, 3);
    assert!(
        woken.recv_timeout(Duration::from_millis(100)).is_err(),
        "no waker call while waking is off"
    );
    queue.set_waking(true);
    queue.submit(read(0, 4096), 4).unwrap();
    queue.commit();
    woken
        .recv_timeout(WAKE_TIMEOUT)
        .expect("the waker is called again once waking is on");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn requests_past_the_limits_are_given_back_unstarted() {
    let (dev, dir) = device("limits", 32 << 20);
    let (mut queue, woken, _waker) = open_queue(&dev);
    for i in 0..MAX_IN_FLIGHT as u64 {
        queue.submit(read(i * 4096, 4096), i).unwrap();
    }
    let back = queue.submit(write(0, &pattern(1, 4096), false), 99);
    assert!(
        matches!(&back, Err(BlockRequest::Write { data: Data::Buf(buf), .. }) if buf[..] == pattern(1, 4096)[..]),
        "the 65th comes back with its data: {back:?}"
    );
    assert!(matches!(
        queue.submit(BlockRequest::Flush, 99),
        Err(BlockRequest::Flush)
    ));
    assert_eq!(queue.in_flight(), MAX_IN_FLIGHT);
    let done = succeeded(collect(&mut *queue, &woken, MAX_IN_FLIGHT));
    assert!(!done.contains_key(&99));

    let too_large = queue.submit(read(0, MAX_IO + 4096), 1);
    assert!(
        matches!(too_large, Err(BlockRequest::Read { offset: 0, ref data }) if data.len() == MAX_IO + 4096)
    );
    let past_the_end = queue.submit(read((32 << 20) - 4096, 8192), 2);
    assert!(past_the_end.is_err(), "the sync path reports the range");
    assert!(queue.submit(read(0, 0), 3).is_err(), "empty");
    assert_eq!(queue.in_flight(), 0);

    let per_byte_limit = MAX_BYTES_IN_FLIGHT / MAX_IO;
    for i in 0..per_byte_limit as u64 {
        queue.submit(read(i * MAX_IO as u64, MAX_IO), i).unwrap();
    }
    assert!(queue.submit(read(0, 4096), 4).is_err(), "16 MiB in flight");
    assert!(
        queue.submit(BlockRequest::Flush, 5).is_ok(),
        "a flush moves no bytes"
    );
    assert_eq!(
        collect(&mut *queue, &woken, per_byte_limit + 1).len(),
        per_byte_limit + 1
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dropping_a_queue_with_writes_in_flight_waits_for_them() {
    // Queued and not yet committed, too: dropping the queue starts them.
    let (dev, dir) = device("drop", 8 << 20);
    let (mut queue, _woken, _waker) = open_queue(&dev);
    for i in 0..MAX_IN_FLIGHT as u64 {
        let data = pattern(i as u8, 65536);
        queue.submit(write(i * 65536, &data, false), i).unwrap();
    }
    assert_eq!(queue.in_flight(), MAX_IN_FLIGHT);
    drop(queue);
    let raw = std::fs::read(dir.join("ns.img")).unwrap();
    for i in 0..MAX_IN_FLIGHT {
        let at = i * 65536;
        assert!(
            raw[at..at + 65536] == pattern(i as u8, 65536)[..],
            "write {i} is in the file"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_queue_outlives_the_device_it_came_from() {
    let (dev, dir) = device("outlives", 1 << 20);
    let path = dev.path().to_path_buf();
    let (mut queue, woken, _waker) = open_queue(&dev);
    drop(dev);
    queue
        .submit(write(4096, &pattern(6, 8192), false), 1)
        .unwrap();
    succeeded(collect(&mut *queue, &woken, 1));
    queue.submit(read(4096, 8192), 2).unwrap();
    let done = succeeded(collect(&mut *queue, &woken, 1));
    assert_eq!(done[&2].as_deref(), Some(&pattern(6, 8192)[..]));
    // The queue held the file, and its lock, until now.
    drop(queue);
    let again = FileDevice::open(&path, None).unwrap();
    let mut back = vec![0u8; 8192];
    again.read(4096, &mut back).unwrap();
    assert_eq!(back, pattern(6, 8192));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unaligned_requests_go_through_the_page_cache_and_round_trip() {
    let (dev, dir) = device("unaligned", 64 * 1024);
    dev.write(0, &pattern(2, 16384)).unwrap();
    let before = dev.counters();
    let (mut queue, woken, _waker) = open_queue(&dev);
    queue
        .submit(write(4608, &pattern(3, 1000), false), 1)
        .unwrap();
    succeeded(collect(&mut *queue, &woken, 1));
    queue.submit(read(4608, 1000), 2).unwrap();
    queue.submit(read(0, 16384), 3).unwrap();
    let done = succeeded(collect(&mut *queue, &woken, 2));
    assert_eq!(done[&2].as_deref(), Some(&pattern(3, 1000)[..]));
    let mut expect = pattern(2, 16384);
    expect[4608..5608].copy_from_slice(&pattern(3, 1000));
    assert!(
        done[&3].as_deref() == Some(&expect[..]),
        "aligned read sees it"
    );
    let c = dev.counters();
    assert_eq!(c.buffered_ops - before.buffered_ops, 2, "{c:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_read_past_a_shrunk_file_is_short_then_unexpected_eof() {
    let (dev, dir) = device("shrunk", 64 * 1024);
    dev.write(4096, &pattern(8, 8192)).unwrap();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("ns.img"))
        .unwrap();
    file.set_len(4096 + 100).unwrap();
    let (mut queue, woken, _waker) = open_queue(&dev);
    queue.submit(read(4096, 8192), 42).unwrap();
    let done = collect(&mut *queue, &woken, 1);
    assert_eq!(done[0].token, 42);
    let Some(Data::Buf(buf)) = done[0].data.as_ref() else {
        panic!("a read gives its buffer back");
    };
    assert_eq!(buf.len(), 8192);
    // The first, short, transfer put what the file still holds in place.
    assert_eq!(&buf[..100], &pattern(8, 100)[..]);
    match &done[0].result {
        Err(BlockError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(queue.in_flight(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `data` in heap memory standing in for guest memory: regions of `lens`
/// bytes, each `skew` bytes past a 4 KiB boundary.
fn mapped(lens: &[usize], skew: usize, data: &[u8]) -> MappedBuf {
    MappedBuf::new(Box::new(HeapMemory::new(lens, skew, data)))
}

/// The completion's mapped memory, as bytes.
fn mapped_contents(c: &BlockCompletion) -> Vec<u8> {
    match &c.data {
        Some(Data::Mapped(m)) => contents(m),
        other => panic!("token {}: not mapped memory: {other:?}", c.token),
    }
}

#[test]
fn mapped_memory_moves_straight_to_and_from_the_file_in_one_or_many_regions() {
    let (dev, dir) = device("mapped", 1 << 20);
    let before = dev.counters();
    let (mut queue, woken, _waker) = open_queue(&dev);
    // One region (a plain read or write), then four (vectored).
    let data = pattern(11, 16384);
    let write = |m| BlockRequest::Write {
        offset: 8192,
        data: Data::Mapped(m),
        fua: false,
    };
    queue.submit(write(mapped(&[16384], 0, &data)), 1).unwrap();
    succeeded(collect(&mut *queue, &woken, 1));
    let other = pattern(12, 16384);
    queue
        .submit(write(mapped(&[4096; 4], 0, &other)), 2)
        .unwrap();
    succeeded(collect(&mut *queue, &woken, 1));

    for (token, lens) in [(3u64, vec![16384]), (4, vec![8192, 4096, 4096])] {
        let read = BlockRequest::Read {
            offset: 8192,
            data: mapped(&lens, 0, &[0; 16384]).into(),
        };
        queue.submit(read, token).unwrap();
        let done = collect(&mut *queue, &woken, 1);
        assert!(done[0].result.is_ok(), "{:?}", done[0].result);
        assert_eq!(mapped_contents(&done[0]), other, "read in {lens:?}");
    }
    let c = dev.counters();
    assert_eq!(c.mapped_ops - before.mapped_ops, 4, "{c:?}");
    if dev.direct_io() {
        assert_eq!(
            c.direct_ops - before.direct_ops,
            4,
            "aligned: O_DIRECT {c:?}"
        );
    }
    let mut back = vec![0u8; 16384];
    dev.read(8192, &mut back).unwrap();
    assert_eq!(back, other, "the vectored write is in the file");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn misaligned_mapped_memory_goes_through_the_page_cache_still_in_place() {
    let (dev, dir) = device("mapped-skew", 1 << 20);
    let data = pattern(13, 8192);
    dev.write(0, &data).unwrap();
    let before = dev.counters();
    let (mut queue, woken, _waker) = open_queue(&dev);
    // 4 bytes past a page (a dword-aligned PRP offset): no device takes
    // that for O_DIRECT.
    let read = BlockRequest::Read {
        offset: 0,
        data: mapped(&[4092, 4100], 4, &[0; 8192]).into(),
    };
    queue.submit(read, 1).unwrap();
    let done = collect(&mut *queue, &woken, 1);
    assert!(done[0].result.is_ok(), "{:?}", done[0].result);
    assert_eq!(mapped_contents(&done[0]), data);
    let c = dev.counters();
    assert_eq!(
        (
            c.buffered_ops - before.buffered_ops,
            c.direct_ops - before.direct_ops,
            c.mapped_ops - before.mapped_ops
        ),
        (1, 0, 1),
        "{c:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_read_into_read_only_mapped_memory_fails_and_leaves_it_alone() {
    let (dev, dir) = device("mapped-ro", 1 << 20);
    dev.write(0, &pattern(14, 4096)).unwrap();
    let (mut queue, _woken, _waker) = open_queue(&dev);
    let mut ro = HeapMemory::new(&[4096], 0, &[7; 4096]);
    ro.writable = false;
    let read = BlockRequest::Read {
        offset: 0,
        data: MappedBuf::new(Box::new(ro)).into(),
    };
    // The ring refuses to start it, so the caller runs it synchronously,
    // which refuses to copy into it.
    let back = queue.submit(read, 1).unwrap_err();
    let done = back.run_on(&dev, 1);
    assert!(done.result.is_err());
    assert_eq!(mapped_contents(&done), vec![7; 4096]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mapped_requests_run_synchronously_copy_through_a_buffer() {
    let (dev, dir) = device("mapped-sync", 1 << 20);
    let data = pattern(15, 12288);
    let write = BlockRequest::Write {
        offset: 4096,
        data: mapped(&[4096, 8192], 0, &data).into(),
        fua: true,
    };
    assert!(write.run_on(&dev, 1).result.is_ok());
    let read = BlockRequest::Read {
        offset: 4096,
        data: mapped(&[12288], 0, &[0; 12288]).into(),
    };
    let done = read.run_on(&dev, 2);
    assert!(done.result.is_ok(), "{:?}", done.result);
    assert_eq!(mapped_contents(&done), data);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `n` reads of 4 KiB from the start of the file, tokens `0..n`.
fn queue_reads(queue: &mut dyn BlockQueue, n: u64) {
    for i in 0..n {
        queue.submit(read(i * 4096, 4096), i).unwrap();
    }
}

#[test]
fn a_pass_of_requests_is_submitted_with_one_call() {
    let (dev, dir) = device("one-submit", 1 << 20);
    dev.write(0, &pattern(5, 16 * 4096)).unwrap();
    let (mut queue, woken, _waker) = open_queue(&dev);
    let before = dev.counters().submit_calls;
    queue_reads(&mut *queue, 16);
    assert_eq!(dev.counters().submit_calls, before, "queued, not submitted");
    assert_eq!(queue.in_flight(), 16);
    queue.commit();
    assert_eq!(
        dev.counters().submit_calls,
        before + 1,
        "one io_uring_enter"
    );
    queue.commit();
    assert_eq!(
        dev.counters().submit_calls,
        before + 1,
        "nothing more to submit"
    );
    let done = succeeded(collect(&mut *queue, &woken, 16));
    let all = pattern(5, 16 * 4096);
    for (token, buf) in done {
        let at = token as usize * 4096;
        assert_eq!(buf.as_deref(), Some(&all[at..at + 4096]), "token {token}");
    }
    assert_eq!(
        dev.counters().submit_calls,
        before + 1,
        "polls submit nothing"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_partial_submit_gives_the_rest_again() {
    let (dev, dir) = device("partial-submit", 1 << 20);
    dev.write(0, &pattern(6, 8 * 4096)).unwrap();
    let (mut queue, woken, _waker) = open_queue(&dev);
    let before = dev.counters();
    dev.inject_submit_fault(crate::SubmitFault {
        take: 3,
        errno: None,
    });
    queue_reads(&mut *queue, 8);
    queue.commit();
    let c = dev.counters();
    assert_eq!(
        c.submit_calls,
        before.submit_calls + 2,
        "3, then the other 5"
    );
    assert_eq!(c.submit_failures, before.submit_failures);
    assert_eq!(succeeded(collect(&mut *queue, &woken, 8)).len(), 8);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_failed_submit_fails_the_requests_not_taken_and_the_others_complete() {
    let (dev, dir) = device("failed-submit", 1 << 20);
    dev.write(0, &pattern(7, 8 * 4096)).unwrap();
    let (mut queue, woken, _waker) = open_queue(&dev);
    let before = dev.counters();
    dev.inject_submit_fault(crate::SubmitFault {
        take: 3,
        errno: Some(libc::EAGAIN),
    });
    queue_reads(&mut *queue, 8);
    queue.commit();
    let c = dev.counters();
    assert_eq!(c.submit_calls, before.submit_calls + 1);
    assert_eq!(c.submit_failures, before.submit_failures + 1);
    assert_eq!(queue.in_flight(), 8, "the failures wait for poll too");
    let mut done = collect(&mut *queue, &woken, 8);
    done.sort_by_key(|c| c.token);
    let all = pattern(7, 8 * 4096);
    assert_eq!(done.len(), 8);
    for c in done {
        let i = c.token as usize;
        if i < 3 {
            assert!(c.result.is_ok(), "token {i} was taken: {:?}", c.result);
            let buf = c.data.and_then(Data::into_buf);
            assert_eq!(buf.as_deref(), Some(&all[i * 4096..(i + 1) * 4096]));
        } else {
            let Err(BlockError::Io(e)) = &c.result else {
                panic!("token {i} was not taken: {:?}", c.result);
            };
            assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "token {i}");
            assert_eq!(
                c.data.as_ref().map(Data::len),
                Some(4096),
                "its buffer back"
            );
        }
    }
    assert_eq!(queue.in_flight(), 0, "nothing left in flight");
    // The broken ring was replaced: requests go to the kernel again.
    queue.submit(read(0, 4096), 9).unwrap();
    let again = succeeded(collect(&mut *queue, &woken, 1));
    assert_eq!(again[&9].as_deref(), Some(&all[..4096]));
    assert_eq!(dev.counters().submit_calls, before.submit_calls + 2);
    let _ = std::fs::remove_dir_all(&dir);
}
