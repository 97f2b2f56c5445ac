//! One `vnvme serve` process, many controllers (`[[controllers]]` in the
//! configuration), their queues served by a fixed set of poll-group
//! threads: each controller does verified I/O at the same time as the
//! others, a busy one does not starve another, and one client resetting or
//! dying does not disturb the others. Real vfio-user sockets, the
//! project's driver as the client.

mod common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::pattern::pattern;
use common::{temp_dir, Served, BIN};
use vnvme_driver::{Controller, DeviceAccess, InitOptions, IoQueue};

const NSID: u32 = 1;
const BLOCK: usize = 4096;

/// A config file with `n` controllers (64 MiB ram namespace each) on
/// sockets `c0.sock`... in `dir`, served by `workers` poll groups.
fn config(dir: &Path, n: usize, workers: usize) -> (PathBuf, Vec<PathBuf>) {
    let mut text = format!("workers = {workers}\n");
    let mut sockets = Vec::new();
    for i in 0..n {
        let socket = dir.join(format!("c{i}.sock"));
        text.push_str(&format!(
            "\n[[controllers]]\nsocket = \"{}\"\ncontrol = \"{}\"\n\
             [[controllers.namespaces]]\nsize = \"64M\"\n",
            socket.display(),
            dir.join(format!("c{i}.ctl")).display()
        ));
        sockets.push(socket);
    }
    let path = dir.join("serve.toml");
    std::fs::write(&path, text).unwrap();
    (path, sockets)
}

/// `vnvme serve --config FILE`, once every socket is there.
fn serve(config: &Path, sockets: &[PathBuf], log: &Path) -> Served {
    let ready: Vec<&Path> = sockets.iter().map(PathBuf::as_path).collect();
    common::serve_logged(&[OsStr::new("--config"), config.as_os_str()], log, &ready)
}

/// A driver client of the controller at `socket`, with one I/O queue.
fn connect(socket: &Path) -> (Arc<dyn DeviceAccess>, Controller) {
    let access = common::connect(socket)
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", socket.display()));
    let access: Arc<dyn DeviceAccess> = Arc::new(access);
    let ctrl = Controller::init(Arc::clone(&access), init_options()).unwrap();
    (access, ctrl)
}

fn init_options() -> InitOptions {
    InitOptions {
        io_queues: 1,
        queue_depth: 64,
        io_timeout: Duration::from_secs(20),
        ..InitOptions::default()
    }
}

/// Writes `blocks` blocks from `first` with data of `seed`, reads them back
/// and compares: one verified round. Returns the commands completed.
fn verified_round(
    q: &mut IoQueue,
    access: &Arc<dyn DeviceAccess>,
    first: u64,
    blocks: u32,
    seed: u32,
) -> u64 {
    let len = blocks as usize * BLOCK;
    let data = pattern(len, seed);
    let buf = access.dma_alloc(len).unwrap();
    buf.write_bytes(0, &data).unwrap();
    q.write(NSID, first, blocks, &buf).unwrap();
    let mut back = access.dma_alloc(len).unwrap();
    q.read(NSID, first, blocks, &mut back).unwrap();
    let mut got = vec![0; len];
    back.read_bytes(0, &mut got).unwrap();
    assert!(
        got == data,
        "data read back differs (seed {seed}, lba {first})"
    );
    2
}

/// The names of the server's threads (/proc/PID/task/*/comm).
fn thread_names(pid: u32) -> Vec<String> {
    let mut names = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let comm = t.unwrap().path().join("comm");
        if let Ok(n) = std::fs::read_to_string(comm) {
            names.push(n.trim().to_string());
        }
    }
    names
}

#[test]
fn controllers_in_one_process_each_do_verified_io_at_the_same_time() {
    let dir = temp_dir("many-io");
    let (cfg, sockets) = config(&dir, 4, 2);
    let log = dir.join("serve.log");
    let mut server = serve(&cfg, &sockets, &log);
    let clients: Vec<_> = sockets
        .iter()
        .enumerate()
        .map(|(i, socket)| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let (access, ctrl) = connect(&socket);
                let mut q = ctrl.take_io_queue(0).unwrap();
                let mut done = 0;
                for round in 0..40u32 {
                    let seed = (i as u32) << 16 | round;
                    done += verified_round(&mut q, &access, u64::from(round) * 8, 8, seed);
                }
                // Every controller has its own medium: what this client
                // wrote is still there after the others wrote theirs.
                for round in 0..40u32 {
                    let data = pattern(8 * BLOCK, (i as u32) << 16 | round);
                    let mut back = access.dma_alloc(8 * BLOCK).unwrap();
                    q.read(NSID, u64::from(round) * 8, 8, &mut back).unwrap();
                    let mut got = vec![0; 8 * BLOCK];
                    back.read_bytes(0, &mut got).unwrap();
                    assert!(got == data, "controller {i}: round {round} was overwritten");
                }
                drop(q);
                ctrl.shutdown().unwrap();
                done
            })
        })
        .collect();
    for c in clients {
        assert_eq!(c.join().unwrap(), 80);
    }
    // One process, a fixed set of threads: two poll groups, no controller
    // threads of its own.
    let names = thread_names(server_pid(&mut server, &log));
    let groups = names.iter().filter(|n| n.starts_with("vnvme-pg")).count();
    assert_eq!(groups, 2, "{names:?}");
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("vnvme-io") || n == "vnvme-admin"),
        "{names:?}"
    );
    // Each its own identity: four serial numbers.
    let mut serials: Vec<String> = sockets
        .iter()
        .map(|s| {
            let out = common::vnvme(&["id-ctrl", "--json"], s);
            assert!(out.status.success(), "{out:?}");
            common::json(&out)["sn"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    serials.sort();
    serials.dedup();
    assert_eq!(serials.len(), 4, "{serials:?}");
    assert!(server.terminate().success());
}

/// The server's pid (from its log's first line would do; the child's
/// is at hand).
fn server_pid(server: &mut Served, log: &Path) -> u32 {
    assert!(
        server.running(),
        "{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
    server.pid()
}

/// Runs QD `depth` writes and reads on `q` until `stop`, counting
/// completions into `count`. Every read is checked against the block's
/// last write.
fn busy(
    q: &mut IoQueue,
    access: &Arc<dyn DeviceAccess>,
    depth: u16,
    stop: &AtomicBool,
    count: &AtomicU64,
) {
    let bufs: Vec<_> = (0..depth)
        .map(|i| {
            let b = access.dma_alloc(BLOCK).unwrap();
            b.write_bytes(0, &pattern(BLOCK, u32::from(i))).unwrap();
            b
        })
        .collect();
    for (i, b) in bufs.iter().enumerate() {
        q.write(NSID, i as u64, 1, b).unwrap();
    }
    let mut out = Vec::new();
    let mut in_flight = 0usize;
    let mut next = 0usize;
    while !stop.load(Ordering::Relaxed) || in_flight > 0 {
        while in_flight < usize::from(depth) && !stop.load(Ordering::Relaxed) {
            let i = next % bufs.len();
            q.submit_write(NSID, i as u64, 1, &bufs[i]).unwrap();
            in_flight += 1;
            next += 1;
        }
        out.clear();
        let n = q.wait(&mut out, 64, Duration::from_secs(20)).unwrap();
        assert!(n > 0 || in_flight == 0, "no completion within 20 s");
        for c in &out {
            assert!(c.status().is_success(), "{c:?}");
        }
        in_flight -= n;
        count.fetch_add(n as u64, Ordering::Relaxed);
    }
}

#[test]
fn a_busy_controller_does_not_starve_one_that_becomes_busy() {
    let dir = temp_dir("many-fair");
    // One poll group: both controllers' queues on one thread.
    let (cfg, sockets) = config(&dir, 2, 1);
    let log = dir.join("serve.log");
    let server = serve(&cfg, &sockets, &log);
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let busy_client = {
        let (socket, stop, count) = (sockets[0].clone(), stop.clone(), count.clone());
        std::thread::spawn(move || {
            let (access, ctrl) = connect(&socket);
            let mut q = ctrl.take_io_queue(0).unwrap();
            busy(&mut q, &access, 32, &stop, &count);
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while count.load(Ordering::Relaxed) < 2000 {
        assert!(
            Instant::now() < deadline,
            "the busy controller did not get going"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The second controller, idle until now, does its work while the first
    // keeps its queue full.
    let (access, ctrl) = connect(&sockets[1]);
    let mut q = ctrl.take_io_queue(0).unwrap();
    let before = count.load(Ordering::Relaxed);
    let mut done = 0;
    for round in 0..250u32 {
        done += verified_round(&mut q, &access, u64::from(round % 64) * 4, 4, round);
    }
    let during = count.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    busy_client.join().unwrap();
    // All 500 of the second's commands completed (each read checked), and
    // the first went on meanwhile: neither starved the other.
    assert_eq!(done, 500);
    assert!(
        during > 0,
        "the busy controller stopped while the other ran"
    );
    eprintln!("while the second controller ran 500 commands, the first completed {during}");
    drop(server);
}

#[test]
fn one_client_resetting_or_dying_does_not_disturb_the_others() {
    let dir = temp_dir("many-death");
    let (cfg, sockets) = config(&dir, 3, 1);
    let log = dir.join("serve.log");
    let mut server = serve(&cfg, &sockets, &log);
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Vec<Arc<AtomicU64>> = (0..2).map(|_| Arc::default()).collect();
    let others: Vec<_> = sockets[1..]
        .iter()
        .zip(&counts)
        .enumerate()
        .map(|(k, (socket, count))| {
            let (socket, stop, count) = (socket.clone(), stop.clone(), count.clone());
            std::thread::spawn(move || {
                let (access, ctrl) = connect(&socket);
                let mut q = ctrl.take_io_queue(0).unwrap();
                let mut round = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let seed = (k as u32 + 1) << 20 | round;
                    let n = verified_round(&mut q, &access, u64::from(round % 256) * 2, 2, seed);
                    count.fetch_add(n, Ordering::Relaxed);
                    round += 1;
                }
            })
        })
        .collect();
    let progressed = |what: &str| {
        let start: Vec<u64> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let now: Vec<u64> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
            if now.iter().zip(&start).all(|(n, s)| *n >= s + 100) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the other controllers stalled after {what}: {start:?} -> {now:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    progressed("starting");
    // The first client resets its controller (a second initialisation:
    // CC.EN = 0, wait for RDY = 0, enable again) and goes on.
    let (access, ctrl) = connect(&sockets[0]);
    let mut q = ctrl.take_io_queue(0).unwrap();
    verified_round(&mut q, &access, 0, 8, 1);
    drop(q);
    drop(ctrl);
    let ctrl = Controller::init(Arc::clone(&access), init_options()).unwrap();
    let mut q = ctrl.take_io_queue(0).unwrap();
    verified_round(&mut q, &access, 0, 8, 2);
    progressed("a reset of another controller");
    // Then it dies with commands in flight: its socket closes without a
    // shutdown, as when the kernel closes a killed client's fds.
    let buf = access.dma_alloc(BLOCK).unwrap();
    for lba in 0..32 {
        q.submit_write(NSID, lba, 1, &buf).unwrap();
    }
    drop((q, buf, ctrl, access));
    progressed("another controller's client died");
    // Its controller takes a new client.
    let (access, ctrl) = connect(&sockets[0]);
    let mut q = ctrl.take_io_queue(0).unwrap();
    verified_round(&mut q, &access, 64, 8, 3);
    progressed("another controller's new client");
    stop.store(true, Ordering::Relaxed);
    for t in others {
        t.join().unwrap();
    }
    assert!(
        server.running(),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(server.terminate().success());
    // No poll-group thread kept a gone client's memory: its DMA_UNMAPs
    // did not have to wait.
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!log.contains("still held the map"), "{log}");
}

#[test]
fn the_same_identifier_in_two_controllers_is_refused() {
    let dir = temp_dir("many-dup");
    let text = format!(
        "[[controllers]]\nsocket = \"{a}\"\n[[controllers.namespaces]]\nsize = \"1M\"\n\
         nguid = \"00112233445566778899aabbccddeeff\"\n\n\
         [[controllers]]\nsocket = \"{b}\"\n[[controllers.namespaces]]\nsize = \"1M\"\n\
         nguid = \"00112233445566778899aabbccddeeff\"\n",
        a = dir.join("a.sock").display(),
        b = dir.join("b.sock").display()
    );
    let cfg = dir.join("dup.toml");
    std::fs::write(&cfg, text).unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("controllers[0]")
            && err.contains("controllers[1]")
            && err.contains("same NGUID"),
        "{err}"
    );
    assert!(!dir.join("a.sock").exists() && !dir.join("b.sock").exists());
}

/// A config file with `n` controllers (1 MiB ram namespace each, no
/// control socket: a control socket has a thread) on sockets `c0.sock`...
/// in `dir`, one poll group.
fn small_config(dir: &Path, n: usize) -> (PathBuf, Vec<PathBuf>) {
    let mut text = String::from("workers = 1\n");
    let mut sockets = Vec::new();
    for i in 0..n {
        let socket = dir.join(format!("c{i}.sock"));
        text.push_str(&format!(
            "\n[[controllers]]\nsocket = \"{}\"\n[[controllers.namespaces]]\nsize = \"1M\"\n",
            socket.display(),
        ));
        sockets.push(socket);
    }
    let path = dir.join("serve.toml");
    std::fs::write(&path, text).unwrap();
    (path, sockets)
}

#[test]
fn the_server_has_a_fixed_set_of_threads_whatever_the_number_of_controllers() {
    for n in [8, 64] {
        let dir = temp_dir(&format!("many-threads-{n}"));
        let (cfg, sockets) = small_config(&dir, n);
        let log = dir.join("serve.log");
        let mut server = serve(&cfg, &sockets, &log);
        // Four clients enable their controllers: each arms its keep alive
        // timer (it had a thread per enable), and each is a connection
        // (it had a thread per controller).
        let clients: Vec<_> = sockets[..4].iter().map(|s| connect(s)).collect();
        let pid = server_pid(&mut server, &log);
        // A CC write (the enable) is handled on a helper thread, which
        // ends once it has replied: looked at again until it has.
        let mut looks = 0;
        let names = loop {
            let names = thread_names(pid);
            if !names.iter().any(|n| n == "vnvme-helper") {
                break names;
            }
            looks += 1;
            assert!(looks < 10_000, "a helper thread stays: {names:?}");
            std::thread::sleep(Duration::from_millis(1));
        };
        let count = |name: &str| names.iter().filter(|n| *n == name).count();
        // Before: a connection thread per controller ("vnvme-conn").
        assert_eq!(count("vnvme-conns"), 1, "{names:?}");
        assert_eq!(count("vnvme-conn"), 0, "{names:?}");
        assert_eq!(count("vfio-user-doors"), 1, "{names:?}");
        assert_eq!(count("vfio-user-door"), 0, "{names:?}");
        assert_eq!(count("vnvme-keepalive"), 1, "{names:?}");
        assert_eq!(count("vnvme-pg0"), 1, "{names:?}");
        // And the main thread and the stop watch: 6 in all, for 8 or 64.
        assert_eq!(names.len(), 6, "{names:?}");
        for (_, ctrl) in clients {
            ctrl.shutdown().unwrap();
        }
        assert!(server.terminate().success());
    }
}

/// A VERSION request's bytes (header and payload) as a client sends it.
fn version_request(msg_id: u16) -> Vec<u8> {
    let payload = b"\x00\x00\x00\x00{}\x00";
    let size = (16 + payload.len()) as u32;
    let mut m = Vec::new();
    m.extend_from_slice(&msg_id.to_ne_bytes());
    m.extend_from_slice(&1u16.to_ne_bytes()); // VERSION
    m.extend_from_slice(&size.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes()); // a command
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(payload);
    m
}

/// A REGION_READ of the 4 bytes of PCI config space at 0 (its IDs).
fn config_read(msg_id: u16) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&msg_id.to_ne_bytes());
    m.extend_from_slice(&9u16.to_ne_bytes()); // REGION_READ
    m.extend_from_slice(&32u32.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&0u64.to_ne_bytes()); // offset
    m.extend_from_slice(&7u32.to_ne_bytes()); // the config region
    m.extend_from_slice(&4u32.to_ne_bytes()); // count
    m
}

#[test]
fn hostile_connections_at_one_controller_hold_up_no_other() {
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    let dir = temp_dir("many-hostile");
    let (cfg, sockets) = small_config(&dir, 5);
    let log = dir.join("serve.log");
    let mut server = serve(&cfg, &sockets, &log);
    // Controller 0: a client that sends half a VERSION header and stops,
    // and a crowd behind it that says nothing (they wait at its door, or
    // are refused); controller 1: a connection that never speaks.
    let mut half = UnixStream::connect(&sockets[0]).unwrap();
    half.write_all(&[0u8; 8]).unwrap();
    let crowd: Vec<UnixStream> = (0..24)
        .map(|_| UnixStream::connect(&sockets[0]).unwrap())
        .collect();
    let silent = UnixStream::connect(&sockets[1]).unwrap();
    // Controller 3: a client that negotiates, then sends a request's
    // header and half its payload, and stops.
    let mut half_payload = UnixStream::connect(&sockets[3]).unwrap();
    half_payload.write_all(&version_request(0)).unwrap();
    half_payload.write_all(&config_read(1)[..24]).unwrap();
    // Controller 4: a client that negotiates, then asks and asks and never
    // reads a reply: its socket's buffer fills, its replies queue, and
    // past the bound it is closed (a write of ours then fails).
    let flood = UnixStream::connect(&sockets[4]).unwrap();
    let flooding = std::thread::spawn(move || {
        let mut flood = flood;
        flood.write_all(&version_request(0)).unwrap();
        let mut sent = 0u32;
        for id in 1..20_000u16 {
            if flood.write_all(&config_read(id)).is_err() {
                return (sent, flood);
            }
            sent += 1;
        }
        (sent, flood)
    });
    // Controllers 1 and 2 serve clients meanwhile, whole: controller 1's
    // takes the silent connection's place, controller 2 is untouched.
    for socket in &sockets[1..3] {
        let (access, ctrl) = connect(socket);
        let mut q = ctrl.take_io_queue(0).unwrap();
        assert_eq!(verified_round(&mut q, &access, 0, 8, 7), 2);
        drop(q);
        ctrl.shutdown().unwrap();
    }
    // The flooding client was closed, not served forever, and not by a
    // blocked send: the server said why.
    let (sent, flood) = flooding.join().unwrap();
    assert!(sent < 19_999, "all {sent} requests were taken");
    let said = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        said.matches("closing a vfio-user connection that does not read its replies")
            .count(),
        1,
        "{said}"
    );
    drop((half, crowd, silent, half_payload, flood));
    // And controller 0 serves a client once its hostile ones are gone.
    let (access, ctrl) = connect(&sockets[0]);
    let mut q = ctrl.take_io_queue(0).unwrap();
    assert_eq!(verified_round(&mut q, &access, 0, 8, 8), 2);
    drop(q);
    ctrl.shutdown().unwrap();
    assert!(
        server.running(),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(server.terminate().success());
}
