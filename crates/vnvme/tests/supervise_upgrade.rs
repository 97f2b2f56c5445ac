//! Live upgrade of a server running under `vnvme serve --supervise`
//! (issue 35), as real processes driven by our driver: the supervised
//! server hands its client to a new process (`vnvme ctl upgrade`, or
//! SIGUSR2 to the supervisor, what `systemctl reload` sends), the
//! supervisor adopts the new process and recovers a SIGKILL of it as any
//! other, starting the new binary. The client keeps one connection
//! throughout; the I/O thread asserts every command completed once and
//! successfully, so none of the upgrades completed one with Command
//! Interrupted (nor any other error). A bad new binary is refused with
//! the server serving on and still supervised, and a server killed while
//! its new process starts takes the new process with it.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::io_thread::IoThread;
use common::rounds;
use common::supervised::{alive, controlled_file_rig, kill, Rig};
use common::{ctl, ctl_err, ctl_ok, BIN};
use rustix::process::Signal;
use vnvme_driver::{Controller, DeviceAccess, IoQueue, VfioUserAccess};

const BLOCKS: u64 = 16;

/// The log line of the supervisor that names the server it watches.
const SUPERVISING: &str = "supervising the server, pid";
/// The log line of an upgrade the supervisor followed.
const HANDED_OVER: &str = "handed over to a new process running";

/// A copy of the binary, as an operator installs a new one beside the
/// running one.
fn new_binary(r: &Rig) -> PathBuf {
    let new = r.dir.join("vnvme-new");
    std::fs::copy(BIN, &new).unwrap();
    new
}

/// The binary process `pid` runs.
fn exe(pid: i32) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/exe")).unwrap()
}

/// Verified I/O runs while `act` upgrades the server; returns the queue
/// and the round written last.
fn io_across(
    r: &Rig,
    access: &Arc<VfioUserAccess>,
    q: IoQueue,
    first: u64,
    act: impl FnOnce(),
) -> (IoQueue, u64) {
    let io = IoThread::start(Arc::clone(access), q, BLOCKS, first);
    io.wait_more(2, &|| r.log());
    act();
    io.wait_more(2, &|| r.log());
    let (q, rounds) = io.finish(&|| r.log());
    (q, first + rounds - 1)
}

/// SIGKILLs the server, waits until the supervisor serves the client
/// again (`supervising` lines in all then), and checks the round
/// written last reads back: the new server's pid.
fn kill_and_check(
    r: &Rig,
    access: &VfioUserAccess,
    q: &mut IoQueue,
    last: u64,
    supervising: usize,
) -> i32 {
    let pid = r.server_pid();
    let kills = r.log().matches("died (signal: 9 (SIGKILL))").count();
    kill(pid, Signal::KILL);
    r.wait_log("died (signal: 9 (SIGKILL))", kills + 1);
    r.wait_log(SUPERVISING, supervising);
    assert!(!alive(pid), "server {pid} still runs");
    rounds::round_or(access, q, BLOCKS, last, false, &|| r.log());
    r.server_pid()
}

/// The pids the supervisor's `log` says it supervised, in order.
fn supervised_pids(log: &str) -> Vec<i32> {
    log.match_indices(SUPERVISING)
        .map(|(at, _)| {
            let rest = log[at + SUPERVISING.len()..].trim_start();
            let end = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            rest[..end].parse().unwrap()
        })
        .collect()
}

/// Upgrades through the control socket: the new server's pid, checked
/// against the supervisor's log.
fn upgrade(r: &Rig, control: &Path, extra: &[&str], supervising: usize) -> i32 {
    let old = r.server_pid();
    let mut args = vec!["upgrade"];
    args.extend_from_slice(extra);
    let report = ctl_ok(control, &args);
    let pid = report["pid"].as_u64().unwrap() as i32;
    r.wait_log(SUPERVISING, supervising);
    assert_eq!(r.server_pid(), pid, "{report}\n{}", r.log());
    assert_ne!(pid, old);
    pid
}

/// The controller was never reset (CSTS.RDY set, CFS clear) and the
/// admin queue answers.
fn never_reset(access: &VfioUserAccess, ctrl: &Controller) {
    let csts = access.read32(0x1c).unwrap();
    assert_eq!(csts & 3, 1, "CSTS {csts:#x}");
    assert_eq!(ctrl.rescan().unwrap().len(), 1);
}

#[test]
fn a_supervised_server_is_upgraded_three_times_and_killed_between_on_one_connection() {
    let (r, _control_dir, control) = controlled_file_rig("sup-upgrade", "shadow");
    let new = new_binary(&r);
    let new_s = new.to_str().unwrap();
    let (access, ctrl, q) = r.client();
    let first = r.server_pid();
    // 1: to the new binary, through the control socket.
    let mut pids = Vec::new();
    let (mut q, last) = io_across(&r, &access, q, 0, || {
        pids.push(upgrade(&r, &control, &["--exe", new_s], 2));
    });
    assert_eq!(exe(pids[0]), new);
    // A SIGKILL of the new process is recovered on the same connection,
    // by a server running the new binary.
    let restored = kill_and_check(&r, &access, &mut q, last, 3);
    assert_eq!(exe(restored), new);
    // 2: through the control socket, to the binary it runs (the new one).
    let (q, last) = io_across(&r, &access, q, last + 1, || {
        pids.push(upgrade(&r, &control, &[], 4));
    });
    // 3: SIGUSR2 to the supervisor.
    let (mut q, last) = io_across(&r, &access, q, last + 1, || {
        kill(r.supervisor.id() as i32, Signal::USR2);
        r.wait_log(SUPERVISING, 5);
        pids.push(r.server_pid());
    });
    assert_eq!(exe(pids[2]), new);
    // The supervisor follows the last upgrade too.
    let restored = kill_and_check(&r, &access, &mut q, last, 6);
    assert_eq!(exe(restored), new);
    never_reset(&access, &ctrl);
    let log = r.log();
    assert_eq!(log.matches(HANDED_OVER).count(), 3, "{log}");
    let named = supervised_pids(&log);
    for pid in &pids {
        assert!(named.contains(pid), "{pid} not named:\n{log}");
        assert!(!alive(*pid), "{pid} outlived its upgrade or kill");
    }
    assert!(!alive(first));
    // Two kills, nothing else restored.
    assert_eq!(
        log.matches("restoring the client from the crash area")
            .count(),
        2,
        "{log}"
    );
    // Every server ran to its end: one stop, and nothing else died.
    drop((q, ctrl, access));
    assert_eq!(log.matches(" died (").count(), 2, "{log}");
}

#[test]
fn a_bad_new_binary_is_refused_and_the_old_server_serves_on_supervised() {
    let (r, _control_dir, control) = controlled_file_rig("sup-upgrade-bad", "adaptive");
    let (access, _ctrl, mut q) = r.client();
    let pid = r.server_pid();
    rounds::round_or(&access, &mut q, BLOCKS, 1, true, &|| r.log());
    // One that exits before it is ready, one that does not exist.
    let why = ctl_err(&control, &["upgrade", "--exe", "/bin/false"]);
    assert!(why.contains("this one serves on"), "{why}");
    let why = ctl_err(&control, &["upgrade", "--exe", "/nonexistent/vnvme"]);
    assert!(why.contains("starting /nonexistent/vnvme"), "{why}");
    // The supervisor heard of the first (it started), not of the second.
    let log = r.wait_log("the server's upgrade failed: it serves on", 1);
    assert_eq!(
        log.matches("the server's upgrade failed").count(),
        1,
        "{log}"
    );
    assert_eq!(log.matches(HANDED_OVER).count(), 0, "{log}");
    assert_eq!(r.server_pid(), pid);
    rounds::round_or(&access, &mut q, BLOCKS, 1, false, &|| r.log());
    rounds::round_or(&access, &mut q, BLOCKS, 2, true, &|| r.log());
    // Still supervised: a kill is recovered, by the binary it ran.
    let restored = kill_and_check(&r, &access, &mut q, 2, 2);
    assert_eq!(exe(restored), std::fs::canonicalize(BIN).unwrap());
}

#[test]
fn a_server_killed_while_its_new_process_starts_takes_it_along() {
    let (r, _control_dir, control) = controlled_file_rig("sup-upgrade-killed", "trap");
    // A new binary that takes 2 s to start.
    let slow = r.dir.join("slow-vnvme");
    std::fs::write(&slow, format!("#!/bin/sh\nsleep 2\nexec {BIN} \"$@\"\n")).unwrap();
    let mut perms = std::fs::metadata(&slow).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&slow, perms).unwrap();
    let (access, _ctrl, mut q) = r.client();
    rounds::round_or(&access, &mut q, BLOCKS, 1, true, &|| r.log());
    let old = r.server_pid();
    let asked = {
        let (control, slow) = (control.clone(), slow.clone());
        std::thread::spawn(move || ctl(&control, &["upgrade", "--exe", slow.to_str().unwrap()]))
    };
    let log = r.wait_log("its new process, pid ", 1);
    let at = log.find("its new process, pid ").unwrap() + "its new process, pid ".len();
    let rest = &log[at..];
    let successor: i32 = rest[..rest.find(',').unwrap()].parse().unwrap();
    kill(old, Signal::KILL);
    r.wait_log(
        &format!(
            "while its upgrade's new process (pid {successor}) started: the new process is killed"
        ),
        1,
    );
    r.wait_log(SUPERVISING, 2);
    assert!(
        !alive(successor),
        "the new process outlived the old one's death"
    );
    assert!(!alive(old));
    // The client is served again from the crash area, on its connection.
    rounds::round_or(&access, &mut q, BLOCKS, 1, false, &|| r.log());
    rounds::round_or(&access, &mut q, BLOCKS, 2, true, &|| r.log());
    let out = asked.join().unwrap();
    assert!(!out.status.success(), "the upgrade said it succeeded");
    // The new binary's own child (its `sleep`), orphaned by the kill, was
    // adopted by the supervisor and is reaped once it exits: in the end
    // the supervisor's only child is the server.
    let sup = r.supervisor.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let children =
            std::fs::read_to_string(format!("/proc/{sup}/task/{sup}/children")).unwrap_or_default();
        if children.split_whitespace().collect::<Vec<_>>() == [r.server_pid().to_string()] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the supervisor's children: {children}\n{}",
            r.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigusr2_twice_at_once_upgrades_and_nothing_breaks() {
    let (r, _control_dir, _control) = controlled_file_rig("sup-upgrade-twice", "mmap-poll");
    let (access, ctrl, mut q) = r.client();
    rounds::round_or(&access, &mut q, BLOCKS, 1, true, &|| r.log());
    let sup = r.supervisor.id() as i32;
    kill(sup, Signal::USR2);
    kill(sup, Signal::USR2);
    r.wait_log(HANDED_OVER, 1);
    rounds::round_or(&access, &mut q, BLOCKS, 1, false, &|| r.log());
    // The second signal was folded into the first, dropped while it ran,
    // or made a second upgrade after it: the server serves either way,
    // and none died. (The wait only gives a second upgrade time to show:
    // the checks hold whether it came or not.)
    let deadline = Instant::now() + Duration::from_secs(5);
    while r.log().matches(HANDED_OVER).count() < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = r.log();
    assert!(matches!(log.matches(HANDED_OVER).count(), 1 | 2), "{log}");
    rounds::round_or(&access, &mut q, BLOCKS, 2, true, &|| r.log());
    never_reset(&access, &ctrl);
    let log = r.log();
    assert_eq!(log.matches(" died (").count(), 0, "{log}");
    // The adopted server stops when its supervisor is killed outright
    // (its parent-death signal, asked for once adopted).
    let server = r.server_pid();
    kill(sup, Signal::KILL);
    let deadline = Instant::now() + Duration::from_secs(30);
    while alive(server) {
        assert!(
            Instant::now() < deadline,
            "the server outlived its supervisor\n{}",
            r.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
