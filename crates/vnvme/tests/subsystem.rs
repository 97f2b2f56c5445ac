//! One NVM subsystem, several controllers: `vnvme serve --socket A
//! --socket B` serves a controller per socket (CNTLID 1, 2) with one serial
//! and NQN, sharing the namespaces; ANA states per controller. Real
//! vfio-user sockets, one real server process, the project's driver as
//! each controller's client.

mod common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::client::Client;
use common::pattern::pattern;
use common::{ctl_err, ctl_ok, serve_logged, temp_dir, Served, BIN};
use vnvme_driver::{admin, Error};
use vnvme_spec::feature::{AsyncEventConfig, FeatureId};
use vnvme_spec::identify::{Cns, IdentifyNamespace, IDENTIFY_SIZE};
use vnvme_spec::log::{async_event, LogPageId};
use vnvme_spec::{AdminOpcode, Command as Sqe, Status};
use zerocopy::FromBytes;

const NSID: u32 = 1;
const BLOCK: usize = 4096;

/// `vnvme serve --socket S1 --socket S2 ... --ns 64M:ram --control C`,
/// once every socket is there.
fn serve(dir: &Path, n: usize, extra: &[&str]) -> (Served, Vec<PathBuf>, PathBuf) {
    let sockets: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("c{i}.sock"))).collect();
    let control = dir.join("ctl.sock");
    let mut args: Vec<&OsStr> = Vec::new();
    for s in &sockets {
        args.extend([OsStr::new("--socket"), s.as_os_str()]);
    }
    args.extend([OsStr::new("--ns"), OsStr::new("64M:ram")]);
    args.extend([OsStr::new("--control"), control.as_os_str()]);
    args.extend(extra.iter().map(OsStr::new));
    let mut ready: Vec<&Path> = sockets.iter().map(PathBuf::as_path).collect();
    ready.push(&control);
    let served = serve_logged(&args, &dir.join("serve.log"), &ready);
    (served, sockets, control)
}
impl Client {
    /// Controller reset; a fresh I/O queue.
    fn reset(&mut self) {
        self.ctrl.reset().unwrap();
        self.q = self.ctrl.take_io_queue(0).unwrap();
    }

    /// The 4 KiB an Identify with `cns` for `nsid` returns.
    fn identify(&self, cns: Cns, nsid: u32) -> Vec<u8> {
        let mut buf = self.mem.dma_alloc(IDENTIFY_SIZE).unwrap();
        self.ctrl
            .admin(admin::identify(cns, nsid), Some(&mut buf))
            .unwrap();
        buf.to_vec()
    }

    /// Writes 8 blocks at `lba` with data of `seed`, then flushes.
    fn write(&mut self, lba: u64, seed: u32) -> Result<(), Error> {
        let data = pattern(BLOCK * 8, seed);
        let buf = self.mem.dma_alloc(data.len()).unwrap();
        buf.write_bytes(0, &data).unwrap();
        self.q.write(NSID, lba, 8, &buf)?;
        self.q.flush(NSID).map(|_| ())
    }

    /// Reads 8 blocks at `lba`.
    fn read(&mut self, lba: u64) -> Result<Vec<u8>, Error> {
        let mut buf = self.mem.dma_alloc(BLOCK * 8).unwrap();
        self.q.read(NSID, lba, 8, &mut buf)?;
        Ok(buf.to_vec())
    }

    /// The ANA log page (RAE set: the notice stays as it is).
    fn ana_log(&self) -> Vec<u8> {
        let mut buf = self.mem.dma_alloc(4096).unwrap();
        self.ctrl
            .admin(
                admin::get_log_page(LogPageId::ANA, 0xFFFF_FFFF, 4096, true),
                Some(&mut buf),
            )
            .unwrap();
        buf.to_vec()
    }
}

/// A Controller List's CNTLIDs.
fn controller_list(page: &[u8]) -> Vec<u16> {
    let n = usize::from(u16::from_le_bytes([page[0], page[1]]));
    (1..=n)
        .map(|i| u16::from_le_bytes([page[i * 2], page[i * 2 + 1]]))
        .collect()
}

fn io_status(e: &Error) -> Status {
    match e {
        Error::IoCommand { status, .. } => *status,
        other => panic!("not an I/O status: {other}"),
    }
}

#[test]
fn two_sockets_serve_one_subsystem_whose_controllers_share_the_namespace() {
    let dir = temp_dir("subsys-share");
    let (server, sockets, _control) = serve(&dir, 2, &[]);
    let mut a = Client::connect(&sockets[0]);
    let mut b = Client::connect(&sockets[1]);

    // One subsystem: same serial and NQN, CNTLID 1 and 2 in --socket order,
    // CMIC multi-port, multi-controller and ANA reporting.
    let (ia, ib) = (a.ctrl.identify(), b.ctrl.identify());
    assert_eq!((ia.cntlid.get(), ib.cntlid.get()), (1, 2));
    assert_eq!(ia.sn, ib.sn);
    assert_eq!(ia.subnqn, ib.subnqn);
    assert_eq!(ia.cmic, 0b1011);
    assert_eq!(ib.cmic, 0b1011);
    assert_eq!(ia.anagrpmax.get(), 1);
    assert_eq!(ia.nanagrpid.get(), 1);
    assert!(ia.anatt > 0);
    assert_eq!(ia.anacap & 0x1F, 0x1F);

    // The same namespace through both: identifiers, shared, its ANA group.
    let na = IdentifyNamespace::read_from_bytes(&a.identify(Cns::NAMESPACE, NSID)).unwrap();
    let nb = IdentifyNamespace::read_from_bytes(&b.identify(Cns::NAMESPACE, NSID)).unwrap();
    assert_ne!(na.nguid, [0; 16]);
    assert_eq!(na.nguid, nb.nguid);
    assert_eq!(na.eui64, nb.eui64);
    assert_eq!((na.nmic, nb.nmic), (1, 1));
    assert_eq!((na.anagrpid.get(), nb.anagrpid.get()), (NSID, NSID));

    // Controller lists: the subsystem's (13h) and the namespace's (12h).
    assert_eq!(controller_list(&a.identify(Cns::CONTROLLERS, 0)), [1, 2]);
    assert_eq!(
        controller_list(&b.identify(Cns::NS_CONTROLLERS, NSID)),
        [1, 2]
    );

    // Data written and flushed through one is read through the other.
    a.write(16, 7).unwrap();
    assert_eq!(b.read(16).unwrap(), pattern(BLOCK * 8, 7));
    b.write(32, 9).unwrap();
    assert_eq!(a.read(32).unwrap(), pattern(BLOCK * 8, 9));
    drop((a, b));
    assert!(server.terminate().success());
}

#[test]
fn reset_and_death_of_one_controller_leave_the_other_serving() {
    let dir = temp_dir("subsys-reset");
    let (server, sockets, _control) = serve(&dir, 2, &[]);
    let mut a = Client::connect(&sockets[0]);
    let mut b = Client::connect(&sockets[1]);
    a.write(0, 1).unwrap();
    // B resets (CC.EN = 0, then enabled again): A's I/O goes on meanwhile.
    b.reset();
    a.write(8, 2).unwrap();
    assert_eq!(b.read(8).unwrap(), pattern(BLOCK * 8, 2));
    // B's client goes away without a shutdown: A is untouched.
    drop(b);
    for seed in 3..10 {
        a.write(64, seed).unwrap();
        assert_eq!(a.read(64).unwrap(), pattern(BLOCK * 8, seed));
    }
    // And B's controller takes a new client, which sees A's data.
    let mut b = Client::connect(&sockets[1]);
    assert_eq!(b.read(64).unwrap(), pattern(BLOCK * 8, 9));
    drop((a, b));
    assert!(server.terminate().success());
}

#[test]
fn detaching_through_the_controller_list_touches_only_the_controller_named() {
    let dir = temp_dir("subsys-attach");
    let (server, sockets, _control) = serve(&dir, 2, &[]);
    let mut a = Client::connect(&sockets[0]);
    let b = Client::connect(&sockets[1]);
    // Namespace Attachment (detach) from A naming only controller 2.
    let mut list = a.mem.dma_alloc(4096).unwrap();
    list.write_bytes(0, &[1, 0, 2, 0]).unwrap();
    let mut cmd = Sqe::new(AdminOpcode::NAMESPACE_ATTACHMENT.0, 0);
    cmd.nsid = NSID.into();
    cmd.cdw10 = 1.into();
    a.ctrl.admin(cmd, Some(&mut list)).unwrap();
    // B hears of it (Namespace Attribute Changed) and no longer has it.
    let events = b.ctrl.wait_events(Duration::from_secs(10)).unwrap();
    assert!(
        events.iter().any(|e| e.kind == async_event::TYPE_NOTICE
            && e.info == async_event::NOTICE_NS_ATTRIBUTE_CHANGED),
        "{events:?}"
    );
    assert!(controller_list(&b.identify(Cns::ACTIVE_NAMESPACES, 0)).is_empty());
    assert!(b.ctrl.poll_events().unwrap().is_empty());
    // A keeps it, and heard nothing.
    assert!(a.ctrl.poll_events().unwrap().is_empty());
    a.write(0, 3).unwrap();
    assert_eq!(controller_list(&a.identify(Cns::NS_CONTROLLERS, NSID)), [1]);
    // A list naming a controller the subsystem lacks is refused.
    list.write_bytes(0, &[1, 0, 9, 0]).unwrap();
    let mut cmd = Sqe::new(AdminOpcode::NAMESPACE_ATTACHMENT.0, 0);
    cmd.nsid = NSID.into();
    match a.ctrl.admin(cmd, Some(&mut list)) {
        Err(Error::AdminCommand { status, .. }) => {
            assert!(
                status.same_code(Status::CONTROLLER_LIST_INVALID),
                "{status}"
            )
        }
        other => panic!("attach to controller 9: {other:?}"),
    }
    drop((a, b));
    assert!(server.terminate().success());
}

#[test]
fn an_inaccessible_path_answers_io_with_the_ana_status_and_its_host_hears_of_it() {
    let dir = temp_dir("subsys-ana");
    let (server, sockets, control) = serve(&dir, 2, &[]);
    let mut a = Client::connect(&sockets[0]);
    let mut b = Client::connect(&sockets[1]);
    // The driver enables Namespace Attribute notices; add ANA Change.
    let aec = AsyncEventConfig::new().with_nan(true).with_anacn(true);
    b.ctrl
        .admin(
            admin::set_features(FeatureId::ASYNC_EVENT_CONFIG, aec.into()),
            None,
        )
        .unwrap();

    let set = ctl_ok(&control, &["ana_set", "controller=2", "state=inaccessible"]);
    assert_eq!(set["changed"], true);
    let e = b.write(0, 1).unwrap_err();
    let status = io_status(&e);
    assert!(
        status.same_code(Status::ASYMMETRIC_ACCESS_INACCESSIBLE),
        "{status}"
    );
    assert_eq!(status.sct(), 3);
    assert!(!status.dnr(), "the host may retry on another path");
    // The other path serves.
    a.write(0, 1).unwrap();
    // B's host got an ANA Change notice, and its ANA log says inaccessible
    // (state 03h) for group 1 holding NSID 1; A's says optimized.
    let events = b.ctrl.wait_events(Duration::from_secs(10)).unwrap();
    assert!(
        events.iter().any(|e| e.kind == async_event::TYPE_NOTICE
            && e.info == async_event::NOTICE_ANA_CHANGE
            && e.lid == LogPageId::ANA.0),
        "{events:?}"
    );
    let log = b.ana_log();
    assert_eq!(u16::from_le_bytes([log[8], log[9]]), 1, "one group");
    assert_eq!(&log[16..20], &1u32.to_le_bytes(), "ANAGRPID");
    assert_eq!(&log[20..24], &1u32.to_le_bytes(), "NNSID");
    assert_eq!(log[32] & 0xF, 0x03);
    assert_eq!(&log[48..52], &NSID.to_le_bytes());
    assert_eq!(a.ana_log()[32] & 0xF, 0x01);
    // Persistent loss and change have their own statuses.
    ctl_ok(
        &control,
        &[
            "ana_set",
            "controller=2",
            "group=1",
            "state=persistent-loss",
        ],
    );
    let status = io_status(&b.read(0).unwrap_err());
    assert!(
        status.same_code(Status::ASYMMETRIC_ACCESS_PERSISTENT_LOSS),
        "{status}"
    );
    ctl_ok(&control, &["ana_set", "controller=2", "state=change"]);
    let status = io_status(&b.read(0).unwrap_err());
    assert!(
        status.same_code(Status::ASYMMETRIC_ACCESS_TRANSITION),
        "{status}"
    );
    // Non-optimized still serves; optimized again serves.
    ctl_ok(
        &control,
        &["ana_set", "controller=2", "state=non-optimized"],
    );
    assert_eq!(b.read(0).unwrap(), pattern(BLOCK * 8, 1));
    ctl_ok(&control, &["ana_set", "controller=2", "state=optimized"]);
    b.write(8, 2).unwrap();
    let states = ctl_ok(&control, &["ana_get"]);
    assert_eq!(states["states"].as_array().unwrap().len(), 2, "{states}");
    drop((a, b));
    assert!(server.terminate().success());
}

/// The path's ANA state on controller `cntlid` for group 1, from ana_get.
fn ana_state(control: &Path, cntlid: u16) -> String {
    let states = ctl_ok(control, &["ana_get"]);
    states["states"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["controller"] == cntlid && s["group"] == 1)
        .map(|s| s["state"].as_str().unwrap().to_string())
        .unwrap_or_else(|| panic!("no state of controller {cntlid}: {states}"))
}

#[test]
fn an_ana_fault_fails_a_path_and_with_a_duration_gives_it_back() {
    let dir = temp_dir("subsys-ana-fault");
    // One from the configuration, armed at start: path 2 non-optimized.
    let cfg = dir.join("faults.toml");
    std::fs::write(
        &cfg,
        "[[fault]]\nkind = \"ana\"\ncontroller = 2\nstate = \"non-optimized\"\n",
    )
    .unwrap();
    let (server, sockets, control) = serve(&dir, 2, &["--config", cfg.to_str().unwrap()]);
    let mut a = Client::connect(&sockets[0]);
    let mut b = Client::connect(&sockets[1]);
    assert_eq!(ana_state(&control, 2), "non-optimized");
    b.write(0, 1).unwrap();
    // At run time, with no duration: the path stays inaccessible.
    let added = ctl_ok(&control, &["fault_add", "kind=ana", "controller=2"]);
    assert!(
        added["id"].is_null(),
        "a state fault has no rule id: {added}"
    );
    let status = io_status(&b.read(0).unwrap_err());
    assert!(
        status.same_code(Status::ASYMMETRIC_ACCESS_INACCESSIBLE),
        "{status}"
    );
    a.write(8, 2).unwrap();
    // With a duration: persistent loss, then back to what the path was
    // (inaccessible, the state before this fault), announced each time.
    ctl_ok(
        &control,
        &[
            "fault_add",
            "kind=ana",
            "controller=2",
            "group=1",
            "state=persistent-loss",
            "duration=300ms",
        ],
    );
    let status = io_status(&b.read(0).unwrap_err());
    assert!(
        status.same_code(Status::ASYMMETRIC_ACCESS_PERSISTENT_LOSS),
        "{status}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while ana_state(&control, 2) == "persistent-loss" {
        assert!(
            std::time::Instant::now() < deadline,
            "the fault never ended"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(ana_state(&control, 2), "inaccessible");
    assert_eq!(ana_state(&control, 1), "optimized");
    ctl_ok(&control, &["ana_set", "controller=2", "state=optimized"]);
    assert_eq!(b.read(8).unwrap(), pattern(BLOCK * 8, 2));
    // Wrong ones are refused with the reason.
    for (args, expect) in [
        (&["fault_add", "kind=ana"][..], "needs controller"),
        (
            &["fault_add", "kind=ana", "controller=9"][..],
            "no controller 9",
        ),
        (
            &["fault_add", "kind=ana", "controller=2", "state=broken"][..],
            "unknown ANA state",
        ),
        (
            &["fault_add", "kind=ana", "controller=2", "group=7"][..],
            "no ANA group 7",
        ),
        (
            &["fault_add", "kind=ana", "controller=2", "duration=2h"][..],
            "at most 3600 s",
        ),
    ] {
        let err = ctl_err(&control, args);
        assert!(err.contains(expect), "{args:?}: {err}");
    }
    drop((a, b));
    assert!(server.terminate().success());
}

#[test]
fn ana_set_refuses_what_the_subsystem_lacks() {
    let dir = temp_dir("subsys-ana-bad");
    let (server, _sockets, control) = serve(&dir, 2, &[]);
    for (args, expect) in [
        (
            &["ana_set", "controller=3", "state=inaccessible"][..],
            "no controller 3",
        ),
        (
            &["ana_set", "controller=1", "group=5", "state=inaccessible"][..],
            "no ANA group 5",
        ),
        (
            &["ana_set", "controller=1", "state=degraded"][..],
            "unknown ANA state",
        ),
        (&["ana_set", "state=optimized"][..], "controller"),
    ] {
        let err = ctl_err(&control, args);
        assert!(err.contains(expect), "{args:?}: {err}");
    }
    assert!(server.terminate().success());
}

#[test]
fn a_socket_given_twice_is_refused() {
    let dir = temp_dir("subsys-twice");
    let s = dir.join("a.sock");
    let out = Command::new(BIN)
        .arg("serve")
        .arg("--socket")
        .arg(&s)
        .arg("--socket")
        .arg(&s)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("given twice"), "{err}");
}

/// The body of `GET /metrics` on `addr` (the server answers and closes).
fn scrape(addr: std::net::SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    body.to_string()
}

#[test]
fn stats_and_metrics_report_every_controller_by_cntlid() {
    let dir = temp_dir("subsys-stats");
    let stats = dir.join("stats.json");
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (server, sockets, control) = serve(
        &dir,
        2,
        &[
            "--stats",
            stats.to_str().unwrap(),
            "--metrics",
            &addr.to_string(),
        ],
    );
    let mut a = Client::connect(&sockets[0]);
    let mut b = Client::connect(&sockets[1]);
    // A: one write and one flush; B: two reads.
    a.write(16, 7).unwrap();
    b.read(16).unwrap();
    b.read(24).unwrap();
    let check = |all: &serde_json::Value| {
        let c = all["controllers"]
            .as_array()
            .expect("a list of controllers");
        assert_eq!(c.len(), 2, "{all}");
        assert_eq!(
            (c[0]["cntlid"].as_u64(), c[1]["cntlid"].as_u64()),
            (Some(1), Some(2))
        );
        let io = |i: usize, op: &str| c[i]["io_commands"][op].as_u64().unwrap_or(0);
        assert_eq!((io(0, "write"), io(0, "flush"), io(0, "read")), (1, 1, 0));
        assert_eq!((io(1, "write"), io(1, "flush"), io(1, "read")), (0, 0, 2));
        // The namespace's counters are the subsystem's: the same in both.
        assert_eq!(c[0]["namespaces"], c[1]["namespaces"]);
        assert_eq!(c[0]["namespaces"][0]["read_commands"], 2);
        assert_eq!(c[0]["namespaces"][0]["write_commands"], 1);
    };
    // The control socket: every controller by default, or the one named.
    check(&ctl_ok(&control, &["stats"]));
    let two = ctl_ok(&control, &["stats", "controller=2"]);
    assert_eq!(two["cntlid"], 2);
    assert_eq!(two["io_commands"]["read"], 2);
    // Metrics: a controller's own counters labelled by cntlid, the
    // namespace's once.
    let text = scrape(addr);
    for line in [
        "vnvme_commands_total{queue_type=\"io\",opcode=\"write\",cntlid=\"1\"} 1",
        "vnvme_commands_total{queue_type=\"io\",opcode=\"read\",cntlid=\"2\"} 2",
        "vnvme_enables_total{cntlid=\"1\"} 1",
        "vnvme_enables_total{cntlid=\"2\"} 1",
        "vnvme_namespace_read_commands_total{nsid=\"1\"} 2",
        "vnvme_namespace_write_commands_total{nsid=\"1\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line} in\n{text}");
    }
    let families = text
        .lines()
        .filter(|l| l.starts_with("# TYPE vnvme_commands_total "));
    assert_eq!(families.count(), 1, "one family, both controllers in it");
    drop((a, b));
    assert!(server.terminate().success());
    // The file as written at exit.
    check(&serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap());
}

/// `[[fault]]` tables reading `unrecovered-read-error` (DNR) on 8 blocks
/// at `lba`, each with `controller = N` when given.
fn read_faults(dir: &Path, faults: &[(u64, Option<u16>)]) -> PathBuf {
    let mut text = String::new();
    for (lba, controller) in faults {
        text += &format!(
            "[[fault]]\nkind = \"status\"\nnsid = 1\nopcodes = [\"read\"]\nlba = {lba}\n\
             blocks = 8\nstatus = \"unrecovered-read-error\"\ndnr = true\n"
        );
        if let Some(n) = controller {
            text += &format!("controller = {n}\n");
        }
    }
    let path = dir.join("faults.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_configured_fault_hits_the_controller_it_names_or_every_one() {
    let dir = temp_dir("subsys-faults");
    let config = read_faults(&dir, &[(0, Some(2)), (64, None)]);
    let (server, sockets, _control) = serve(&dir, 2, &["--config", config.to_str().unwrap()]);
    let mut a = Client::connect(&sockets[0]);
    let mut b = Client::connect(&sockets[1]);
    let failed = Status::UNRECOVERED_READ_ERROR.with_dnr(true);
    // controller = 2: B's reads only.
    assert!(a.read(0).is_ok());
    assert_eq!(io_status(&b.read(0).unwrap_err()), failed);
    // No controller: every controller's.
    assert_eq!(io_status(&a.read(64).unwrap_err()), failed);
    assert_eq!(io_status(&b.read(64).unwrap_err()), failed);
    assert!(a.read(128).is_ok() && b.read(128).is_ok());
    drop((a, b));
    assert!(server.terminate().success());
}

/// Starts `vnvme serve` with `sockets` sockets in `dir` and a 1 MiB `ram`
/// namespace; it must refuse to start: its stderr.
fn refused_start(dir: &Path, sockets: usize, config: &Path) -> String {
    let mut serve = Command::new(BIN);
    serve.arg("serve");
    for name in ["a.sock", "b.sock"].iter().take(sockets) {
        serve.args(["--socket", dir.join(name).to_str().unwrap()]);
    }
    let out = serve
        .args(["--ns", "1M:ram", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_configured_fault_on_a_controller_the_subsystem_lacks_is_refused() {
    let dir = temp_dir("subsys-fault-3");
    let config = read_faults(&dir, &[(0, Some(3))]);
    let err = refused_start(&dir, 2, &config);
    assert!(
        err.contains("controller = 3: the subsystem has controllers 1 to 2"),
        "{err}"
    );
    assert!(!dir.join("a.sock").exists(), "no socket left behind");
    // One socket: only controller 1 exists.
    let err = refused_start(&dir, 1, &config);
    assert!(err.contains("this server has one controller, 1"), "{err}");
}

#[test]
fn configured_qos_limits_the_controller_it_names() {
    let dir = temp_dir("subsys-qos");
    let config = dir.join("qos.toml");
    std::fs::write(&config, "[qos]\niops = 2\niops_burst = 1\ncontroller = 2\n").unwrap();
    let (server, sockets, control) = serve(&dir, 2, &["--config", config.to_str().unwrap()]);
    let mut a = Client::connect(&sockets[0]);
    let mut b = Client::connect(&sockets[1]);
    for lba in [0, 8, 16, 24] {
        a.read(lba).unwrap();
        b.read(lba).unwrap();
    }
    let throttled = |n: &str| {
        let s = ctl_ok(&control, &["stats", &format!("controller={n}")]);
        s["qos_throttled_commands"].as_u64().unwrap()
    };
    // B: one command from its burst of 1, three waited; A: no limit.
    assert_eq!((throttled("1"), throttled("2")), (0, 3));
    drop((a, b));
    assert!(server.terminate().success());
    // A controller the subsystem lacks is refused.
    std::fs::write(&config, "[qos]\niops = 2\ncontroller = 3\n").unwrap();
    let err = refused_start(&dir, 2, &config);
    assert!(
        err.contains("qos: controller = 3: this server has controllers 1 to 2"),
        "{err}"
    );
}

/// `fault_add` of a read fault on 8 blocks at `lba`, with `more` params.
fn add_read_fault(control: &Path, lba: u64, more: &[&str]) -> serde_json::Value {
    let lba = format!("lba={lba}");
    let mut args = vec![
        "fault_add",
        "kind=status",
        "nsid=1",
        "opcodes=read",
        &lba,
        "blocks=8",
        "status=unrecovered-read-error",
        "dnr=true",
    ];
    args.extend_from_slice(more);
    ctl_ok(control, &args)
}

/// The ids of controller `cntlid`'s command faults in a `fault_list`.
fn fault_ids(list: &serde_json::Value, cntlid: u16) -> Vec<u64> {
    let each = list["controllers"].as_array().unwrap();
    let c = each.iter().find(|c| c["cntlid"] == cntlid).unwrap();
    let faults = c["faults"].as_array().unwrap();
    faults.iter().map(|f| f["id"].as_u64().unwrap()).collect()
}

#[test]
fn a_control_socket_fault_hits_the_controller_it_names_or_every_one_with_one_id() {
    let dir = temp_dir("subsys-ctl-faults");
    let (server, sockets, control) = serve(&dir, 2, &[]);
    let mut a = Client::connect(&sockets[0]);
    let mut b = Client::connect(&sockets[1]);
    let failed = Status::UNRECOVERED_READ_ERROR.with_dnr(true);

    // controller=2: B's reads only.
    let only_b = add_read_fault(&control, 0, &["controller=2"]);
    assert_eq!(only_b["controllers"], serde_json::json!([2]));
    let only_b = only_b["id"].as_u64().unwrap();
    assert!(a.read(0).is_ok());
    assert_eq!(io_status(&b.read(0).unwrap_err()), failed);

    // No controller: every controller's, with one id.
    let both = add_read_fault(&control, 64, &[]);
    assert_eq!(both["controllers"], serde_json::json!([1, 2]));
    let both = both["id"].as_u64().unwrap();
    assert_ne!(both, only_b);
    assert_eq!(io_status(&a.read(64).unwrap_err()), failed);
    assert_eq!(io_status(&b.read(64).unwrap_err()), failed);

    let list = ctl_ok(&control, &["fault_list"]);
    assert_eq!(fault_ids(&list, 1), [both]);
    assert_eq!(fault_ids(&list, 2), [only_b, both]);
    let of_b = ctl_ok(&control, &["fault_list", "controller=2"]);
    assert_eq!(
        (of_b["cntlid"].as_u64(), of_b["faults"][1]["hits"].as_u64()),
        (Some(2), Some(1))
    );

    // One id clears every copy; the other controller's stays.
    let clear = format!("id={both}");
    assert_eq!(ctl_ok(&control, &["fault_clear", &clear])["cleared"], 2);
    assert!(a.read(64).is_ok() && b.read(64).is_ok());
    assert_eq!(io_status(&b.read(0).unwrap_err()), failed);
    let clear = format!("id={only_b}");
    let e = ctl_err(&control, &["fault_clear", &clear, "controller=1"]);
    assert!(e.contains(&format!("no fault with id {only_b}")), "{e}");
    assert_eq!(
        ctl_ok(&control, &["fault_clear", "controller=2"])["cleared"],
        1
    );
    assert!(b.read(0).is_ok());

    // A controller the subsystem lacks: refused, nothing armed.
    let e = ctl_err(
        &control,
        &["fault_add", "kind=never-complete", "controller=3"],
    );
    assert!(e.contains("no controller 3"), "{e}");
    let list = ctl_ok(&control, &["fault_list"]);
    assert!(fault_ids(&list, 1).is_empty() && fault_ids(&list, 2).is_empty());
    drop((a, b));
    assert!(server.terminate().success());
}
