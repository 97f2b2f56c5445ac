//! The control socket of a real `vnvme serve`: every method through `vnvme
//! ctl`, the changes seen from the host side (`vnvme list` and
//! `io-passthru`, our driver over the vfio-user socket), and hostile
//! control clients that must not crash or wedge the server.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{ctl, ctl_err, ctl_ok, json, serve, vnvme, Served, BIN};

struct Rig {
    _dir: common::TempDir,
    socket: PathBuf,
    control: PathBuf,
    server: Served,
}

fn rig(name: &str, extra: &[&str]) -> Rig {
    let dir = common::temp_dir(name);
    let socket = dir.join("vnvme.sock");
    let control = dir.join("control.sock");
    let mut args = vec!["--control", control.to_str().unwrap()];
    args.extend_from_slice(extra);
    let server = serve(&socket, &args);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !control.exists() {
        assert!(Instant::now() < deadline, "no control socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    Rig {
        _dir: dir,
        socket,
        control,
        server,
    }
}

/// (NSID, size in bytes) of each namespace the driver sees.
fn namespaces(socket: &Path) -> Vec<(u64, u64)> {
    let out = vnvme(&["list", "--json"], socket);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&out)["Devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["NameSpace"].as_u64().unwrap(),
                d["PhysicalSize"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// One 4 KiB read of LBA `lba` on namespace 1 through `io-passthru`.
fn read_block(socket: &Path, lba: u32) -> Output {
    let lba = lba.to_string();
    vnvme(
        &[
            "io-passthru",
            "-o",
            "2",
            "-n",
            "1",
            "--cdw10",
            &lba,
            "-l",
            "4096",
            "-r",
            "--json",
        ],
        socket,
    )
}

#[test]
fn namespace_methods_change_what_the_host_sees() {
    let r = rig("ns", &["--ns", "16M:ram", "--max-namespaces", "4"]);
    let mode = std::fs::metadata(&r.control).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "owner only by default");

    assert_eq!(
        ctl_ok(&r.control, &["namespace_add", "ns=8M:ram"])["nsid"],
        2
    );
    assert_eq!(namespaces(&r.socket), vec![(1, 16 << 20), (2, 8 << 20)]);
    let v = ctl_ok(&r.control, &["namespace_resize", "nsid=2", "size=12M"]);
    assert_eq!(v["nsze"], 3072);
    assert_eq!(namespaces(&r.socket), vec![(1, 16 << 20), (2, 12 << 20)]);
    ctl_ok(&r.control, &["namespace_detach", "nsid=2"]);
    assert_eq!(namespaces(&r.socket), vec![(1, 16 << 20)]);
    let e = ctl_err(&r.control, &["namespace_detach", "nsid=2"]);
    assert!(e.contains("namespace 2 is not attached"), "{e}");
    ctl_ok(&r.control, &["namespace_attach", "nsid=2"]);
    assert_eq!(namespaces(&r.socket).len(), 2);
    ctl_ok(&r.control, &["namespace_remove", "nsid=2"]);
    assert_eq!(namespaces(&r.socket), vec![(1, 16 << 20)]);
    let e = ctl_err(&r.control, &["namespace_remove", "nsid=2"]);
    assert!(e.contains("namespace 2 does not exist"), "{e}");
    let e = ctl_err(&r.control, &["namespace_add", "ns=1G:floppy"]);
    assert!(e.contains("unknown backend 'floppy'"), "{e}");
    // Readable output without --json.
    let out = ctl(&r.control, &["namespace_add", "ns=4M:null", "nsid=4"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "nsid: 4\n");

    let status = r.server.terminate();
    assert!(status.success());
    assert!(!r.control.exists(), "the control socket was not removed");
}

#[test]
fn faults_added_listed_and_cleared_are_seen_by_the_driver() {
    let r = rig("faults", &["--ns", "16M:ram"]);
    assert!(read_block(&r.socket, 0).status.success());
    let v = ctl_ok(
        &r.control,
        &[
            "fault_add",
            "kind=status",
            "nsid=1",
            "opcodes=read",
            "lba=8",
            "blocks=8",
            "status=unrecovered-read-error",
            "dnr=true",
            "count=2",
        ],
    );
    let id = v["id"].as_u64().unwrap();
    let list = ctl_ok(&r.control, &["fault_list"]);
    assert_eq!(list["faults"][0]["id"], id);
    assert_eq!(list["faults"][0]["status"], "unrecovered-read-error");

    assert!(
        read_block(&r.socket, 0).status.success(),
        "outside the range"
    );
    let out = read_block(&r.socket, 9);
    assert!(!out.status.success());
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.to_lowercase().contains("unrecovered")
            || text.contains("0x4281")
            || text.contains("281"),
        "{text}"
    );
    assert_eq!(ctl_ok(&r.control, &["fault_list"])["faults"][0]["hits"], 1);
    let clear = format!("id={id}");
    assert_eq!(ctl_ok(&r.control, &["fault_clear", &clear])["cleared"], 1);
    assert!(read_block(&r.socket, 9).status.success(), "cleared");

    // A media error until rewritten, then SMART warnings in the log.
    ctl_ok(
        &r.control,
        &[
            "fault_add",
            "kind=media-error",
            "nsid=1",
            "lba=20",
            "blocks=2",
        ],
    );
    assert!(!read_block(&r.socket, 21).status.success());
    ctl_ok(
        &r.control,
        &["fault_add", "kind=smart-warning", "warning=spare"],
    );
    assert_eq!(ctl_ok(&r.control, &["fault_list"])["smart_warning"], 1);
    ctl_ok(&r.control, &["fault_clear"]);
    assert_eq!(ctl_ok(&r.control, &["fault_list"])["smart_warning"], 0);

    let e = ctl_err(&r.control, &["fault_add", "kind=status", "status=nonsense"]);
    assert!(e.contains("unknown status"), "{e}");
    let e = ctl_err(&r.control, &["fault_clear", "id=99"]);
    assert!(e.contains("no fault with id 99"), "{e}");

    let before = ctl_ok(&r.control, &["stats"])["fatal_errors"]
        .as_u64()
        .unwrap();
    ctl_ok(&r.control, &["controller_fatal", "reason=test"]);
    assert_eq!(ctl_ok(&r.control, &["stats"])["fatal_errors"], before + 1);
    // The driver's reset at its next start recovers the controller.
    assert!(read_block(&r.socket, 0).status.success());

    ctl_ok(&r.control, &["shutdown"]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while r.socket.exists() {
        assert!(
            Instant::now() < deadline,
            "shutdown did not stop the server"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `vnvme io-passthru` or `admin-passthru` on namespace 1 as JSON.
fn passthru(socket: &Path, args: &[&str]) -> serde_json::Value {
    let mut a = args.to_vec();
    a.extend_from_slice(&["--namespace-id", "1", "--json"]);
    json(&vnvme(&a, socket))
}

/// The Changed Zone List of namespace 1 (Get Log Page BFh, 4 KiB): its
/// zone identifiers.
fn changed_zones(socket: &Path) -> Vec<u64> {
    let cdw10 = (0xBF | (1023 << 16)).to_string();
    let args = ["admin-passthru", "--opcode", "0x02", "--cdw10", &cdw10];
    let doc = passthru(
        socket,
        &[&args[..], &["--data-len", "4096", "--read"]].concat(),
    );
    assert_eq!(doc["status_name"], "success", "{doc}");
    let hex = doc["data"].as_str().unwrap();
    let byte = |i: usize| u8::from_str_radix(&hex[i * 2..i * 2 + 2], 16).unwrap();
    let n = u16::from_le_bytes([byte(0), byte(1)]);
    (0..usize::from(n))
        .map(|e| u64::from_le_bytes(std::array::from_fn(|b| byte(8 + e * 8 + b))))
        .collect()
}

#[test]
fn zone_set_state_fails_zones_the_host_then_sees_in_the_changed_zone_list() {
    // 1 MiB zones of 4 KiB blocks: 256 blocks each.
    let r = rig("zones", &["--ns", "16M:ram,zoned,zone-size=1M"]);
    let block = r._dir.join("block");
    std::fs::write(&block, [0x5A; 4096]).unwrap();
    let write = |lba: u64| {
        let lba = lba.to_string();
        let args = ["io-passthru", "--opcode", "1", "--cdw10", &lba];
        let file = block.to_str().unwrap();
        let data = ["--data-len", "4096", "--write", "--input-file", file];
        passthru(&r.socket, &[&args[..], &data].concat())
    };
    assert_eq!(write(512)["status_name"], "success");
    assert_eq!(changed_zones(&r.socket), Vec::<u64>::new());

    let v = ctl_ok(
        &r.control,
        &["zone_set_state", "nsid=1", "zslba=512", "state=read-only"],
    );
    assert_eq!(v["changed"], true);
    assert_eq!(write(513)["status_name"], "zone-is-read-only");
    ctl_ok(
        &r.control,
        &["zone_set_state", "nsid=1", "zslba=1024", "state=offline"],
    );
    assert_eq!(write(1024)["status_name"], "zone-is-offline");
    let read = passthru(
        &r.socket,
        &[
            "io-passthru",
            "--opcode",
            "2",
            "--cdw10",
            "1024",
            "--data-len",
            "4096",
            "--read",
        ],
    );
    assert_eq!(read["status_name"], "zone-is-offline");
    // Listed until read (without RAE): then empty.
    assert_eq!(changed_zones(&r.socket), vec![512, 1024]);
    assert_eq!(changed_zones(&r.socket), Vec::<u64>::new());
    // Again: nothing changes, nothing listed.
    let v = ctl_ok(
        &r.control,
        &["zone_set_state", "nsid=1", "zslba=1024", "state=offline"],
    );
    assert_eq!(v["changed"], false);
    assert_eq!(changed_zones(&r.socket), Vec::<u64>::new());

    let e = ctl_err(
        &r.control,
        &["zone_set_state", "nsid=1", "zslba=1024", "state=read-only"],
    );
    assert!(e.contains("offline zone never changes"), "{e}");
    let e = ctl_err(
        &r.control,
        &["zone_set_state", "nsid=1", "zslba=100", "state=offline"],
    );
    assert!(e.contains("not a zone start"), "{e}");
    // Finished by the controller: only an open or closed zone.
    let e = ctl_err(
        &r.control,
        &["zone_set_state", "nsid=1", "zslba=768", "state=full"],
    );
    assert!(
        e.contains("full applies to open or closed zones; this one is empty"),
        "{e}"
    );
    assert_eq!(write(768)["status_name"], "success");
    ctl_ok(
        &r.control,
        &["zone_set_state", "nsid=1", "zslba=768", "state=full"],
    );
    assert_eq!(write(769)["status_name"], "zone-is-full");
    assert_eq!(changed_zones(&r.socket), vec![768]);
    let e = ctl_err(
        &r.control,
        &["zone_set_state", "nsid=1", "zslba=0", "state=broken"],
    );
    assert!(e.contains("unknown variant"), "{e}");
    let e = ctl_err(
        &r.control,
        &["zone_set_state", "nsid=2", "zslba=0", "state=offline"],
    );
    assert!(e.contains("namespace 2 does not exist"), "{e}");
}

#[test]
fn config_file_faults_are_armed_at_start() {
    let dir = common::temp_dir("cfgfault");
    let config = dir.join("vnvme.toml");
    std::fs::write(
        &config,
        "[[namespaces]]\nsize = \"16M\"\n\n[[fault]]\nkind = \"status\"\nopcodes = [\"read\"]\nstatus = \"internal-error\"\ndnr = true\n",
    )
    .unwrap();
    let r = rig("cfgfault2", &["--config", config.to_str().unwrap()]);
    assert_eq!(
        ctl_ok(&r.control, &["fault_list"])["faults"][0]["status"],
        "internal-error"
    );
    assert!(!read_block(&r.socket, 0).status.success());

    std::fs::write(&config, "[[fault]]\nkind = \"status\"\nstatus = \"nope\"\n").unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--config", config.to_str().unwrap(), "--socket"])
        .arg(dir.join("x.sock"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("fault[0]") && e.contains("unknown status"),
        "{e}"
    );
}

/// Sends raw bytes and reads one reply line (or None if the server closed).
fn raw(stream: &mut UnixStream, bytes: &[u8]) -> Option<serde_json::Value> {
    stream.write_all(bytes).unwrap();
    let mut line = String::new();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    match reader.read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(serde_json::from_str(&line).unwrap()),
    }
}

fn connect(control: &Path) -> UnixStream {
    let s = UnixStream::connect(control).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

#[test]
fn malformed_requests_get_json_rpc_errors_that_say_what_was_wrong() {
    let r = rig("abuse", &["--ns", "1M:null"]);
    let mut s = connect(&r.control);
    let cases: &[(&[u8], i64, &str)] = &[
        (b"{not json\n", -32700, "not JSON"),
        (b"[1,2]\n", -32600, "batch"),
        (b"42\n", -32600, "JSON object"),
        (br#"{"jsonrpc":"1.0","method":"stats","id":1}"#, -32600, "\"2.0\""),
        (br#"{"jsonrpc":"2.0","method":7,"id":1}"#, -32600, "method"),
        (br#"{"jsonrpc":"2.0","method":"stats","id":{"a":1}}"#, -32600, "id"),
        (br#"{"jsonrpc":"2.0","method":"launch","id":1}"#, -32601, "no method 'launch'"),
        (br#"{"jsonrpc":"2.0","method":"stats","params":[1],"id":1}"#, -32602, "named"),
        (br#"{"jsonrpc":"2.0","method":"namespace_remove","params":{"nsid":"x"},"id":1}"#, -32602, "invalid type"),
        (br#"{"jsonrpc":"2.0","method":"namespace_remove","params":{"nsid":-1},"id":1}"#, -32602, "expected u32"),
        (br#"{"jsonrpc":"2.0","method":"namespace_resize","params":{"nsid":1,"size":"1T","x":1},"id":1}"#, -32602, "unknown field"),
        (br#"{"jsonrpc":"2.0","method":"fault_add","params":{"kind":"latency","latency":"99h"},"id":1}"#, -32602, "3600"),
        (br#"{"jsonrpc":"2.0","method":"fault_add","params":{"kind":"power-loss"},"id":1}"#, -32000, ""),
    ];
    for (bytes, code, says) in cases {
        let mut line = bytes.to_vec();
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        let v = raw(&mut s, &line)
            .unwrap_or_else(|| panic!("no reply to {}", String::from_utf8_lossy(bytes)));
        assert_eq!(v["error"]["code"], *code, "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(says), "{msg} should say {says}");
    }
    // A notification gets no reply; the next request does.
    let v = raw(
        &mut s,
        b"{\"jsonrpc\":\"2.0\",\"method\":\"stats\"}\n{\"jsonrpc\":\"2.0\",\"method\":\"stats\",\"id\":\"x\"}\n",
    )
    .unwrap();
    assert_eq!(v["id"], "x");
    assert!(v["result"]["enables"].is_number());
    drop(s);
    assert!(r.server.terminate().success());
}

#[test]
fn hostile_control_clients_neither_crash_nor_wedge_the_server() {
    let r = rig("hostile", &["--ns", "1M:null"]);
    // A line over 64 KiB: an error, then the connection is closed.
    let mut big = connect(&r.control);
    let v = raw(&mut big, &vec![b'x'; 70 * 1024]).unwrap();
    assert_eq!(v["error"]["code"], -32600);
    let mut rest = Vec::new();
    assert_eq!(big.read_to_end(&mut rest).unwrap_or(0), 0, "closed");

    // Half a request, never finished: dropped after the request timeout,
    // while others are served meanwhile.
    let mut half = connect(&r.control);
    half.write_all(br#"{"jsonrpc":"2.0","me"#).unwrap();
    // As many connections as allowed: one more is told so.
    let idle: Vec<UnixStream> = (0..15).map(|_| connect(&r.control)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut extra = connect(&r.control);
    let mut line = String::new();
    BufReader::new(&mut extra).read_line(&mut line).unwrap();
    assert!(line.contains("too many control connections"), "{line}");
    // Closed: their threads see it in their own time (on a loaded machine,
    // later than any fixed sleep), and then their slots serve again.
    drop(idle);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = ctl(&r.control, &["stats"]);
        if out.status.success() {
            break;
        }
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.contains("too many control connections"), "{said}");
        assert!(
            Instant::now() < deadline,
            "the closed connections never freed a slot"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let start = Instant::now();
    let mut buf = [0u8; 1];
    half.set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    assert_eq!(
        half.read(&mut buf).unwrap_or(0),
        0,
        "the half request was dropped"
    );
    assert!(start.elapsed() < Duration::from_secs(15));

    // A client that sends requests and never reads its replies: the
    // server gives up on it, and answers others meanwhile.
    let mut deaf = connect(&r.control);
    deaf.set_write_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let req = b"{\"jsonrpc\":\"2.0\",\"method\":\"stats\",\"id\":1}\n".repeat(200);
    for _ in 0..100 {
        if deaf.write_all(&req).is_err() {
            break;
        }
        if start.elapsed() > Duration::from_secs(40) {
            break;
        }
    }
    assert!(ctl_ok(&r.control, &["stats"])["enables"].is_number());
    drop(deaf);
    assert!(r.server.terminate().success(), "SIGTERM still stops it");
}

/// The thread of process `pid` named `name`, once it sleeps in poll(2):
/// the server is ready when its socket is bound, which can be before the
/// thread has started or reached its wait (a loaded CI machine found it
/// not yet named).
fn polling_thread(pid: u32, name: &str) -> std::path::PathBuf {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
        let task = tasks
            .map(|t| t.unwrap().path())
            .find(|t| std::fs::read_to_string(t.join("comm")).is_ok_and(|c| c.trim() == name));
        let polling = |t: &std::path::Path| {
            std::fs::read_to_string(t.join("wchan")).is_ok_and(|w| w.contains("poll"))
        };
        match task {
            Some(t) if polling(&t) => return t,
            _ if std::time::Instant::now() > deadline => {
                panic!("no thread {name} waiting in poll in process {pid} after 20 s")
            }
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// A thread's voluntary context switches (each a wake-up after it slept).
fn thread_wakeups(task: &std::path::Path) -> u64 {
    let status = std::fs::read_to_string(task.join("status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// The accepting thread sleeps until a connection comes (it used to look
/// at its stop flag every 100 ms): no wake-up over a second of an idle
/// control socket, one per connection, and the server still stops.
#[test]
fn an_idle_control_socket_never_wakes_its_thread() {
    let r = rig("control-idle", &[]);
    let task = polling_thread(r.server.pid(), "vnvme-control");
    let before = thread_wakeups(&task);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(thread_wakeups(&task), before, "idle for 1 s");
    ctl_ok(&r.control, &["stats"]);
    let after = thread_wakeups(&task);
    assert!(after > before, "a connection wakes it");
    ctl_ok(&r.control, &["shutdown"]);
    let (status, _) = r.server.exit_with_stderr(Duration::from_secs(5));
    assert!(status.success(), "{status}");
}
