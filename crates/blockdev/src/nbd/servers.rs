//! The client against real NBD servers nobody here wrote, started by each
//! test: nbdkit's memory plugin and qemu-nbd exporting a qcow2 file.
//! Both must be installed (`.ci/run` installs them); a test fails, never
//! skips, without them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::*;
use crate::mapped::tests::HeapMemory;
use crate::{BlockCompletion, BlockRequest, MappedBuf};

const MIB: u64 = 1 << 20;

fn timeouts() -> Timeouts {
    Timeouts {
        connect: Duration::from_secs(5),
        io: Duration::from_secs(3),
        retry: Duration::from_millis(200),
    }
}

/// A fresh scratch folder for one test, removed after it.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

fn scratch(name: &str) -> Scratch {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "vnvme-nbd-{name}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// A server process, killed when dropped.
struct Server {
    child: Child,
}

impl Server {
    /// Starts `program args` and waits until `socket` accepts connections.
    fn start(program: &str, args: &[&str], socket: &Path) -> Self {
        let _ = std::fs::remove_file(socket);
        let child = Process::new(program)
            .args(args)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run {program} ({e}): install it (apt-get install nbdkit qemu-utils; .ci/run does)")
            });
        let server = Server { child };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(socket).is_err() {
            assert!(
                Instant::now() < deadline,
                "{program} did not listen on {}",
                socket.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// nbdkit's memory plugin, `size` bytes, logging connections to `log`.
    fn nbdkit_memory(socket: &Path, size: &str, log: &Path) -> Self {
        let log = format!("logfile={}", log.display());
        let size = format!("size={size}");
        let args = [
            "--foreground",
            "--exit-with-parent",
            "--unix",
            socket.to_str().unwrap(),
        ];
        let mut all = args.to_vec();
        all.extend(["--filter=log", "memory", &size, &log]);
        Self::start("nbdkit", &all, socket)
    }

    /// qemu-nbd exporting the qcow2 file `image` as `disk`.
    fn qemu_nbd(socket: &Path, image: &Path) -> Self {
        let args = [
            "--format=qcow2",
            "--socket",
            socket.to_str().unwrap(),
            "--export-name=disk",
            "--persistent",
            "--shared=8",
            "--cache=writeback",
            image.to_str().unwrap(),
        ];
        Self::start("qemu-nbd", &args, socket)
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn qcow2(dir: &Path, size: &str) -> PathBuf {
    let image = dir.join("disk.qcow2");
    let status = Process::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", image.to_str().unwrap(), size])
        .status()
        .expect("qemu-img is missing: install qemu-utils (.ci/run does)");
    assert!(status.success());
    image
}

fn unix_uri(socket: &Path, export: &str) -> String {
    format!("nbd+unix:///{export}?socket={}", socket.display())
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// Polls `q` until `n` completions arrived; panics after 20 s (a hang).
fn reap(q: &mut Box<dyn BlockQueue>, n: usize) -> Vec<BlockCompletion> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while out.len() < n {
        assert!(
            Instant::now() < deadline,
            "{} of {n} completions",
            out.len()
        );
        if q.poll(&mut out, n) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    out
}

/// The synchronous calls: reads see writes, FUA, flush, Write Zeroes and
/// Deallocate read back as zeroes, ranges are checked.
fn exercise_sync(dev: &NbdDevice) {
    let data = pattern(1, 12288);
    dev.write(4096, &data).unwrap();
    let mut back = vec![0; 12288];
    dev.read(4096, &mut back).unwrap();
    assert_eq!(back, data);
    dev.write_fua(8192, &pattern(2, 4096)).unwrap();
    dev.flush().unwrap();
    dev.read(8192, &mut back[..4096]).unwrap();
    assert_eq!(back[..4096], pattern(2, 4096)[..]);
    dev.write_zeroes(4096, 4096).unwrap();
    dev.discard(12288, 4096).unwrap();
    dev.read(4096, &mut back).unwrap();
    assert!(back[..4096].iter().all(|&b| b == 0), "write zeroes");
    assert_eq!(back[4096..8192], pattern(2, 4096)[..], "untouched");
    assert!(
        back[8192..].iter().all(|&b| b == 0),
        "deallocate reads as zeroes"
    );
    let mut big = vec![0; 4096];
    assert!(matches!(
        dev.read(dev.size(), &mut big),
        Err(BlockError::OutOfRange { .. })
    ));
}

/// A queue: 32 writes from buffers and from mapped memory, a FUA write
/// and a flush in flight at once, then 32 reads into both kinds.
fn exercise_queue(dev: &NbdDevice, seed: u8) {
    let mut q = dev.queue(Arc::new(|| {})).unwrap();
    for i in 0..32u64 {
        let bytes = pattern(seed.wrapping_add(i as u8), 4096);
        let data = if i % 2 == 0 {
            let mut b = IoBuf::zeroed(4096);
            b.copy_from_slice(&bytes);
            Data::Buf(b)
        } else {
            Data::Mapped(MappedBuf::new(Box::new(HeapMemory::new(
                &[1000, 3096],
                0,
                &bytes,
            ))))
        };
        let request = BlockRequest::Write {
            offset: i * 4096,
            data,
            fua: i == 31,
        };
        q.submit(request, i).unwrap();
    }
    q.submit(BlockRequest::Flush, 99).unwrap();
    for c in reap(&mut q, 33) {
        c.result.unwrap();
    }
    for i in 0..32u64 {
        let data = if i % 2 == 0 {
            Data::Buf(IoBuf::zeroed(4096))
        } else {
            Data::Mapped(MappedBuf::new(Box::new(HeapMemory::new(
                &[4096],
                0,
                &[0; 4096],
            ))))
        };
        q.submit(
            BlockRequest::Read {
                offset: i * 4096,
                data,
            },
            i,
        )
        .unwrap();
    }
    for c in reap(&mut q, 32) {
        c.result.unwrap();
        let mut got = vec![0; 4096];
        match c.data.unwrap() {
            Data::Buf(b) => got.copy_from_slice(&b),
            Data::Mapped(m) => m.copy_to(&mut got).unwrap(),
        }
        assert_eq!(
            got,
            pattern(seed.wrapping_add(c.token as u8), 4096),
            "block {}",
            c.token
        );
    }
}

#[test]
fn nbdkit_memory_export_serves_a_namespace() {
    let dir = scratch("nbdkit");
    let socket = dir.join("nbd.sock");
    let _server = Server::nbdkit_memory(&socket, "64M", &dir.join("log"));
    let dev = NbdDevice::open_with(&unix_uri(&socket, ""), None, timeouts()).unwrap();
    assert_eq!(dev.size(), 64 * MIB, "the size is the export's");
    exercise_sync(&dev);
    exercise_queue(&dev, 7);
    let err =
        NbdDevice::open_with(&unix_uri(&socket, ""), Some(128 * MIB), timeouts()).unwrap_err();
    assert!(err.to_string().contains("is 67108864 bytes"), "{err}");
}

#[test]
fn nbdkit_multi_conn_gives_each_queue_a_connection() {
    let dir = scratch("multi");
    let socket = dir.join("nbd.sock");
    let log = dir.join("log");
    let _server = Server::nbdkit_memory(&socket, "16M", &log);
    let dev = NbdDevice::open_with(&unix_uri(&socket, ""), None, timeouts()).unwrap();
    assert!(dev.multi_conn(), "nbdkit's memory plugin offers multi-conn");
    let mut a = dev.queue(Arc::new(|| {})).unwrap();
    let mut b = dev.queue(Arc::new(|| {})).unwrap();
    let mut buf = IoBuf::zeroed(4096);
    buf.copy_from_slice(&pattern(5, 4096));
    let write = BlockRequest::Write {
        offset: 0,
        data: Data::Buf(buf),
        fua: false,
    };
    a.submit(write, 1).unwrap();
    reap(&mut a, 1).pop().unwrap().result.unwrap();
    let read = BlockRequest::Read {
        offset: 0,
        data: Data::Buf(IoBuf::zeroed(4096)),
    };
    b.submit(read, 2).unwrap();
    let done = reap(&mut b, 1).pop().unwrap();
    done.result.unwrap();
    assert_eq!(
        &*done.data.unwrap().into_buf().unwrap(),
        &pattern(5, 4096)[..]
    );
    // The queues' own connections open in the background.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(&log).unwrap();
        let connections = text.lines().filter(|l| l.contains("Connect ")).count();
        if connections == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the device's and one per queue:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn qemu_nbd_qcow2_export_keeps_data_across_a_server_restart() {
    let dir = scratch("qemu");
    let socket = dir.join("nbd.sock");
    let image = qcow2(&dir, "32M");
    let server = Server::qemu_nbd(&socket, &image);
    let uri = unix_uri(&socket, "disk");
    let dev = NbdDevice::open_with(&uri, None, timeouts()).unwrap();
    assert_eq!(dev.size(), 32 * MIB);
    exercise_sync(&dev);
    exercise_queue(&dev, 3);
    dev.write(0, &pattern(9, 4096)).unwrap();
    dev.flush().unwrap();

    server.kill();
    let mut back = vec![0; 4096];
    let start = Instant::now();
    assert!(dev.read(0, &mut back).is_err(), "the server is gone");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "fails fast: {:?}",
        start.elapsed()
    );

    let _server = Server::qemu_nbd(&socket, &image);
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(e) = dev.read(0, &mut back) {
        assert!(Instant::now() < deadline, "no reconnection: {e}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(back, pattern(9, 4096), "flushed data survived the restart");
}

/// Keeps 16 reads in flight on `q` for a while; how many ended well and
/// how many failed.
fn run(q: &mut Box<dyn BlockQueue>, for_how_long: Duration) -> (usize, usize) {
    let (mut ok, mut failed, mut token) = (0, 0, 0u64);
    let mut count = |c: BlockCompletion| {
        if c.result.is_ok() {
            ok += 1
        } else {
            failed += 1
        }
    };
    let end = Instant::now() + for_how_long;
    while Instant::now() < end {
        while q.in_flight() < 16 {
            let data = Data::Buf(IoBuf::zeroed(4096));
            let offset = (token % 4096) * 4096;
            q.submit(BlockRequest::Read { offset, data }, token)
                .unwrap();
            token += 1;
        }
        reap(q, 1).into_iter().for_each(&mut count);
    }
    let rest = q.in_flight();
    reap(q, rest).into_iter().for_each(&mut count);
    (ok, failed)
}

#[test]
fn nbdkit_killed_and_restarted_under_io() {
    let dir = scratch("restart");
    let socket = dir.join("nbd.sock");
    let log = dir.join("log");
    let server = Server::nbdkit_memory(&socket, "16M", &log);
    let dev = NbdDevice::open_with(&unix_uri(&socket, ""), None, timeouts()).unwrap();
    let mut q = dev.queue(Arc::new(|| {})).unwrap();
    let (ok, failed) = run(&mut q, Duration::from_millis(300));
    assert!(ok > 0 && failed == 0, "ok {ok} failed {failed}");

    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        server.kill();
    });
    // `reap` panics if any request hangs for 20 s.
    let (_, failed) = run(&mut q, Duration::from_millis(800));
    killer.join().unwrap();
    assert!(failed > 0, "requests fail while the server is away");

    let _server = Server::nbdkit_memory(&socket, "16M", &log);
    let (ok, _) = run(&mut q, Duration::from_secs(1));
    assert!(ok > 0, "I/O resumes once the server is back");
    let (ok, failed) = run(&mut q, Duration::from_millis(300));
    assert!(
        ok > 0 && failed == 0,
        "and keeps going: ok {ok} failed {failed}"
    );
}
