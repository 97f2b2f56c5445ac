//! Crash recovery's open question (docs/crash-recovery.md):
//! does `waitpid` on a server killed with io_uring writes in flight return
//! only once the kernel is done with them? If a write could land after it,
//! a new server's retry of the same blocks could be undone by the dead
//! one's write. The `file` backend writes through io_uring, O_DIRECT where
//! the file system allows (block-layer requests) and else buffered (which
//! io_uring may hand to its io-wq worker threads).
//!
//! A child (this test binary, run again) submits 128 writes of 1 MiB of a
//! pattern over a file and is SIGKILLed while they are in flight. Between
//! the kill and `waitpid` the parent counts the writes not landed yet (the
//! evidence that requests were in flight); as soon as `waitpid` returns it
//! takes a picture of the file, waits 300 ms and takes another: if the
//! kernel still wrote for the dead process after the first picture, the
//! two differ. Every read is O_DIRECT, so the pictures are what the
//! storage holds, not page-cache pages read before a direct write landed
//! (reading through the page cache showed a change that was only that).
//! Rounds repeat until two had writes in flight at the kill, at most 40.
//!
//! Found on Linux 6.18 (ext4 on virtio): direct writes in flight at the
//! kill had all landed when `waitpid` returned (the exiting task waits for
//! them); io-wq writes were cancelled (most never landed) and none landed
//! later. Nothing changed after `waitpid` in any round.

use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

/// One write: 1 MiB.
const CHUNK: usize = 1 << 20;
/// Writes submitted at once.
const WRITES: usize = 128;
const CHILD: &str = "VNVME_URING_EXIT_CHILD";

/// The child's side: `VNVME_URING_EXIT_CHILD=PATH,direct|async`.
fn child(spec: &str) {
    let (path, how) = spec.split_once(',').unwrap();
    let direct = how == "direct";
    let file = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(if direct { libc::O_DIRECT } else { 0 })
        .open(path)
        .unwrap();
    // Aligned for O_DIRECT: an anonymous mapping.
    let len = CHUNK * WRITES;
    let buf = unsafe {
        // SAFETY: a fresh private anonymous mapping, used only here.
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(buf, libc::MAP_FAILED);
    // SAFETY: the mapping is len bytes, writable, and ours.
    unsafe { std::ptr::write_bytes(buf.cast::<u8>(), 0xA5, len) };
    let mut ring = io_uring::IoUring::new(WRITES as u32).unwrap();
    for i in 0..WRITES {
        let mut sqe = io_uring::opcode::Write::new(
            io_uring::types::Fd(file.as_raw_fd()),
            // SAFETY: within the mapping.
            unsafe { buf.cast::<u8>().add(i * CHUNK) },
            CHUNK as u32,
        )
        .offset((i * CHUNK) as u64)
        .build()
        .user_data(i as u64);
        if !direct {
            // To the io-wq worker threads, as a buffered write that would
            // block goes.
            sqe = sqe.flags(io_uring::squeue::Flags::ASYNC);
        }
        // SAFETY: the buffer and the file outlive the ring (the process is
        // killed with both).
        unsafe { ring.submission().push(&sqe).unwrap() };
    }
    ring.submit().unwrap();
    println!("submitted");
    std::thread::sleep(Duration::from_secs(60));
}

/// A 4 KiB-aligned buffer of `len` bytes, for O_DIRECT reads.
struct Aligned(*mut u8, std::alloc::Layout);

impl Aligned {
    fn new(len: usize) -> Self {
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: a non-zero size.
        Self(unsafe { std::alloc::alloc_zeroed(layout) }, layout)
    }
    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: allocated with this size, owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.0, self.1.size()) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout.
        unsafe { std::alloc::dealloc(self.0, self.1) }
    }
}

/// The file, read with O_DIRECT: what the storage holds, not a page
/// cache that may hold pages read before a direct write landed.
fn direct(path: &std::path::Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap()
}

/// Per chunk: how many of its bytes hold the pattern.
fn picture(path: &std::path::Path) -> Vec<usize> {
    use std::os::unix::fs::FileExt;
    let f = direct(path);
    let mut buf = Aligned::new(CHUNK);
    (0..WRITES)
        .map(|i| {
            f.read_exact_at(buf.bytes(), (i * CHUNK) as u64).unwrap();
            buf.bytes().iter().filter(|&&b| b == 0xA5).count()
        })
        .collect()
}

/// How many chunks do not start with 4 KiB of the pattern.
fn heads_unwritten(path: &std::path::Path) -> usize {
    use std::os::unix::fs::FileExt;
    let f = direct(path);
    let mut head = Aligned::new(4096);
    (0..WRITES)
        .filter(|i| {
            f.read_exact_at(head.bytes(), (i * CHUNK) as u64).unwrap();
            head.bytes().iter().any(|&b| b != 0xA5)
        })
        .count()
}

fn rounds(how: &str) {
    let dir = std::env::temp_dir().join(format!("vnvme-uring-exit-{}-{how}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("file");
    let mut pending_seen = 0;
    for round in 0..40 {
        let f = std::fs::File::create(&path).unwrap();
        f.set_len((CHUNK * WRITES) as u64).unwrap();
        f.sync_all().unwrap();
        drop(f);
        let mut c = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "the_child", "--nocapture", "--test-threads=1"])
            .env(CHILD, format!("{},{how}", path.display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(c.stdout.take().unwrap());
        let mut line = String::new();
        loop {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "the child ended");
            // After the harness's "test the_child ... ", on its line.
            if line.trim_end().ends_with("submitted") {
                break;
            }
        }
        c.kill().unwrap();
        // Between the kill and waitpid: which writes have not landed yet
        // (their first 4 KiB), the evidence that requests were in flight.
        let pending = heads_unwritten(&path);
        let status = c.wait().unwrap();
        assert!(!status.success());
        let at_wait = picture(&path);
        std::thread::sleep(Duration::from_millis(300));
        let later = picture(&path);
        let changed: Vec<String> = at_wait
            .iter()
            .zip(&later)
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .map(|(i, (a, b))| format!("chunk {i}: {a} -> {b} bytes"))
            .collect();
        assert!(
            changed.is_empty(),
            "round {round} ({how}): {pending} writes had not landed just after the kill; the \
             dead child's writes changed the file after waitpid: {changed:?}"
        );
        let unwritten = at_wait.iter().filter(|&&n| n < CHUNK).count();
        eprintln!(
            "round {round} ({how}): {pending} of {WRITES} writes not landed just after the kill, \
             {unwritten} not whole at waitpid, none changed after"
        );
        if pending > 0 {
            pending_seen += 1;
            if pending_seen >= 2 {
                break;
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        pending_seen > 0,
        "no round had writes in flight at the kill: the test showed nothing"
    );
}

/// Not a test by itself: the child's body, run by the tests below.
#[test]
fn the_child() {
    if let Ok(spec) = std::env::var(CHILD) {
        child(&spec);
    }
}

#[test]
fn waitpid_returns_after_the_dead_childs_direct_writes() {
    rounds("direct");
}

#[test]
fn waitpid_returns_after_the_dead_childs_io_wq_writes() {
    rounds("async");
}
