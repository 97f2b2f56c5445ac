//! `vnvme serve` as a process: SIGTERM stops it within 2 s, with its socket
//! removed, whatever the client is doing; and fds a client sends or leaves
//! behind are closed (counted in /proc/PID/fd).

use std::io::Write;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use vnvme_spec::NvmOpcode;
use vnvme_vfio_user::irq;
use vnvme_vfio_user::wire::*;
use zerocopy::IntoBytes;

use crate::guest::*;
use crate::peer::{fds, Peer};
use crate::process::ServeProcess;

/// A guest with I/O queue pair 1 on the server at `path`.
fn ready_at(path: &std::path::Path) -> Guest {
    let mut g = Guest::connect_path(path);
    g.enable();
    g.create_io_pair(1, 64, IOSQ, IOCQ, 1);
    g
}

#[test]
fn sigterm_stops_serve_while_a_connection_stays_silent() {
    let srv = ServeProcess::start(&["--handshake-timeout", "60s"]);
    let _silent = Peer::connect(&srv.path);
    std::thread::sleep(Duration::from_millis(300));
    srv.sigterm();
}

#[test]
fn sigterm_stops_serve_while_a_client_stalls_mid_message() {
    let srv = ServeProcess::start(&["--message-timeout", "60s"]);
    let (mut p, _) = Peer::negotiated(&srv.path);
    p.s.write_all(&[1, 0, 4, 0, 64, 0, 0]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    srv.sigterm();
}

/// The client sends requests and never reads a reply: the server's sends
/// block on a full socket buffer.
#[test]
fn sigterm_stops_serve_while_a_client_never_reads_its_socket() {
    let srv = ServeProcess::start(&["--message-timeout", "60s"]);
    let (p, _) = Peer::negotiated(&srv.path);
    // 64 KiB config space reads: the replies fill our receive buffer.
    p.s.set_nonblocking(true).unwrap();
    let read = RegionAccess {
        offset: 0,
        region: 7,
        count: 4096,
    };
    let mut header = Header {
        msg_id: 0,
        command: cmd::REGION_READ,
        msg_size: (HEADER_SIZE + size_of::<RegionAccess>()) as u32,
        flags: flags::TYPE_COMMAND,
        error: 0,
    };
    for id in 1..4000u16 {
        header.msg_id = id;
        let mut m = header.as_bytes().to_vec();
        m.extend_from_slice(read.as_bytes());
        if (&p.s).write_all(&m).is_err() {
            break;
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    srv.sigterm();
}

#[test]
fn sigterm_stops_serve_with_a_saturated_eventfd_as_interrupt() {
    let srv = ServeProcess::start(&[]);
    let mut g = ready_at(&srv.path);
    let full = fds::eventfd(0xffff_ffff_ffff_fffe);
    g.client
        .set_irqs_eventfds(irq::MSIX, 1, &[full.as_fd()])
        .unwrap();
    for i in 0..16 {
        g.submit(1, rw(NvmOpcode::READ, i, 1, DATA, 0));
    }
    srv.sigterm();
}

#[test]
fn sigterm_stops_serve_after_a_blocking_pipe_was_offered_as_interrupt() {
    let srv = ServeProcess::start(&[]);
    let mut g = ready_at(&srv.path);
    let (_r, w) = fds::pipe();
    assert!(g
        .client
        .set_irqs_eventfds(irq::MSIX, 1, &[w.as_fd()])
        .is_err());
    for i in 0..16 {
        g.submit(1, rw(NvmOpcode::READ, i, 1, DATA, 0));
    }
    srv.sigterm();
}

#[test]
fn sigterm_stops_serve_after_the_client_truncated_its_memory() {
    let srv = ServeProcess::start(&[]);
    let mut g = ready_at(&srv.path);
    let tail = g.stage(1, rw(NvmOpcode::READ, 0, 1, DATA, 0));
    // From here the test must not touch its own mapping of the RAM either.
    rustix::fs::ftruncate(g.ram.fd(), 0).unwrap();
    g.w32(0x1008, u32::from(tail));
    std::thread::sleep(Duration::from_millis(300));
    srv.sigterm();
}

/// A worker waits for the reply to its DMA_READ, which never comes.
#[test]
fn sigterm_stops_serve_while_a_dma_read_is_never_answered() {
    let srv = ServeProcess::start(&[]);
    let (mut p, _) = Peer::negotiated(&srv.path);
    p.dma_map(1, RAM_IOVA, 0x10000, 0, None);
    p.expect_ok(1);
    let q = u32::from(ADMIN_ENTRIES - 1) * 0x1_0001;
    p.region_access(2, cmd::REGION_WRITE, 0, 0x24, 4, &q.to_le_bytes());
    p.region_access(3, cmd::REGION_WRITE, 0, 0x28, 8, &ASQ.to_le_bytes());
    p.region_access(4, cmd::REGION_WRITE, 0, 0x30, 8, &ACQ.to_le_bytes());
    p.region_access(
        5,
        cmd::REGION_WRITE,
        0,
        0x14,
        4,
        &0x0046_0001u32.to_le_bytes(),
    );
    p.region_access(6, cmd::REGION_WRITE, 0, 0x1000, 4, &1u32.to_le_bytes());
    loop {
        let (h, _) = p.recv();
        if !h.is_reply() && h.command == cmd::DMA_READ {
            break;
        }
    }
    srv.sigterm();
}

#[test]
fn sigterm_stops_serve_during_io() {
    let srv = ServeProcess::start(&[]);
    let mut g = ready_at(&srv.path);
    for i in 0..32 {
        g.push(1, rw(NvmOpcode::WRITE, i, 1, DATA, 0));
    }
    srv.sigterm();
}

#[test]
fn two_hundred_connect_disconnect_cycles_leave_the_fd_count_flat() {
    let srv = ServeProcess::start(&[]);
    // One full client first, so lazily opened files are open.
    drop(ready_at(&srv.path));
    std::thread::sleep(Duration::from_millis(200));
    let before = srv.fd_count();
    for i in 0..200 {
        let (mut p, _) = Peer::negotiated(&srv.path);
        if i % 2 == 0 {
            let mem = fds::memfd(0x10000);
            p.dma_map(1, 0x100000, 0x10000, 0, Some(mem.as_fd()));
            p.expect_ok(1);
            let e = fds::eventfd(0);
            p.set_irqs(
                2,
                irq::MSIX,
                VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
                0,
                1,
                &[e.as_fd()],
            );
            p.expect_ok(2);
        }
    }
    drop(ready_at(&srv.path));
    std::thread::sleep(Duration::from_millis(200));
    let after = srv.fd_count();
    assert_eq!(before, after, "fds before and after 200 clients");
    srv.sigterm();
}

#[test]
fn refused_connections_and_unwanted_fds_are_closed() {
    let srv = ServeProcess::start(&[]);
    drop(ready_at(&srv.path));
    std::thread::sleep(Duration::from_millis(200));
    let before = srv.fd_count();
    {
        let (mut owner, _) = Peer::negotiated(&srv.path);
        // Fds with messages that take none, and too many of them.
        let many: Vec<_> = (0..40).map(|_| fds::eventfd(0)).collect();
        let borrowed: Vec<_> = many.iter().map(|f| f.as_fd()).collect();
        for id in 0..20u16 {
            owner.send(
                id,
                cmd::DEVICE_GET_INFO,
                &16u32.to_le_bytes(),
                &borrowed[..(id as usize % 40) + 1],
            );
            owner.expect_errno(id, libc::EINVAL);
        }
        // Extra connections while it owns the device.
        for _ in 0..50 {
            let _ = vnvme_vfio_user::Client::connect(&srv.path);
        }
    }
    // Refused connections linger at most a second.
    std::thread::sleep(Duration::from_millis(1500));
    drop(ready_at(&srv.path));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(before, srv.fd_count(), "fds before and after");
    srv.sigterm();
}

/// A FUSE filesystem (bindfs, run in the foreground) whose daemon the test
/// can stop: reads through it then wait in the kernel without end, as on a
/// network filesystem whose server hangs.
struct HungFs {
    daemon: std::process::Child,
    dir: std::path::PathBuf,
}

impl HungFs {
    fn mount() -> Self {
        let dir = std::env::temp_dir().join(format!("vnvme-hung-fs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("src")).unwrap();
        std::fs::create_dir_all(dir.join("mnt")).unwrap();
        let daemon = std::process::Command::new("bindfs")
            .arg("-f")
            .arg(dir.join("src"))
            .arg(dir.join("mnt"))
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("bindfs (Debian package bindfs; .ci/run installs it) and /dev/fuse are needed");
        let fs = Self { daemon, dir };
        let mnt = fs.mnt().to_string_lossy().into_owned();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(mnt.as_str()))
        {
            assert!(Instant::now() < deadline, "bindfs did not mount {mnt}");
            std::thread::sleep(Duration::from_millis(20));
        }
        fs
    }

    fn mnt(&self) -> std::path::PathBuf {
        self.dir.join("mnt")
    }

    fn signal(&self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.daemon.id() as i32).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
    }
}

impl Drop for HungFs {
    fn drop(&mut self) {
        self.signal(rustix::process::Signal::CONT);
        let _ = std::process::Command::new("fusermount")
            .arg("-u")
            .arg("-z")
            .arg(self.mnt())
            .status();
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A worker waits in a read of a file namespace whose filesystem hangs: a
/// clean stop would wait for it forever, so after --stop-timeout the server
/// exits anyway, with status 1, a log line saying why, and its socket gone.
#[test]
fn sigterm_stops_serve_within_the_stop_timeout_while_a_worker_waits_on_a_hung_filesystem() {
    let fs = HungFs::mount();
    let file = fs.mnt().join("ns.img");
    std::fs::write(&file, vec![0x5A; 1 << 20]).unwrap();
    let ns = format!("{}:file", file.display());
    let mut srv = ServeProcess::start(&["--ns", &ns, "--stop-timeout", "1s"]);
    let mut g = ready_at(&srv.path);
    let mut read = rw(NvmOpcode::READ, 0, 1, DATA, 0);
    read.nsid = 2.into();
    assert!(g.submit(1, read).status().is_success());
    fs.signal(rustix::process::Signal::STOP);
    let mut read = rw(NvmOpcode::READ, 1, 1, DATA, 0);
    read.nsid = 2.into();
    g.push(1, read);
    assert!(
        g.reap_within(1, Duration::from_millis(500)).is_none(),
        "the read of the hung filesystem completed"
    );
    let took = srv.sigterm_exits_within(Duration::from_secs(15));
    // The kernel reaps the process only once the read is answered (an
    // io_uring request holds it): let the filesystem go on first.
    fs.signal(rustix::process::Signal::CONT);
    let status = srv.wait();
    let took = took.unwrap_or_else(|| panic!("still running 15 s after SIGTERM:\n{}", srv.log()));
    assert_eq!(status.code(), Some(1), "{}", srv.log());
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(4),
        "stopped after {took:?}:\n{}",
        srv.log()
    );
    assert!(
        srv.log().contains("did not stop within 1s"),
        "{}",
        srv.log()
    );
    assert!(!srv.path.exists(), "the socket file was left behind");
}
