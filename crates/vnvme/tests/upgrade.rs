//! Live upgrade (issue 35 item 2) of a real `vnvme serve`, driven by our
//! driver over its vfio-user socket: verified I/O keeps running across
//! upgrades in every doorbell mode (no error, no lost or repeated command,
//! no reset: the driver's queues simply go on), and the cases where an
//! upgrade must be refused with the old server serving on: a new binary
//! that exits, two upgrades asked at once, a `ram` namespace, a namespace
//! added at run time. What the operator set (QoS limits, the metrics
//! socket, the service manager's main PID) follows the upgrade. A handover
//! that is corrupt or truncated: tests/upgrade_hostile.rs; commands held
//! back at the upgrade (once refused, now handed over):
//! tests/upgrade_held.rs.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::io_thread::IoThread;
use common::rounds::{self, block, reap, BLOCK};
use common::{ctl, temp_dir, TempDir, BIN};
use serde_json::Value;
use vnvme_driver::{Controller, DeviceAccess, IoQueue, VfioUserAccess};
use vnvme_spec::NvmOpcode;

/// Blocks the I/O thread writes and reads back, round after round.
const BLOCKS: u64 = 64;

/// A server started for a test, and whichever process serves now.
struct Rig {
    dir: TempDir,
    socket: PathBuf,
    control: PathBuf,
    first: Child,
    /// The pid serving now (the first's, then each upgrade's new one).
    pid: u32,
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(self.pid as i32).expect("pid"),
            rustix::process::Signal::KILL,
        );
        let _ = self.first.kill();
        let _ = self.first.wait();
    }
}

fn rig(name: &str, args: &[&str]) -> Rig {
    rig_env(name, args, &[])
}

/// [`rig`] with these environment variables set for the server.
fn rig_env(name: &str, args: &[&str], env: &[(&str, &Path)]) -> Rig {
    let dir = temp_dir(name);
    let socket = dir.join("vnvme.sock");
    let control = dir.join("control.sock");
    let log = std::fs::File::create(dir.join("serve.log")).unwrap();
    let first = Command::new(BIN)
        .args(["serve", "--socket"])
        .arg(&socket)
        .arg("--control")
        .arg(&control)
        .args(args)
        .envs(env.iter().copied())
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(socket.exists() && control.exists()) {
        assert!(
            Instant::now() < deadline,
            "serve did not create its sockets"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = first.id();
    Rig {
        dir,
        socket,
        control,
        first,
        pid,
    }
}

impl Rig {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
    }

    /// Upgrades; returns the report (the new pid is served from then on).
    fn upgrade(&mut self, extra: &[&str]) -> Value {
        let mut args = vec!["--json", "upgrade"];
        args.extend_from_slice(extra);
        let out = ctl(&self.control, &args);
        assert!(
            out.status.success(),
            "upgrade: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        let pid = report["pid"].as_u64().unwrap() as u32;
        assert_ne!(pid, self.pid, "{report}");
        self.pid = pid;
        report
    }

    /// An upgrade that must be refused: the message.
    fn refused(&self, extra: &[&str]) -> String {
        let mut args = vec!["upgrade"];
        args.extend_from_slice(extra);
        let out = ctl(&self.control, &args);
        assert!(!out.status.success(), "upgrade {extra:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// Our driver as the client: its memory, the controller and its
    /// first I/O queue.
    fn client(&self) -> (Arc<VfioUserAccess>, Controller, IoQueue) {
        common::client::default_client(&self.socket)
    }

    fn alive(&self) -> bool {
        rustix::process::test_kill_process(
            rustix::process::Pid::from_raw(self.pid as i32).expect("pid"),
        )
        .is_ok()
    }
}

/// Verified I/O on a thread while the main thread upgrades `upgrades`
/// times; returns the reports and the rounds done.
fn io_across_upgrades(r: &mut Rig, upgrades: usize) -> (Vec<Value>, u64) {
    let (access, ctrl, q) = r.client();
    let io = IoThread::start(access.clone(), q, BLOCKS, 0);
    let mut reports = Vec::new();
    for _ in 0..upgrades {
        // I/O running before each upgrade.
        io.wait_more(2, &|| r.log());
        reports.push(r.upgrade(&[]));
    }
    io.wait_more(2, &|| r.log());
    let (q, rounds) = io.finish(&|| r.log());
    drop(q);
    // The controller was never reset: still enabled and ready, and the
    // admin queue answers as before.
    let csts = access.read32(0x1c).unwrap();
    assert_eq!(csts & 1, 1, "CSTS.RDY");
    assert_eq!(csts & 2, 0, "CSTS.CFS");
    let admin = ctrl.admin_commands();
    assert_eq!(ctrl.rescan().unwrap().len(), 1);
    assert!(ctrl.admin_commands() > admin);
    (reports, rounds)
}

/// A server of a 16 MiB `file` namespace (in the folder returned, kept
/// apart from the rig's) in doorbell mode `mode`, with `extra` arguments.
fn file_rig(name: &str, mode: &str, extra: &[&str]) -> (TempDir, Rig) {
    let dir = temp_dir(&format!("{name}-ns"));
    let ns = format!("16M:file={}", dir.join("ns1.img").display());
    let mut args = vec!["--ns", &ns, "--doorbells", mode];
    args.extend_from_slice(extra);
    (dir, rig(name, &args))
}

/// One round over every block: write, read back, compare.
fn round(access: &VfioUserAccess, q: &mut IoQueue, r: u64) {
    rounds::round(access, q, BLOCKS, r, true);
}

#[test]
fn the_service_manager_hears_ready_then_each_new_main_pid() {
    // A systemd of our own: the datagram socket NOTIFY_SOCKET names.
    let manager_dir = temp_dir("upgrade-notify-manager");
    let path = manager_dir.join("notify");
    let manager = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    manager
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let heard = || {
        let mut buf = [0u8; 512];
        let n = manager.recv(&mut buf).expect("a notification within 30 s");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let mut r = rig_env(
        "upgrade-notify",
        &["--ns", "16M:null", "--doorbells", "shadow"],
        &[("NOTIFY_SOCKET", &path)],
    );
    assert_eq!(heard(), "READY=1");
    let (_access, _ctrl, _q) = r.client();
    for _ in 0..2 {
        let report = r.upgrade(&[]);
        assert_eq!(heard(), format!("MAINPID={}", report["pid"]), "{report}");
    }
    // The successors said nothing themselves: not the main process when
    // they started, they would have been refused by the manager.
    manager.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 512];
    let more = manager
        .recv(&mut buf)
        .map(|n| String::from_utf8_lossy(&buf[..n]).into_owned());
    assert!(more.is_err(), "{more:?}");
}

#[test]
fn the_metrics_endpoint_answers_across_upgrades() {
    use std::io::Write;
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let scrape = || {
        let mut s = std::net::TcpStream::connect(addr).expect("the metrics port answers");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    let addr_arg = addr.to_string();
    let mut r = rig(
        "upgrade-metrics",
        &[
            "--ns",
            "16M:null",
            "--doorbells",
            "shadow",
            "--metrics",
            &addr_arg,
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(
            Instant::now() < deadline,
            "metrics never listened: {}",
            r.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(scrape().starts_with("HTTP/1.1 200 OK"));
    for round in 0..2 {
        let old = r.pid;
        r.upgrade(&[]);
        // Only the new process holds the socket once the old one is gone.
        if round == 0 {
            assert!(r.first.wait().unwrap().success());
        }
        let gone = Instant::now() + Duration::from_secs(20);
        while std::path::Path::new(&format!("/proc/{old}")).exists() {
            assert!(Instant::now() < gone, "the old server {old} did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
        let answer = scrape();
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        assert!(answer.contains("vnvme_enables_total"), "{answer}");
    }
    assert!(ctl(&r.control, &["shutdown"]).status.success());
}

#[test]
fn verified_io_runs_across_upgrades_in_every_doorbell_mode() {
    for mode in ["trap", "shadow", "adaptive", "mmap-poll"] {
        let (_ns, mut r) = file_rig(&format!("upgrade-io-{mode}"), mode, &[]);
        let first = r.first.id();
        let (reports, rounds) = io_across_upgrades(&mut r, 3);
        assert!(rounds >= 8, "{mode}: {rounds} rounds");
        for rep in &reports {
            for phase in ["drain", "save", "pass", "restore"] {
                assert!(rep["phases_ms"][phase].as_f64().is_some(), "{mode}: {rep}");
            }
            assert!(rep["client"].as_bool().unwrap(), "{mode}: {rep}");
            assert!(rep["dma_maps"].as_u64().unwrap() > 0, "{mode}: {rep}");
        }
        // The first process handed over and exited cleanly.
        assert!(r.first.wait().unwrap().success(), "{mode}");
        assert_ne!(r.pid, first);
        let out = ctl(&r.control, &["shutdown"]);
        assert!(out.status.success(), "{mode}");
    }
}

#[test]
fn the_upgrade_signal_hands_over_too() {
    let (_ns, mut r) = file_rig("upgrade-signal", "shadow", &[]);
    let (access, _ctrl, mut q) = r.client();
    round(&access, &mut q, 0);
    let first = rustix::process::Pid::from_child(&r.first);
    rustix::process::kill_process(first, rustix::process::Signal::USR2).unwrap();
    // The first process exits once the new one serves.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = r.first.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "no handover\n{}", r.log());
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{}", r.log());
    round(&access, &mut q, 1);
    // The new process answers on the same control socket.
    let stats = ctl(&r.control, &["stats"]);
    assert!(stats.status.success());
    assert!(r.log().contains("the new process took over"), "{}", r.log());
    r.pid = pid_from_log(&r.log());
    drop(q);
    assert!(ctl(&r.control, &["shutdown"]).status.success());
}

fn pid_from_log(log: &str) -> u32 {
    let at = log.rfind("\"pid\":").expect("a report in the log");
    log[at + 6..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap()
}

#[test]
fn a_new_binary_that_exits_is_reported_and_the_old_server_serves_on() {
    let (_ns, r) = file_rig("upgrade-false", "shadow", &[]);
    let (access, _ctrl, mut q) = r.client();
    round(&access, &mut q, 0);
    let why = r.refused(&["--exe", "/bin/false"]);
    assert!(why.contains("exited") && why.contains("serves on"), "{why}");
    // Same process, queues and data as before.
    assert!(r.alive());
    round(&access, &mut q, 1);
    // A binary that is not there at all.
    let why = r.refused(&["--exe", "/nonexistent/vnvme"]);
    assert!(why.contains("starting /nonexistent/vnvme"), "{why}");
    round(&access, &mut q, 2);
    // The new process refuses the state: another namespace size.
    let wrapper = r.dir.join("other-config.sh");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nexec {BIN} \"$@\" --max-namespaces 7\n"),
    )
    .unwrap();
    set_executable(&wrapper);
    let why = r.refused(&["--exe", wrapper.to_str().unwrap()]);
    assert!(why.contains("refused"), "{why}");
    round(&access, &mut q, 3);
    // And a good upgrade still works afterwards (the file lock was taken
    // back and let go again).
    let mut r = r;
    r.upgrade(&[]);
    round(&access, &mut q, 4);
    drop(q);
    assert!(ctl(&r.control, &["shutdown"]).status.success());
}

fn set_executable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn two_upgrades_at_once_one_is_refused() {
    let (_ns, mut r) = file_rig("upgrade-twice", "shadow", &[]);
    // A new binary slow to start keeps the first upgrade under way.
    let slow = r.dir.join("slow.sh");
    std::fs::write(&slow, format!("#!/bin/sh\nsleep 2\nexec {BIN} \"$@\"\n")).unwrap();
    set_executable(&slow);
    let control = r.control.clone();
    let slow_s = slow.to_str().unwrap().to_string();
    let first = std::thread::spawn(move || ctl(&control, &["--json", "upgrade", "--exe", &slow_s]));
    std::thread::sleep(Duration::from_millis(700));
    let why = r.refused(&[]);
    assert!(why.contains("already under way"), "{why}");
    let out = first.join().unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        r.log()
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    r.pid = report["pid"].as_u64().unwrap() as u32;
    assert!(
        report["phases_ms"]["pass"].as_f64().unwrap() >= 1000.0,
        "{report}"
    );
    assert!(ctl(&r.control, &["shutdown"]).status.success());
}

#[test]
fn a_namespace_added_at_run_time_refuses_the_upgrade_until_removed() {
    let (dir, mut r) = file_rig("upgrade-ns-added", "shadow", &["--max-namespaces", "4"]);
    let added = format!("ns=16M:file={}", dir.join("added.img").display());
    let ok = |args: &[&str]| {
        let out = ctl(&r.control, args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    ok(&["namespace_add", &added]);
    let why = r.refused(&[]);
    assert!(why.contains("namespace 2 was added at run time"), "{why}");
    assert!(r.alive());
    // Another backend under a configured NSID is refused the same way.
    ok(&["namespace_remove", "nsid=1"]);
    let other = format!("ns=16M:file={}", dir.join("other.img").display());
    ok(&["namespace_add", &other, "nsid=1"]);
    let why = r.refused(&[]);
    assert!(why.contains("namespace 1 was added at run time"), "{why}");
    // Removing what was added lets it go on: the state says what was removed.
    ok(&["namespace_remove", "nsid=1"]);
    ok(&["namespace_remove", "nsid=2"]);
    r.upgrade(&[]);
    assert!(ctl(&r.control, &["shutdown"]).status.success());
}

#[test]
fn limits_set_at_run_time_outlive_the_upgrade() {
    let (_dir, mut r) = file_rig("upgrade-qos", "shadow", &[]);
    let limits = |r: &Rig| common::ctl_ok(&r.control, &["qos_get"]);
    for args in [
        &["qos_set", "nsid=1", "iops=1000"][..],
        &["qos_set", "bps=64M"],
    ] {
        assert!(ctl(&r.control, args).status.success(), "{args:?}");
    }
    let before = limits(&r);
    assert_eq!(
        before["namespaces"]["1"]["own"]["limits"]["iops"], 1000,
        "{before}"
    );
    assert_eq!(
        before["controller"]["own"]["limits"]["bps"],
        64 << 20,
        "{before}"
    );
    r.upgrade(&[]);
    let after = limits(&r);
    for target in [
        &after["namespaces"]["1"]["own"],
        &after["controller"]["own"],
    ] {
        assert!(target["limits"].is_object(), "{after}");
    }
    assert_eq!(
        after["namespaces"]["1"]["own"]["limits"],
        before["namespaces"]["1"]["own"]["limits"]
    );
    assert_eq!(
        after["controller"]["own"]["limits"],
        before["controller"]["own"]["limits"]
    );
    assert!(ctl(&r.control, &["shutdown"]).status.success());
}

/// A `ram` namespace's memfd goes to the new process: verified I/O runs
/// across 3 upgrades, and blocks written before the first read back after
/// the last.
#[test]
fn a_ram_namespace_keeps_its_data_across_upgrades() {
    let mut r = rig("upgrade-ram", &["--ns", "16M:ram", "--doorbells", "shadow"]);
    {
        // Past the blocks the rounds below write over.
        let (access, _ctrl, mut q) = r.client();
        rounds::round(&access, &mut q, 2 * BLOCKS, 1000, true);
    }
    let (reports, rounds) = io_across_upgrades(&mut r, 3);
    assert_eq!(reports.len(), 3);
    assert!(rounds >= 8, "{rounds} rounds");
    let (access, _ctrl, mut q) = r.client();
    let bufs: Vec<_> = (BLOCKS..2 * BLOCKS)
        .map(|_| access.dma_alloc(BLOCK).unwrap())
        .collect();
    for (b, lba) in bufs.iter().zip(BLOCKS..) {
        q.enqueue_rw(NvmOpcode::READ, 1, lba, 1, b).unwrap();
    }
    q.ring().unwrap();
    rounds::reap(&mut q, BLOCKS as usize);
    for (b, lba) in bufs.iter().zip(BLOCKS..) {
        assert!(b.to_vec() == block(lba, 1000), "LBA {lba}");
    }
    assert!(ctl(&r.control, &["shutdown"]).status.success());
}

/// Background work under way when an upgrade comes goes on in the new
/// process: a firmware image downloaded half before and half after is
/// committed and runs; a sanitize carries its position over and completes
/// there (the Sanitize Status log says in progress, then completed; the
/// data is gone).
#[test]
fn a_firmware_download_and_a_sanitize_under_way_finish_in_the_new_process() {
    use vnvme_driver::admin;
    use vnvme_spec::log::LogPageId;
    use vnvme_spec::{AdminOpcode, Command as Sqe};
    // 16 MiB at 4 MiB a second: about 4 s, under way across the upgrade.
    let (_ns, mut r) = file_rig("upgrade-background", "shadow", &["--sanitize-rate", "4M"]);
    let (access, ctrl, mut q) = r.client();
    round(&access, &mut q, 0);
    // Firmware Image Download, 4 KiB at `offset`.
    let image: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
    let image = [b"UPGRADED".as_slice(), &image[8..]].concat();
    let download = |offset: usize| {
        let mut buf = access.dma_alloc(4096).unwrap();
        buf.write_bytes(0, &image[offset..offset + 4096]).unwrap();
        let mut c = Sqe::new(AdminOpcode::FIRMWARE_IMAGE_DOWNLOAD.0, 0);
        c.cdw10 = (4096 / 4 - 1).into();
        c.cdw11 = (offset as u32 / 4).into();
        ctrl.admin(c, Some(&mut buf)).unwrap();
    };
    // SSTAT bits 2:0 of the Sanitize Status log.
    let sstat = || {
        let mut buf = access.dma_alloc(4096).unwrap();
        let c = admin::get_log_page(LogPageId::SANITIZE_STATUS, 0, 512, false);
        ctrl.admin(c, Some(&mut buf)).unwrap();
        u16::from_le_bytes(buf.to_vec()[2..4].try_into().unwrap()) & 0x7
    };
    download(0);
    r.upgrade(&[]);
    download(4096);
    let mut commit = Sqe::new(AdminOpcode::FIRMWARE_COMMIT.0, 0);
    commit.cdw10 = (2 | 3 << 3).into(); // slot 2, activate at once
    ctrl.admin(commit, None).unwrap();
    let mut id = access.dma_alloc(4096).unwrap();
    ctrl.admin(
        admin::identify(vnvme_spec::identify::Cns::CONTROLLER, 0),
        Some(&mut id),
    )
    .unwrap();
    assert_eq!(&id.to_vec()[64..72], b"UPGRADED", "FR after the commit");
    // A sanitize refuses firmware commands: it comes after.
    let mut sanitize = Sqe::new(AdminOpcode::SANITIZE.0, 0);
    sanitize.cdw10 = 2.into(); // SANACT: Block Erase
    ctrl.admin(sanitize, None).unwrap();
    r.upgrade(&[]);
    assert_eq!(sstat(), 2, "in progress in the new process\n{}", r.log());
    let deadline = Instant::now() + Duration::from_secs(60);
    while sstat() == 2 {
        assert!(Instant::now() < deadline, "the sanitize never ended");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(sstat(), 1, "completed\n{}", r.log());
    let buf = access.dma_alloc(BLOCK).unwrap();
    q.enqueue_rw(NvmOpcode::READ, 1, 0, 1, &buf).unwrap();
    q.ring().unwrap();
    reap(&mut q, 1);
    assert!(buf.to_vec().iter().all(|&b| b == 0), "erased");
    drop(q);
    assert!(ctl(&r.control, &["shutdown"]).status.success());
}

/// A Format NVM whose namespace is still busy at an upgrade (its
/// `--format-duration`) stays busy in the new process until it was due:
/// I/O gets Format In Progress, then runs on the formatted namespace.
#[test]
fn a_format_under_way_finishes_in_the_new_process() {
    use vnvme_spec::{AdminOpcode, Command as Sqe, Status};
    let (_ns, mut r) = file_rig("upgrade-format", "shadow", &["--format-duration", "3s"]);
    let (access, ctrl, mut q) = r.client();
    round(&access, &mut q, 0);
    let mut format = Sqe::new(AdminOpcode::FORMAT_NVM.0, 0);
    format.nsid = 1.into(); // LBA format 0, no secure erase
    ctrl.admin(format, None).unwrap();
    r.upgrade(&[]);
    let mut buf = access.dma_alloc(BLOCK).unwrap();
    let status = q.read(1, 0, 1, &mut buf).unwrap_err().status();
    assert_eq!(
        status.map(|s| s.same_code(Status::FORMAT_IN_PROGRESS)),
        Some(true),
        "{status:?}\n{}",
        r.log()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = q.read(1, 0, 1, &mut buf) {
        let busy = e
            .status()
            .is_some_and(|s| s.same_code(Status::FORMAT_IN_PROGRESS));
        assert!(busy && Instant::now() < deadline, "{e}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(buf.to_vec().iter().all(|&b| b == 0), "formatted: zeroes");
    drop(q);
    assert!(ctl(&r.control, &["shutdown"]).status.success());
}
