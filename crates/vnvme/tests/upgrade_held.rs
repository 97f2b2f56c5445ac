//! Commands held back at a live upgrade (issue 35 item 2; docs/upgrade.md):
//! fetched and not yet given to the storage, because a QoS limit, a fault's
//! delay or a never-complete fault holds them, they are handed to the new
//! process, which holds them again and runs them (or, never-complete, keeps
//! them until Abort). Before, such a command refused the upgrade. A real
//! `vnvme serve` driven by our driver over its vfio-user socket; the basic
//! upgrade cases are in tests/upgrade.rs.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::rounds::{self, BLOCK};
use common::{ctl, ctl_ok, temp_dir, TempDir, BIN};
use serde_json::Value;
use vnvme_driver::{DeviceAccess, IoQueue};
use vnvme_spec::{AdminOpcode, NvmOpcode, Status};

/// A server on a 16 MiB `file` namespace with `ns_options` (`,iops=50`),
/// and the pid serving now (each upgrade's new one).
struct Held {
    dir: TempDir,
    _ns: TempDir,
    socket: PathBuf,
    control: PathBuf,
    first: Child,
    pid: u32,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.pid as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
        let _ = self.first.kill();
        let _ = self.first.wait();
    }
}

fn served(name: &str, ns_options: &str) -> Held {
    let dir = temp_dir(name);
    let ns_dir = temp_dir(&format!("{name}-ns"));
    let socket = dir.join("vnvme.sock");
    let control = dir.join("control.sock");
    let ns = format!("16M:file={}{ns_options}", ns_dir.join("ns1.img").display());
    let log = std::fs::File::create(dir.join("serve.log")).unwrap();
    let first = Command::new(BIN)
        .args(["serve", "--doorbells", "shadow", "--ns", &ns, "--socket"])
        .arg(&socket)
        .arg("--control")
        .arg(&control)
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(socket.exists() && control.exists()) {
        assert!(Instant::now() < deadline, "no sockets");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = first.id();
    Held {
        dir,
        _ns: ns_dir,
        socket,
        control,
        first,
        pid,
    }
}

impl Held {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
    }

    /// Upgrades, which must succeed: the report.
    fn upgrade(&mut self) -> Value {
        let out = ctl(&self.control, &["--json", "upgrade"]);
        assert!(
            out.status.success(),
            "upgrade refused: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        self.pid = report["pid"].as_u64().unwrap() as u32;
        report
    }

    fn throttled(&self) -> u64 {
        ctl_ok(&self.control, &["stats"])["qos_throttled_commands"]
            .as_u64()
            .unwrap()
    }
}

/// No completion arrives on `q` (each command completed exactly once:
/// none left over).
fn nothing_more(q: &mut IoQueue) {
    let mut extra = Vec::new();
    let _ = q.wait(&mut extra, 1, Duration::from_millis(300));
    assert!(extra.is_empty(), "completions left over: {extra:?}");
}

#[test]
fn qos_limited_io_is_handed_over_at_each_upgrade() {
    let mut s = served("upgrade-held-qos", ",iops=50");
    let (access, _ctrl, mut q) = common::client::default_client(&s.socket);
    // 16 blocks a round: 16 writes, then 16 reads, in flight at once (QD
    // 16); at 50 IOPS most wait for the limit at any time.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let io = {
        let (access, stop, done) = (access.clone(), stop.clone(), done.clone());
        std::thread::spawn(move || {
            let mut r = 0;
            while !stop.load(Ordering::Acquire) {
                rounds::round(&access, &mut q, 16, r, true);
                r += 1;
                done.store(r, Ordering::Release);
            }
            q
        })
    };
    let wait_rounds = |s: &Held, n: u64| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while done.load(Ordering::Acquire) < n {
            assert!(!io.is_finished(), "the I/O thread failed\n{}", s.log());
            assert!(Instant::now() < deadline, "no I/O\n{}", s.log());
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let mut handed = Vec::new();
    for i in 0..3 {
        wait_rounds(&s, i + 1);
        // Into the round: its commands wait for the limit.
        std::thread::sleep(Duration::from_millis(100));
        let report = s.upgrade();
        eprintln!("upgrade {}: {report}", i + 1);
        handed.push(report["handed_commands"].as_u64().unwrap());
    }
    // Each upgrade handed over the commands the limit held.
    assert!(handed.iter().all(|&n| n >= 1), "{handed:?}\n{}", s.log());
    let now = done.load(Ordering::Acquire);
    wait_rounds(&s, now + 2);
    stop.store(true, Ordering::Release);
    let mut q = io
        .join()
        .unwrap_or_else(|_| panic!("the I/O thread failed\n{}", s.log()));
    nothing_more(&mut q);
    let csts = access.read32(0x1c).unwrap();
    assert_eq!(csts & 3, 1, "CSTS.RDY set, CFS clear");
    // The limit holds in the last process: 16 reads at once, of which
    // the bucket (a tenth of a second's worth: 5) lets a few start and
    // the rest wait.
    std::thread::sleep(Duration::from_millis(300));
    let before = s.throttled();
    rounds::round(&access, &mut q, 16, done.load(Ordering::Acquire) - 1, false);
    let throttled = s.throttled() - before;
    assert!((8..=16).contains(&throttled), "{throttled} of 16 throttled");
    nothing_more(&mut q);
    assert!(ctl(&s.control, &["shutdown"]).status.success());
}

#[test]
fn a_never_completing_command_is_handed_over_and_abort_finds_it() {
    let mut s = served("upgrade-held-never", "");
    let (access, ctrl, mut q) = common::client::default_client(&s.socket);
    let fault = [
        "fault_add",
        "kind=never-complete",
        "opcodes=read",
        "count=1",
    ];
    ctl_ok(&s.control, &fault);
    let latency = [
        "fault_add",
        "kind=latency",
        "latency=1500ms",
        "opcodes=write",
        "count=1",
    ];
    ctl_ok(&s.control, &latency);
    let read = access.dma_alloc(BLOCK).unwrap();
    let read_cid = q.enqueue_rw(NvmOpcode::READ, 1, 3, 1, &read).unwrap();
    let written = rounds::block(5, 77);
    let write = access.dma_alloc(BLOCK).unwrap();
    write.write_bytes(0, &written).unwrap();
    let write_cid = q.enqueue_rw(NvmOpcode::WRITE, 1, 5, 1, &write).unwrap();
    q.ring().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // Both held: the read for ever, the write for its delay. Twice, the
    // second new process handing on what the first took.
    assert_eq!(s.upgrade()["handed_commands"], 2, "{}", s.log());
    assert_eq!(s.upgrade()["handed_commands"], 2, "{}", s.log());
    // The delayed write completes in the new process, once.
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.is_empty() {
        assert!(Instant::now() < deadline, "the write never completed");
        let _ = q.wait(&mut got, 1, Duration::from_secs(1));
    }
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].cid(), write_cid);
    assert!(got[0].status().is_success(), "{:?}", got[0]);
    // Abort finds the read: it completes as aborted, and the Abort says
    // so (dword 0 bit 0 clear).
    let mut abort = vnvme_spec::Command::new(AdminOpcode::ABORT.0, 0);
    abort.cdw10 = (u32::from(q.qid()) | (u32::from(read_cid) << 16)).into();
    let answer = ctrl.admin(abort, None).unwrap();
    assert_eq!(answer.dw0.get() & 1, 0, "the Abort found no command");
    got.clear();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.is_empty() {
        assert!(Instant::now() < deadline, "the read was not aborted");
        let _ = q.wait(&mut got, 1, Duration::from_secs(1));
    }
    assert_eq!(got[0].cid(), read_cid);
    assert_eq!(got[0].status(), Status::ABORTED_BY_REQUEST);
    nothing_more(&mut q);
    // The write reached the file.
    let back = access.dma_alloc(BLOCK).unwrap();
    q.enqueue_rw(NvmOpcode::READ, 1, 5, 1, &back).unwrap();
    q.ring().unwrap();
    rounds::reap(&mut q, 1);
    assert!(back.to_vec() == written);
    assert!(ctl(&s.control, &["shutdown"]).status.success());
}
