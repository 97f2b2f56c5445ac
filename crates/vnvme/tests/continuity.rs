//! State that I/O commands change, across a live upgrade and a SIGKILL
//! under `--supervise` (issue 35 items 2 and 3): a zoned namespace's write
//! pointers and zone states, reservations and registrants, and fused
//! Compare and Write (not supported: refused half by half, so none is ever
//! in flight). A real `vnvme serve` driven by our driver over its
//! vfio-user socket; the basic cases are in tests/upgrade.rs and
//! tests/supervise.rs.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::client::Client;
use common::{ctl, temp_dir, TempDir, BIN};
use serde_json::Value;
use vnvme_driver::passthru::PassthruData;
use vnvme_spec::reservation::{RegisteredController, ReservationStatus};
use vnvme_spec::zns::{zone_state, zsa};
use vnvme_spec::{AdminOpcode, Command as Sqe, NvmOpcode, Status};
use zerocopy::FromBytes;

/// The namespace's block size (a new image's default format).
const BLOCK: usize = 4096;

/// How the serving process is replaced.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cut {
    /// `vnvme ctl upgrade`.
    Upgrade,
    /// SIGKILL of the server `--supervise` started.
    Kill,
}

struct Server {
    dir: TempDir,
    _ns: TempDir,
    socket: PathBuf,
    control: PathBuf,
    first: Child,
    /// The upgraded server's pid (the supervisor's child dies with it).
    pid: u32,
    cut: Cut,
    cuts: usize,
    /// When the serving process started (or was last restored).
    started: Instant,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.pid as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
        let _ = self.first.kill();
        let _ = self.first.wait();
    }
}

/// `vnvme serve [--supervise] --ns 16M:file=IMAGE{ns_options}`, with a
/// control socket.
fn server(name: &str, cut: Cut, ns_options: &str) -> Server {
    let dir = temp_dir(name);
    let ns_dir = temp_dir(&format!("{name}-ns"));
    let socket = dir.join("vnvme.sock");
    let control = dir.join("control.sock");
    let ns = format!("16M:file={}{ns_options}", ns_dir.join("ns1.img").display());
    let log = std::fs::File::create(dir.join("serve.log")).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.arg("serve");
    if cut == Cut::Kill {
        cmd.arg("--supervise");
    }
    let first = cmd
        .args(["--doorbells", "shadow", "--ns", &ns, "--socket"])
        .arg(&socket)
        .arg("--control")
        .arg(&control)
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    let pid = first.id();
    let s = Server {
        dir,
        _ns: ns_dir,
        socket,
        control,
        first,
        pid,
        cut,
        cuts: 0,
        started: Instant::now(),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(s.socket.exists() && s.control.exists()) {
        assert!(Instant::now() < deadline, "no sockets\n{}", s.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    if cut == Cut::Kill {
        s.wait_log("supervising the server, pid", 1);
    }
    s
}

impl Server {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
    }

    fn wait_log(&self, what: &str, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.log().matches(what).count() < n {
            assert!(
                Instant::now() < deadline,
                "{what:?} not {n} times:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Replaces the serving process, which serves the same client on.
    fn cut(&mut self) {
        self.cuts += 1;
        match self.cut {
            Cut::Upgrade => {
                let out = ctl(&self.control, &["--json", "upgrade"]);
                assert!(
                    out.status.success(),
                    "upgrade: {}\n{}",
                    String::from_utf8_lossy(&out.stderr),
                    self.log()
                );
                let report: Value = serde_json::from_slice(&out.stdout).unwrap();
                self.pid = report["pid"].as_u64().unwrap() as u32;
            }
            Cut::Kill => {
                // The server's thread clears its message word just after
                // the reply the client already has: a kill in between is
                // one "handling a message", whose client is not restored.
                std::thread::sleep(Duration::from_millis(100));
                // A server that dies within 1 s of its start three times
                // in a row loses its client: each lives longer.
                let lived = self.started.elapsed();
                std::thread::sleep(Duration::from_millis(1200).saturating_sub(lived));
                let log = self.log();
                let at = log.rfind("supervising the server, pid ").unwrap();
                let rest = &log[at + "supervising the server, pid ".len()..];
                let end = rest.find(|c: char| !c.is_ascii_digit()).unwrap();
                let pid = rustix::process::Pid::from_raw(rest[..end].parse().unwrap()).unwrap();
                rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
                self.wait_log("restoring the client from the crash area's slot", self.cuts);
                self.wait_log("supervising the server, pid", self.cuts + 1);
                self.started = Instant::now();
            }
        }
    }
}

impl Client {
    /// A command of namespace 1 with `cdw10` and `data` (written, or read
    /// back if `read`): its status and the buffer.
    fn nvm(&mut self, op: u8, cdw10: u32, data: &[u8], read: bool) -> (Status, Vec<u8>) {
        let buf = self.mem.dma_alloc(4096).unwrap();
        buf.write_bytes(0, data).unwrap();
        let mut c = Sqe::new(op, 0);
        c.nsid = 1.into();
        c.cdw10 = cdw10.into();
        let d = match read {
            true => PassthruData::read(&buf, data.len()),
            false => PassthruData::write(&buf, data.len()),
        };
        let status = self.q.passthru(c, Some(d)).unwrap().status;
        (status, buf.to_vec())
    }

    /// Reservation Report: the reservation type and the registrants'
    /// (host id byte, holds, key).
    fn reservations(&mut self) -> (u8, Vec<(u8, u8, u64)>) {
        let op = NvmOpcode::RESERVATION_REPORT.0;
        let (status, page) = self.nvm(op, 4096 / 4 - 1, &[0; 4096], true);
        assert_eq!(status, Status::SUCCESS, "report");
        let (head, rest) = ReservationStatus::read_from_prefix(&page).unwrap();
        let entries = (0..usize::from(head.regctl.get()))
            .map(|i| RegisteredController::read_from_bytes(&rest[i * 24..(i + 1) * 24]).unwrap())
            .map(|e| (e.hostid[0], e.rcsts, e.rkey.get()))
            .collect();
        (head.rtype, entries)
    }

    /// Every zone's (state, write pointer).
    fn zones(&mut self) -> Vec<(u8, u64)> {
        let buf = self.mem.dma_alloc(BLOCK).unwrap();
        let report = self.q.report_zones(1, 0, 0, false, &buf).unwrap();
        report
            .zones
            .iter()
            .map(|z| (z.zs >> 4, z.wp.get()))
            .collect()
    }

    /// A write of `n` blocks at `lba`: its status.
    fn write_at(&mut self, lba: u64, n: u32) -> Status {
        let buf = self.mem.dma_alloc(n as usize * BLOCK).unwrap();
        match self.q.write(1, lba, n, &buf) {
            Ok(_) => Status::SUCCESS,
            Err(vnvme_driver::Error::IoCommand { status, .. }) => status,
            Err(e) => panic!("write: {e}"),
        }
    }

    /// Two register reads: each a vfio-user message, after which a
    /// supervised server keeps what changed (a checkpoint) before it reads
    /// the next.
    fn settle(&self) {
        for _ in 0..2 {
            self.mem.read32(0x1c).unwrap();
        }
    }
}

/// Reservation Register key `KEY` for host 7, then Acquire Write Exclusive.
const KEY: u64 = 0x5eed;

fn reservations_survive(cut: Cut, name: &str) {
    let mut s = server(name, cut, "");
    let mut c = Client::connect(&s.socket);
    let host = c.mem.dma_alloc(4096).unwrap();
    host.write_bytes(0, &[7; 8]).unwrap();
    let mut id = Sqe::new(AdminOpcode::SET_FEATURES.0, 0);
    id.cdw10 = 0x81.into();
    let done = c
        .ctrl
        .admin_passthru(id, Some(PassthruData::write(&host, 8)));
    assert_eq!(done.unwrap().status, Status::SUCCESS);
    let keys = [0u64.to_le_bytes(), KEY.to_le_bytes()].concat();
    let register = NvmOpcode::RESERVATION_REGISTER.0;
    assert_eq!(c.nvm(register, 0, &keys, false).0, Status::SUCCESS);
    let crkey = [KEY.to_le_bytes(), 0u64.to_le_bytes()].concat();
    let acquire = NvmOpcode::RESERVATION_ACQUIRE.0;
    assert_eq!(c.nvm(acquire, 1 << 8, &crkey, false).0, Status::SUCCESS);
    let before = c.reservations();
    assert_eq!(before, (1, vec![(7, 1, KEY)]));
    c.settle();
    for _ in 0..2 {
        s.cut();
        assert_eq!(
            c.reservations(),
            before,
            "after cut {}\n{}",
            s.cuts,
            s.log()
        );
        assert_eq!(c.write_at(0, 1), Status::SUCCESS, "the holder writes");
    }
    // The kept key still releases.
    let release = NvmOpcode::RESERVATION_RELEASE.0;
    let (status, _) = c.nvm(release, 1 << 8, &KEY.to_le_bytes(), false);
    assert_eq!(status, Status::SUCCESS);
    assert_eq!(c.reservations(), (0, vec![(7, 0, KEY)]));
}

#[test]
fn reservations_and_registrants_survive_upgrades() {
    reservations_survive(Cut::Upgrade, "cont-resv-upgrade");
}

/// Failed before reservation commands counted as a state change: the
/// crash area kept the state from before them, and the new server had no
/// registrant.
#[test]
fn reservations_and_registrants_survive_kills() {
    reservations_survive(Cut::Kill, "cont-resv-kill");
}

#[test]
fn zone_states_and_write_pointers_survive_upgrades_and_fused_commands_are_refused() {
    zones_survive(Cut::Upgrade, "cont-zoned");
}

/// Failed before the crash area kept the zones (the start was refused);
/// without the words put over the slot (the slot alone) the zones changed
/// since it was written came back empty after the first kill.
#[test]
fn zone_states_and_write_pointers_survive_kills() {
    zones_survive(Cut::Kill, "cont-zoned-kill");
}

fn zones_survive(cut: Cut, name: &str) {
    let mut s = server(name, cut, ",zoned,zone-size=128K");
    let mut c = Client::connect(&s.socket);
    // 128 zones of 32 blocks: zone 0 written 4 blocks (implicitly open),
    // zone 1 appended 2, zone 2 opened, zone 3 written 1 and closed, zone 4
    // finished; the rest empty.
    const Z: u64 = 32;
    assert_eq!(c.write_at(0, 4), Status::SUCCESS);
    let data = c.mem.dma_alloc(2 * BLOCK).unwrap();
    assert_eq!(c.q.zone_append(1, Z, 2, &data).unwrap(), Z);
    c.q.zone_action(1, 2 * Z, zsa::OPEN, false).unwrap();
    assert_eq!(c.write_at(3 * Z, 1), Status::SUCCESS);
    c.q.zone_action(1, 3 * Z, zsa::CLOSE, false).unwrap();
    c.q.zone_action(1, 4 * Z, zsa::FINISH, false).unwrap();
    let before = c.zones();
    assert_eq!(
        before[..6],
        [
            (zone_state::IMPLICITLY_OPENED, 4),
            (zone_state::IMPLICITLY_OPENED, Z + 2),
            (zone_state::EXPLICITLY_OPENED, 2 * Z),
            (zone_state::CLOSED, 3 * Z + 1),
            (zone_state::FULL, 5 * Z),
            (zone_state::EMPTY, 5 * Z),
        ]
    );
    for _ in 0..2 {
        s.cut();
        assert_eq!(c.zones(), before, "after cut {}", s.cuts);
    }
    // The host writes on at the write pointer it tracks, the process cut
    // between its writes; each Zone Report after a cut is its model.
    let mut model = before.clone();
    for round in 1..=3u64 {
        let wp = model[6].1;
        assert_eq!(
            c.write_at(wp, round as u32),
            Status::SUCCESS,
            "round {round}"
        );
        model[6] = (zone_state::IMPLICITLY_OPENED, wp + round);
        s.cut();
        assert_eq!(c.zones(), model, "after cut {}", s.cuts);
    }
    // The write pointers hold: a write behind one is refused, at it
    // succeeds; an append lands at the next block.
    assert_eq!(c.write_at(0, 1), Status::ZONE_INVALID_WRITE.with_dnr(true));
    assert_eq!(c.write_at(4, 1), Status::SUCCESS);
    assert_eq!(c.q.zone_append(1, Z, 1, &data).unwrap(), Z + 2);
    assert_eq!(
        c.zones()[..2],
        [
            (zone_state::IMPLICITLY_OPENED, 5),
            (zone_state::IMPLICITLY_OPENED, Z + 3)
        ]
    );

    // Fused Compare and Write (FUSE 01b then 10b): FUSES is 0, each half
    // is refused with Invalid Field and nothing is written, so no fused
    // pair is ever in flight at an upgrade or a crash.
    let block = [0xabu8; BLOCK];
    let mut first = Sqe::new(NvmOpcode::COMPARE.0, 0);
    first.cdw0 = (u32::from(NvmOpcode::COMPARE.0) | (1 << 8)).into();
    let mut second = Sqe::new(NvmOpcode::WRITE.0, 0);
    second.cdw0 = (u32::from(NvmOpcode::WRITE.0) | (2 << 8)).into();
    for mut half in [first, second] {
        half.nsid = 1.into();
        half.cdw10 = (5 * Z as u32).into();
        let buf = c.mem.dma_alloc(4096).unwrap();
        buf.write_bytes(0, &block).unwrap();
        let done =
            c.q.passthru(half, Some(PassthruData::write(&buf, 512)))
                .unwrap();
        assert_eq!(
            done.status,
            Status::INVALID_FIELD.with_dnr(true),
            "{half:?}"
        );
    }
    assert_eq!(c.zones()[5], (zone_state::EMPTY, 5 * Z), "nothing written");
}

/// The crash area keeps 2^20 zones in all: two namespaces of 2^20 zones
/// each are refused at the start, saying so.
#[test]
fn zones_beyond_the_crash_area_are_refused_under_supervise() {
    let dir = temp_dir("cont-zoned-supervise");
    let ns = |i| {
        format!(
            "4G:file={},zoned,zone-size=4K",
            dir.join(format!("z{i}.img")).display()
        )
    };
    let out = Command::new(BIN)
        .args(["serve", "--supervise", "--socket"])
        .arg(dir.join("vnvme.sock"))
        .args(["--ns", &ns(1), "--ns", &ns(2)])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the server failed to start 3 times in a row")
            && err.contains(
                "the zoned namespaces have 2097152 zones, more than the 1048576 a --supervise \
                 crash area keeps"
            ),
        "{err}"
    );
}
