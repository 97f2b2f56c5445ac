//! Live upgrade (issue 35 item 2) of a `[[controllers]]` server: one
//! `vnvme serve --config F` process serving three independent controllers
//! (each its own socket, control socket and `file` namespace; every client
//! on one connection thread). Asked on any controller's control socket (or
//! with SIGUSR2), the whole process goes to a new one: two clients run
//! verified I/O across upgrades with no error and every command completed
//! once, a registration survives, the controller without a client serves
//! its first client after them, and the new process has the threads and
//! fds the old one had. A successor that cannot start, and a file that
//! gained or lost a controller, leave the old process serving every one;
//! a client still connecting delays the upgrade (or refuses it, saying
//! which), never hangs it; each controller's `ram` namespace keeps its
//! own data.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::client::default_client;
use common::proc_counts::{counts, settled_counts};
use common::rounds::{round_or, BLOCK};
use common::{ctl, temp_dir, TempDir, BIN};
use serde_json::Value;
use vnvme_driver::{PassthruData, VfioUserAccess};
use vnvme_spec::{Command as Sqe, NvmOpcode, Status};

/// Blocks each round writes and reads back.
const BLOCKS: u64 = 16;
const KEY: u64 = 0xB2;

/// A `[[controllers]]` server, and whichever process serves it now.
struct Rig {
    dir: TempDir,
    _ns: TempDir,
    config: PathBuf,
    sockets: Vec<PathBuf>,
    controls: Vec<PathBuf>,
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

/// The configuration of `n` controllers `c0`... in `dir`, each a 16 MiB
/// file namespace in `ns` and a control socket.
fn config_text(dir: &Path, ns: &Path, n: usize) -> String {
    let mut text = String::from("workers = 1\n");
    for i in 0..n {
        text.push_str(&format!(
            "\n[[controllers]]\nsocket = \"{}\"\ncontrol = \"{}\"\n\
             [[controllers.namespaces]]\nsize = \"16M\"\nbackend = \"file\"\npath = \"{}\"\n",
            dir.join(format!("c{i}.sock")).display(),
            dir.join(format!("c{i}.ctl")).display(),
            ns.join(format!("ns{i}.img")).display(),
        ));
    }
    text
}

/// Three controllers.
fn rig(name: &str) -> Rig {
    rig_with(name, &[])
}

/// Three controllers, `extra` on the command line.
fn rig_with(name: &str, extra: &[&str]) -> Rig {
    let dir = temp_dir(name);
    let ns = temp_dir(&format!("{name}-ns"));
    let config = dir.join("serve.toml");
    std::fs::write(&config, config_text(&dir, &ns, 3)).unwrap();
    let sockets: Vec<PathBuf> = (0..3).map(|i| dir.join(format!("c{i}.sock"))).collect();
    let controls: Vec<PathBuf> = (0..3).map(|i| dir.join(format!("c{i}.ctl"))).collect();
    let log = std::fs::File::create(dir.join("serve.log")).unwrap();
    let first = Command::new(BIN)
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .args(extra)
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sockets.iter().chain(&controls).all(|s| s.exists()) {
        assert!(Instant::now() < deadline, "serve made no sockets");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = first.id();
    Rig {
        dir,
        _ns: ns,
        config,
        sockets,
        controls,
        first,
        pid,
    }
}

impl Rig {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
    }

    /// An upgrade asked on controller `via`'s control socket: its report.
    fn upgrade(&mut self, via: usize) -> Value {
        self.try_upgrade(via, &[])
            .unwrap_or_else(|e| panic!("upgrade: {e}\n{}", self.log()))
    }

    /// An upgrade asked on controller `via`'s control socket with `extra`
    /// arguments: its report, or why it was refused.
    fn try_upgrade(&mut self, via: usize, extra: &[&str]) -> Result<Value, String> {
        let mut args = vec!["--json", "upgrade"];
        args.extend_from_slice(extra);
        let out = ctl(&self.controls[via], &args);
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        let pid = report["pid"].as_u64().unwrap() as u32;
        assert_ne!(pid, self.pid, "{report}");
        self.wait_gone();
        self.pid = pid;
        Ok(report)
    }

    /// Waits until the old process has exited (the first is our child:
    /// reaped).
    fn wait_gone(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let gone = if self.pid == self.first.id() {
                self.first.try_wait().unwrap().is_some()
            } else {
                !Path::new(&format!("/proc/{}", self.pid)).exists()
            };
            if gone {
                return;
            }
            assert!(Instant::now() < deadline, "the old server did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// One client's verified rounds on a thread until `stop`: the rounds
/// done counted in `done`; panics (the join fails) on any error.
fn rounds_on(
    socket: &Path,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    log: PathBuf,
) -> std::thread::JoinHandle<(Arc<VfioUserAccess>, vnvme_driver::Controller)> {
    let (access, ctrl, mut q) = default_client(socket);
    std::thread::spawn(move || {
        let server = || std::fs::read_to_string(&log).unwrap_or_default();
        let mut r = 0;
        while !stop.load(Ordering::Acquire) {
            round_or(&access, &mut q, BLOCKS, r, true, &server);
            r += 1;
            done.store(r, Ordering::Release);
        }
        (access, ctrl)
    })
}

/// Waits until each counter is 2 rounds past where it is.
fn more_rounds(r: &Rig, done: &[Arc<AtomicU64>]) {
    let from: Vec<u64> = done.iter().map(|d| d.load(Ordering::Acquire)).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while (done.iter().zip(&from)).any(|(d, f)| d.load(Ordering::Acquire) < f + 2) {
        assert!(Instant::now() < deadline, "no I/O\n{}", r.log());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Reservation Register on namespace 1 with action `rrega` (0 register,
/// 2 replace) and the keys `current`, `new`: its status.
fn register(
    access: &VfioUserAccess,
    q: &mut vnvme_driver::IoQueue,
    rrega: u32,
    current: u64,
    new: u64,
) -> Status {
    use vnvme_driver::DeviceAccess;
    let buf = access.dma_alloc(BLOCK).unwrap();
    let keys = [current.to_le_bytes(), new.to_le_bytes()].concat();
    buf.write_bytes(0, &keys).unwrap();
    let mut c = Sqe::new(NvmOpcode::RESERVATION_REGISTER.0, 0);
    c.nsid = 1.into();
    c.cdw10 = rrega.into();
    q.passthru(c, Some(PassthruData::write(&buf, keys.len())))
        .unwrap()
        .status
}

/// Our driver on `socket` once the server has let its previous client go
/// (it answers Busy until it has seen that one disconnect).
fn client_once_free(
    socket: &Path,
) -> (
    Arc<VfioUserAccess>,
    vnvme_driver::Controller,
    vnvme_driver::IoQueue,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match VfioUserAccess::connect(socket) {
            Ok(access) => {
                let access = Arc::new(access);
                let mem = Arc::clone(&access) as Arc<dyn vnvme_driver::DeviceAccess>;
                let ctrl = vnvme_driver::Controller::init(mem, Default::default()).unwrap();
                let q = ctrl.take_io_queue(0).unwrap();
                return (access, ctrl, q);
            }
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("connecting to {}: {e}", socket.display()),
        }
    }
}

#[test]
fn three_controllers_upgrade_twice_through_two_control_sockets_with_io() {
    let mut r = rig("upgrade-many");
    // Controller 0's host registers a key on its namespace.
    {
        let (access, _ctrl, mut q) = default_client(&r.sockets[0]);
        assert_eq!(register(&access, &mut q, 0, 0, KEY), Status::SUCCESS);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let done = [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
    let log = r.dir.join("serve.log");
    let t0 = rounds_on(&r.sockets[0], stop.clone(), done[0].clone(), log.clone());
    let t1 = rounds_on(&r.sockets[1], stop.clone(), done[1].clone(), log);
    more_rounds(&r, &done);
    let before = counts(r.pid);
    let first = r.pid;
    // Through controller 1's control socket, then controller 0's.
    for via in [1, 0] {
        more_rounds(&r, &done);
        let report = r.upgrade(via);
        // The handover's phases, for `cargo test -- --nocapture`.
        eprintln!("upgrade: {report}");
        assert_eq!(report["controllers"], 3, "{report}");
        assert_eq!(report["clients"], 2, "{report}");
        more_rounds(&r, &done);
        assert_eq!(
            settled_counts(r.pid, &before),
            before,
            "threads and fds after an upgrade"
        );
    }
    assert_ne!(r.pid, first);
    stop.store(true, Ordering::Release);
    let c0 = t0.join().expect("client 0's I/O");
    let c1 = t1.join().expect("client 1's I/O");
    // Never reset: both controllers still ready.
    for (a, _) in [&c0, &c1] {
        use vnvme_driver::DeviceAccess;
        assert_eq!(a.read32(0x1c).unwrap() & 3, 1, "CSTS.RDY, no CFS");
    }
    drop((c0, c1));
    // The registration kept: replacing the key needs the one registered.
    let (access, _ctrl, mut q) = client_once_free(&r.sockets[0]);
    let conflict = Status::RESERVATION_CONFLICT.with_dnr(true);
    assert_eq!(register(&access, &mut q, 2, KEY + 1, 7), conflict);
    assert_eq!(register(&access, &mut q, 2, KEY, 7), Status::SUCCESS);
    // The controller that had no client serves its first one.
    let (access, _ctrl, mut q) = default_client(&r.sockets[2]);
    round_or(&access, &mut q, BLOCKS, 0, true, &|| r.log());
    assert!(ctl(&r.controls[2], &["shutdown"]).status.success());
}

#[test]
fn a_successor_that_cannot_start_or_refuses_leaves_every_controller_serving() {
    let mut r = rig("upgrade-many-refused");
    let (a0, _c0, mut q0) = default_client(&r.sockets[0]);
    let (a1, _c1, mut q1) = default_client(&r.sockets[1]);
    round_or(&a0, &mut q0, BLOCKS, 0, true, &|| r.log());
    round_or(&a1, &mut q1, BLOCKS, 0, true, &|| r.log());
    let pid = r.pid;
    // A binary that does not exist.
    let why = r
        .try_upgrade(2, &["--exe", "/nonexistent/vnvme"])
        .unwrap_err();
    assert!(
        why.contains("starting /nonexistent/vnvme"),
        "{why}\n{}",
        r.log()
    );
    round_or(&a0, &mut q0, BLOCKS, 1, true, &|| r.log());
    round_or(&a1, &mut q1, BLOCKS, 1, true, &|| r.log());
    // A controller added to the file: the new process refuses it.
    let ns = r._ns.to_path_buf();
    std::fs::write(&r.config, config_text(&r.dir, &ns, 4)).unwrap();
    let why = r.try_upgrade(0, &[]).unwrap_err();
    assert!(
        why.contains("controllers[3]") && why.contains("is new in the configuration"),
        "{why}\n{}",
        r.log()
    );
    round_or(&a0, &mut q0, BLOCKS, 2, true, &|| r.log());
    // One removed: refused too.
    std::fs::write(&r.config, config_text(&r.dir, &ns, 2)).unwrap();
    let why = r.try_upgrade(1, &[]).unwrap_err();
    assert!(
        why.contains("c2.sock") && why.contains("no longer has"),
        "{why}\n{}",
        r.log()
    );
    assert_eq!(r.pid, pid);
    round_or(&a0, &mut q0, BLOCKS, 3, true, &|| r.log());
    round_or(&a1, &mut q1, BLOCKS, 3, true, &|| r.log());
    // The file as it was: the upgrade goes through.
    std::fs::write(&r.config, config_text(&r.dir, &ns, 3)).unwrap();
    let report = r.upgrade(2);
    assert_eq!(report["clients"], 2, "{report}");
    round_or(&a0, &mut q0, BLOCKS, 4, true, &|| r.log());
    round_or(&a1, &mut q1, BLOCKS, 4, true, &|| r.log());
    // What each round wrote last is there.
    round_or(&a0, &mut q0, BLOCKS, 4, false, &|| r.log());
    assert!(ctl(&r.controls[0], &["shutdown"]).status.success());
}

#[test]
fn the_upgrade_signal_upgrades_a_controllers_server() {
    let mut r = rig("upgrade-many-signal");
    let (a0, _c0, mut q0) = default_client(&r.sockets[0]);
    round_or(&a0, &mut q0, BLOCKS, 0, true, &|| r.log());
    let pid = rustix::process::Pid::from_raw(r.pid as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::USR2).unwrap();
    r.wait_gone();
    // The new process's pid, from the old one's report in the log.
    let log = r.log();
    let at = log
        .find("the new process took over every controller")
        .unwrap_or_else(|| panic!("no report\n{log}"));
    let digits: String = log[at..]
        .split("\"pid\":")
        .nth(1)
        .unwrap_or_else(|| panic!("no pid\n{log}"))
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    r.pid = digits.parse().unwrap();
    // The new process serves the client on, and every control socket.
    round_or(&a0, &mut q0, BLOCKS, 1, true, &|| r.log());
    let stats = ctl(&r.controls[1], &["--json", "stats"]);
    assert!(stats.status.success(), "{}", r.log());
    assert!(ctl(&r.controls[0], &["shutdown"]).status.success());
}

#[test]
fn a_connecting_client_delays_or_refuses_the_upgrade_and_never_hangs_it() {
    let mut r = rig_with(
        "upgrade-many-half",
        &["--message-timeout", "1s", "--handshake-timeout", "2s"],
    );
    let (a0, _c0, mut q0) = default_client(&r.sockets[0]);
    round_or(&a0, &mut q0, BLOCKS, 0, true, &|| r.log());
    // Controller 1's client: half of VERSION's header.
    let mut half = std::os::unix::net::UnixStream::connect(&r.sockets[1]).unwrap();
    std::io::Write::write_all(&mut half, &[1, 0, 1, 0, 0, 0, 0, 0]).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    // Either the upgrade waits until the handshake timeout drops that
    // client, or it is refused with the reason; it is answered, and
    // controller 0 serves on either way.
    match r.try_upgrade(2, &[]) {
        Ok(report) => assert_eq!(report["clients"], 1, "{report}"),
        Err(why) => assert!(
            why.contains("controllers[1]") && why.contains("connecting"),
            "{why}"
        ),
    }
    round_or(&a0, &mut q0, BLOCKS, 1, true, &|| r.log());
    // Once the server dropped it, the next upgrade goes through.
    half.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut rest = Vec::new();
    let _ = std::io::Read::read_to_end(&mut half, &mut rest);
    let report = r.upgrade(0);
    assert_eq!(report["clients"], 1, "{report}");
    round_or(&a0, &mut q0, BLOCKS, 2, true, &|| r.log());
    assert!(ctl(&r.controls[0], &["shutdown"]).status.success());
}

/// Each controller's `ram` namespace keeps its data across an upgrade:
/// its memfd is in the handover under its controller (both have NSID 1).
#[test]
fn each_controllers_ram_namespace_keeps_its_data_across_an_upgrade() {
    let mut r = rig("upgrade-many-ram");
    // The same server, its namespaces in ram.
    let mut text = String::from("workers = 1\n");
    for i in 0..3 {
        text.push_str(&format!(
            "\n[[controllers]]\nsocket = \"{}\"\ncontrol = \"{}\"\n\
             [[controllers.namespaces]]\nsize = \"16M\"\n",
            r.sockets[i].display(),
            r.controls[i].display(),
        ));
    }
    assert!(ctl(&r.controls[0], &["shutdown"]).status.success());
    r.wait_gone();
    std::fs::write(&r.config, text).unwrap();
    let log = std::fs::File::create(r.dir.join("serve.log")).unwrap();
    r.first = Command::new(BIN)
        .arg("serve")
        .arg("--config")
        .arg(&r.config)
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    r.pid = r.first.id();
    let (a0, _c0, mut q0) = client_once_free(&r.sockets[0]);
    let (a1, _c1, mut q1) = client_once_free(&r.sockets[1]);
    // Different rounds on each: each must read back its own.
    round_or(&a0, &mut q0, BLOCKS, 10, true, &|| r.log());
    round_or(&a1, &mut q1, BLOCKS, 20, true, &|| r.log());
    let report = r.upgrade(1);
    assert_eq!(report["clients"], 2, "{report}");
    round_or(&a0, &mut q0, BLOCKS, 10, false, &|| r.log());
    round_or(&a1, &mut q1, BLOCKS, 20, false, &|| r.log());
    assert!(ctl(&r.controls[0], &["shutdown"]).status.success());
}
