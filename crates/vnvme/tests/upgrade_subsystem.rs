//! Live upgrade (issue 35 item 2) of a server with several controllers:
//! `vnvme serve --socket A --socket B`, one subsystem whose controllers
//! share the namespaces. Two clients, one per controller, run verified I/O
//! across two upgrades with no error; host 1's reservation, controller 2's
//! inaccessible path and a namespace detached from controller 2 only
//! survive them; the new process has the threads and fds the old one had.
//! A client that half-sent a message when the upgrade is asked holds it up
//! at most until the message timeout drops that client.

mod common;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::client::Client;
use common::pattern::pattern;
use common::{ctl, ctl_ok, temp_dir, TempDir, BIN};
use serde_json::Value;
use vnvme_driver::{admin, Error, PassthruData};
use vnvme_spec::identify::{Cns, IDENTIFY_SIZE};
use vnvme_spec::{AdminOpcode, Command as Sqe, NvmOpcode, Status};

const BLOCK: usize = 4096;
/// Blocks each client writes and reads back per round, in a range of its
/// own on namespace 1.
const BLOCKS: u64 = 16;
const KEY: u64 = 0xA1;

/// A subsystem server, and whichever process serves it now.
struct Rig {
    dir: TempDir,
    _ns: TempDir,
    sockets: Vec<PathBuf>,
    control: PathBuf,
    first: Child,
    pid: u32,
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.pid as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
        let _ = self.first.kill();
        let _ = self.first.wait();
    }
}

/// Two controllers; namespace 1 a file, 2 and 3 `null`.
fn rig(name: &str, extra: &[&str]) -> Rig {
    let dir = temp_dir(name);
    let ns = temp_dir(&format!("{name}-ns"));
    let sockets: Vec<PathBuf> = (0..2).map(|i| dir.join(format!("c{i}.sock"))).collect();
    let control = dir.join("control.sock");
    let log = std::fs::File::create(dir.join("serve.log")).unwrap();
    let first = Command::new(BIN)
        .arg("serve")
        .args(["--socket", sockets[0].to_str().unwrap()])
        .args(["--socket", sockets[1].to_str().unwrap()])
        .args(["--control", control.to_str().unwrap()])
        .arg("--ns")
        .arg(format!("16M:file={}", ns.join("ns1.img").display()))
        .args(["--ns", "16M:null", "--ns", "16M:null"])
        .args(extra)
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(sockets.iter().all(|s| s.exists()) && control.exists()) {
        assert!(Instant::now() < deadline, "serve made no sockets");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = first.id();
    Rig {
        dir,
        _ns: ns,
        sockets,
        control,
        first,
        pid,
    }
}

impl Rig {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
    }

    fn upgrade(&mut self) -> Value {
        self.try_upgrade()
            .unwrap_or_else(|e| panic!("upgrade: {e}\n{}", self.log()))
    }

    /// An upgrade: its report, or why it was refused.
    fn try_upgrade(&mut self) -> Result<Value, String> {
        let out = ctl(&self.control, &["--json", "upgrade"]);
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        let pid = report["pid"].as_u64().unwrap() as u32;
        assert_ne!(pid, self.pid, "{report}");
        // The old process is gone before the counts are taken.
        let gone = Instant::now() + Duration::from_secs(20);
        while std::path::Path::new(&format!("/proc/{}", self.pid)).exists()
            && self.pid != self.first.id()
        {
            assert!(Instant::now() < gone, "the old server did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
        self.pid = pid;
        Ok(report)
    }

    /// Threads and open fds of the serving process (see
    /// `common::proc_counts`).
    fn counts(&self) -> (usize, Vec<String>) {
        common::proc_counts::counts(self.pid)
    }

    /// [`counts`](Self::counts) once they are `want` (see
    /// `common::proc_counts::settled_counts`).
    fn settled_counts(&self, want: &(usize, Vec<String>)) -> (usize, Vec<String>) {
        common::proc_counts::settled_counts(self.pid, want)
    }
}

impl Client {
    /// A command on the I/O queue: its status.
    fn status(&mut self, mut c: Sqe, data: Option<(&[u8], bool)>) -> Status {
        let buf = self.mem.dma_alloc(BLOCK).unwrap();
        let data = data.map(|(bytes, write)| {
            buf.write_bytes(0, bytes).unwrap();
            if write {
                PassthruData::write(&buf, bytes.len())
            } else {
                PassthruData::read(&buf, bytes.len())
            }
        });
        c.nsid = c.nsid.get().max(1).into();
        self.q.passthru(c, data).unwrap().status
    }

    /// Set Features 81h: an 8-byte Host Identifier of `n`s.
    fn become_host(&self, n: u8) {
        let buf = self.mem.dma_alloc(BLOCK).unwrap();
        buf.write_bytes(0, &[n; 8]).unwrap();
        let mut c = Sqe::new(AdminOpcode::SET_FEATURES.0, 0);
        c.cdw10 = 0x81.into();
        let done = (self.ctrl)
            .admin_passthru(c, Some(PassthruData::write(&buf, 8)))
            .unwrap();
        assert_eq!(done.status, Status::SUCCESS, "host id {n}");
    }

    /// A one-block command `op` on namespace `nsid`.
    fn one_block(&mut self, op: NvmOpcode, nsid: u32) -> Status {
        let mut c = Sqe::new(op.0, 0);
        c.nsid = nsid.into();
        let write = op == NvmOpcode::WRITE;
        self.status(c, Some((&[0u8; BLOCK], write)))
    }

    /// The active namespaces (Identify CNS 02h).
    fn active(&self) -> Vec<u32> {
        let mut buf = self.mem.dma_alloc(IDENTIFY_SIZE).unwrap();
        self.ctrl
            .admin(admin::identify(Cns::ACTIVE_NAMESPACES, 0), Some(&mut buf))
            .unwrap();
        buf.to_vec()
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .take_while(|&n| n != 0)
            .collect()
    }

    /// One verified round over this client's `BLOCKS` blocks from `base`.
    fn round(&mut self, base: u64, r: u64) -> Result<(), Error> {
        let data = |lba: u64| pattern(BLOCK, (lba as u32) ^ ((r as u32) << 12));
        for lba in base..base + BLOCKS {
            let buf = self.mem.dma_alloc(BLOCK).unwrap();
            buf.write_bytes(0, &data(lba)).unwrap();
            self.q.write(1, lba, 1, &buf)?;
        }
        for lba in base..base + BLOCKS {
            let mut buf = self.mem.dma_alloc(BLOCK).unwrap();
            self.q.read(1, lba, 1, &mut buf)?;
            assert!(buf.to_vec() == data(lba), "LBA {lba}, round {r}");
        }
        Ok(())
    }
}

/// Verified rounds on a thread until `stop`: the rounds done, or the
/// first error.
fn rounds_on(
    mut c: Client,
    base: u64,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> std::thread::JoinHandle<(Client, Result<(), String>)> {
    std::thread::spawn(move || {
        let mut r = 0;
        while !stop.load(Ordering::Acquire) {
            if let Err(e) = c.round(base, r) {
                return (c, Err(format!("round {r}: {e}")));
            }
            r += 1;
            done.store(r, Ordering::Release);
        }
        (c, Ok(()))
    })
}

/// Waits until each counter is 2 rounds past where it is.
fn more_rounds(r: &Rig, done: &[Arc<AtomicU64>]) {
    let from: Vec<u64> = done.iter().map(|d| d.load(Ordering::Acquire)).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while done
        .iter()
        .zip(&from)
        .any(|(d, f)| d.load(Ordering::Acquire) < f + 2)
    {
        assert!(Instant::now() < deadline, "no I/O\n{}", r.log());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn two_controllers_upgrade_twice_with_io_reservation_ana_and_attachment() {
    let mut r = rig("upgrade-subsys", &[]);
    let mut a = Client::connect(&r.sockets[0]);
    let mut b = Client::connect(&r.sockets[1]);
    a.become_host(1);
    b.become_host(2);
    // Host 1 registers and holds Write Exclusive on namespace 2.
    let mut c = Sqe::new(NvmOpcode::RESERVATION_REGISTER.0, 0);
    c.nsid = 2.into();
    let keys = [0u64.to_le_bytes(), KEY.to_le_bytes()].concat();
    assert_eq!(a.status(c, Some((&keys, true))), Status::SUCCESS);
    let mut c = Sqe::new(NvmOpcode::RESERVATION_ACQUIRE.0, 0);
    c.nsid = 2.into();
    c.cdw10 = (1 << 8).into();
    let keys = [KEY.to_le_bytes(), 0u64.to_le_bytes()].concat();
    assert_eq!(a.status(c, Some((&keys, true))), Status::SUCCESS);
    let conflict = Status::RESERVATION_CONFLICT.with_dnr(true);
    assert_eq!(b.one_block(NvmOpcode::WRITE, 2), conflict);
    // Controller 2's path to namespace 3 inaccessible.
    ctl_ok(
        &r.control,
        &["ana_set", "controller=2", "group=3", "state=inaccessible"],
    );
    let inaccessible = Status::ASYMMETRIC_ACCESS_INACCESSIBLE.with_dnr(false);
    assert_eq!(b.one_block(NvmOpcode::READ, 3), inaccessible);
    // Namespace 3 detached from controller 1 only (a Controller List
    // naming CNTLID 1), through controller 1.
    let mut list = a.mem.dma_alloc(BLOCK).unwrap();
    list.write_bytes(0, &[1, 0, 1, 0]).unwrap();
    let mut c = Sqe::new(AdminOpcode::NAMESPACE_ATTACHMENT.0, 0);
    c.nsid = 3.into();
    c.cdw10 = 1.into();
    a.ctrl.admin(c, Some(&mut list)).unwrap();
    assert_eq!(a.active(), [1, 2]);
    assert_eq!(b.active(), [1, 2, 3]);

    let stop = Arc::new(AtomicBool::new(false));
    let done = [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
    let ta = rounds_on(a, 0, stop.clone(), done[0].clone());
    let tb = rounds_on(b, 256, stop.clone(), done[1].clone());
    more_rounds(&r, &done);
    let before = r.counts();
    let first = r.pid;
    for _ in 0..2 {
        more_rounds(&r, &done);
        let report = r.upgrade();
        // The handover's phases, for `cargo test -- --nocapture`.
        eprintln!("upgrade: {report}");
        assert_eq!(report["controllers"], 2, "{report}");
        assert_eq!(report["clients"], 2, "{report}");
        more_rounds(&r, &done);
        assert_eq!(
            r.settled_counts(&before),
            before,
            "threads and fds after an upgrade"
        );
    }
    assert_ne!(r.pid, first);
    stop.store(true, Ordering::Release);
    let (mut a, ra) = ta.join().unwrap();
    let (mut b, rb) = tb.join().unwrap();
    assert_eq!(ra, Ok(()), "client 1\n{}", r.log());
    assert_eq!(rb, Ok(()), "client 2\n{}", r.log());

    // What the hosts set, as it was.
    assert_eq!(b.one_block(NvmOpcode::WRITE, 2), conflict, "reservation");
    assert_eq!(a.one_block(NvmOpcode::WRITE, 2), Status::SUCCESS);
    assert_eq!(b.one_block(NvmOpcode::READ, 3), inaccessible, "ANA");
    assert_eq!(a.active(), [1, 2], "attachment");
    assert_eq!(b.active(), [1, 2, 3], "attachment");
    // Never reset: both controllers still ready.
    for c in [&a, &b] {
        assert_eq!(c.mem.read32(0x1c).unwrap() & 3, 1, "CSTS.RDY, no CFS");
    }
    assert!(ctl(&r.control, &["shutdown"]).status.success());
}

#[test]
fn a_half_sent_message_delays_or_refuses_the_upgrade_and_never_hangs_it() {
    let mut r = rig(
        "upgrade-subsys-half",
        &["--message-timeout", "1s", "--handshake-timeout", "2s"],
    );
    let mut a = Client::connect(&r.sockets[0]);
    a.round(0, 0).unwrap();
    // Controller 2's client: half of VERSION's header.
    let mut half = std::os::unix::net::UnixStream::connect(&r.sockets[1]).unwrap();
    half.write_all(&[1, 0, 1, 0, 0, 0, 0, 0]).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    // Either the upgrade waits until the message timeout drops that
    // client, or it is refused at once with the reason; it is answered.
    match r.try_upgrade() {
        Ok(report) => assert_eq!(report["clients"], 1, "{report}"),
        Err(why) => assert!(
            why.contains("connecting") || why.contains("between two messages"),
            "{why}"
        ),
    }
    a.round(0, 1).unwrap();
    // Once the server dropped it, the next upgrade goes through.
    half.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut rest = Vec::new();
    let _ = half.read_to_end(&mut rest);
    let report = r.upgrade();
    assert_eq!(report["clients"], 1, "{report}");
    a.round(0, 2).unwrap();
    assert!(ctl(&r.control, &["shutdown"]).status.success());
}

#[test]
fn a_successor_with_one_socket_refuses_a_subsystems_handover() {
    let mut r = rig("upgrade-subsys-one", &[]);
    let mut a = Client::connect(&r.sockets[0]);
    a.round(0, 0).unwrap();
    // The new binary started with the second --socket left out.
    let exe = r.dir.join("one-socket.sh");
    std::fs::write(
        &exe,
        format!(
            "#!/bin/sh\nn=0\nfor a in \"$@\"; do\n  shift\n  n=$((n + 1))\n  \
             if [ \"$a\" = --socket ] && [ $n -gt 2 ]; then skip=1; continue; fi\n  \
             if [ -n \"$skip\" ]; then skip=; continue; fi\n  set -- \"$@\" \"$a\"\ndone\n\
             exec {BIN} \"$@\"\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&exe, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = ctl(&r.control, &["upgrade", "--exe", exe.to_str().unwrap()]);
    let why = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{why}");
    assert!(
        why.contains("the handover has 2 controllers and this server one --socket"),
        "{why}\n{}",
        r.log()
    );
    // The old process serves on.
    a.round(0, 1).unwrap();
    assert!(r.upgrade()["pid"].as_u64().is_some());
    a.round(0, 2).unwrap();
    assert!(ctl(&r.control, &["shutdown"]).status.success());
}

/// A `ram` namespace of a subsystem keeps its data across an upgrade (its
/// memfd is in the handover).
#[test]
fn a_ram_namespace_of_a_subsystem_keeps_its_data_across_an_upgrade() {
    let mut r = rig("upgrade-subsys-ram", &["--ns", "16M:ram"]);
    let mut a = Client::connect(&r.sockets[0]);
    let data = pattern(BLOCK, 77);
    let buf = a.mem.dma_alloc(BLOCK).unwrap();
    buf.write_bytes(0, &data).unwrap();
    a.q.write(4, 5, 1, &buf).unwrap();
    r.upgrade();
    let mut back = a.mem.dma_alloc(BLOCK).unwrap();
    a.q.read(4, 5, 1, &mut back).unwrap();
    assert!(
        back.to_vec() == data,
        "LBA 5 of namespace 4 after the upgrade"
    );
}
