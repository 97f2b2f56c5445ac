//! `vnvme serve --supervise` (issue 35 item 3, crash recovery, stages 1
//! to 3) as real processes, driven by our driver: the supervisor holds
//! the client's fds as the server forwards them, sees the server's death
//! (SIGKILL, SIGABRT) and logs it with what it held, and starts a new
//! server that restores the client from the crash area and serves it on
//! the same connection, in every doorbell mode, completing the commands in
//! flight at the kill with Command Interrupted; a crash area whose slots
//! are corrupt makes it close the connection instead and serve the next
//! client, saying why. SIGTERM stops
//! both; a server that cannot start ends the supervisor after a bounded
//! number of tries.

mod common;
#[path = "supervise/fdmsg.rs"]
mod fdmsg;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::rounds::{self, block, BLOCK};
use common::supervised::{alive, controlled_file_rig, file_rig, kill, rig, Rig};
use common::{ctl_ok, temp_dir, BIN};
use vnvme_driver::{admin, Controller, DeviceAccess, IoQueue, VfioUserAccess};
use vnvme_spec::feature::FeatureId;
use vnvme_spec::NvmOpcode;

const BLOCKS: u64 = 16;

/// What the supervisor must say it held for our driver's client in
/// `mode`: its connection, the one memfd the driver maps all its memory
/// from, an eventfd per vector it set (admin + one I/O queue), and the
/// doorbell memfd where the mode offers the page.
fn held(mode: &str) -> String {
    let page = matches!(mode, "adaptive" | "mmap-poll");
    format!(
        "holding a client: its connection, 1 DMA files, 2 interrupt eventfds{}",
        if page { ", the doorbell memfd" } else { "" }
    )
}

/// The I/O commands the server behind `control` has fetched (its stats),
/// for a test to know a command a fault holds has reached it.
fn fetched(control: &std::path::Path) -> u64 {
    let stats = ctl_ok(control, &["stats"]);
    stats["io_commands"]
        .as_object()
        .map_or(0, |m| m.values().filter_map(|v| v.as_u64()).sum())
}

/// The client at the kill keeps its disk (stage 2): the same connection,
/// with the same queues, reads back what it wrote before each kill and
/// writes the next round, with no reset and no reconnection; a client
/// connecting after it left reads the last round back.
fn the_client_keeps_its_disk(mode: &str) {
    the_client_keeps_its_disk_on(file_rig(&format!("kill-{mode}"), mode), mode);
}

/// [`the_client_keeps_its_disk`] on the server `r` runs in `mode`.
fn the_client_keeps_its_disk_on(r: Rig, mode: &str) {
    let (access, ctrl, mut q) = r.client();
    round(&r, &access, &mut q, 1, true);
    for kill_n in 1..=3u64 {
        let pid = r.server_pid();
        kill(pid, rustix::process::Signal::KILL);
        let log = r.wait_log("died (signal: 9 (SIGKILL))", kill_n as usize);
        let line = log
            .lines()
            .rfind(|l| l.contains(&format!("the server (pid {pid}) died")))
            .unwrap_or_else(|| panic!("no death line for {pid}:\n{log}"));
        assert!(line.contains(&held(mode)), "{line}");
        assert!(
            line.contains("starting a new server that serves the client on its connection"),
            "{line}"
        );
        r.wait_log("supervising the server, pid", kill_n as usize + 1);
        // Reaped by the supervisor before it logged the death.
        assert!(!alive(pid), "server {pid} still runs");
        // The controller is still enabled and ready (CSTS.RDY): no reset.
        assert_eq!(access.read32(0x1c).unwrap() & 1, 1);
        round(&r, &access, &mut q, kill_n, false);
        round(&r, &access, &mut q, kill_n + 1, true);
    }
    let log = r.log();
    assert_eq!(
        log.matches("restoring the client from the crash area's slot")
            .count(),
        3,
        "{log}"
    );
    drop((q, ctrl, access));
    let (access, _ctrl, mut q) = r.client();
    round(&r, &access, &mut q, 4, false);
}

/// One round over every block (`write` false: a check only); a timeout
/// prints the server's log.
fn round(rig: &Rig, access: &VfioUserAccess, q: &mut IoQueue, r: u64, write: bool) {
    rounds::round_or(access, q, BLOCKS, r, write, &|| rig.log());
}

#[test]
fn the_client_keeps_its_disk_across_kills_trap() {
    the_client_keeps_its_disk("trap");
}

#[test]
fn the_client_keeps_its_disk_across_kills_shadow() {
    the_client_keeps_its_disk("shadow");
}

#[test]
fn the_client_keeps_its_disk_across_kills_adaptive() {
    the_client_keeps_its_disk("adaptive");
}

#[test]
fn the_client_keeps_its_disk_across_kills_mmap_poll() {
    the_client_keeps_its_disk("mmap-poll");
}

/// A `ram` namespace's data is in a memfd the supervisor holds: what was
/// written before each of 3 kills reads back after it, on the same
/// connection, and a client connecting after reads the last round.
#[test]
fn a_ram_namespace_keeps_its_data_across_kills() {
    let r = rig("kill-ram", &["--ns", "16M:ram", "--doorbells", "shadow"]);
    the_client_keeps_its_disk_on(r, "shadow");
}

/// The data of a `ram` namespace outlives a child that died holding no
/// client (its connection closed, the next client served by a new child).
#[test]
fn a_ram_namespace_keeps_its_data_when_the_client_cannot_be_restored() {
    let r = rig(
        "kill-ram-noclient",
        &["--ns", "16M:ram", "--doorbells", "shadow"],
    );
    {
        let (access, _ctrl, mut q) = r.client();
        round(&r, &access, &mut q, 7, true);
    }
    r.wait_log("vfio-user client disconnected", 1);
    kill(r.server_pid(), rustix::process::Signal::KILL);
    r.wait_log("supervising the server, pid", 2);
    let (access, _ctrl, mut q) = r.client();
    round(&r, &access, &mut q, 7, false);
}

#[test]
fn sigterm_stops_the_supervisor_and_its_server_within_2_s() {
    let mut r = file_rig("sigterm", "adaptive");
    let (_access, _ctrl, _q) = r.client();
    let server = r.server_pid();
    let started = Instant::now();
    kill(r.supervisor.id() as i32, rustix::process::Signal::TERM);
    let status = loop {
        if let Some(s) = r.supervisor.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the supervisor still runs 2 s after SIGTERM:\n{}",
            r.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "{status}\n{}", r.log());
    assert!(!alive(server), "the server outlived its supervisor");
    assert!(!r.socket.exists(), "the socket file was left behind");
}

#[test]
fn a_server_that_cannot_start_ends_the_supervisor_after_3_tries() {
    let dir = temp_dir("cannot-start");
    let socket = dir.join("vnvme.sock");
    let out = Command::new(BIN)
        .args(["serve", "--supervise", "--socket"])
        .arg(&socket)
        .args(["--ns", "16M:file=/nonexistent/folder/ns.img"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(
        err.matches("the server failed to start (").count(),
        2,
        "{err}"
    );
    assert!(
        err.contains("the server failed to start 3 times in a row; the last: it refused:"),
        "{err}"
    );
    assert!(!socket.exists());
}

#[test]
fn an_abort_is_a_death_too() {
    let r = file_rig("abort", "shadow");
    let (access, _ctrl, mut q) = r.client();
    round(&r, &access, &mut q, 1, true);
    let pid = r.server_pid();
    kill(pid, rustix::process::Signal::ABORT);
    let log = r.wait_log("died (signal: 6 (SIGABRT)", 1);
    assert!(log.contains(&held("shadow")), "{log}");
    r.wait_log("supervising the server, pid", 2);
    round(&r, &access, &mut q, 1, false);
}

/// The crash area's offsets (docs/state-format.md, "Crash area").
const SLOTS_AT: u64 = 4096 + 65536 * 32;
const SLOT_LEN: u64 = 16 << 20;

/// The supervisor's crash area, opened for writing through /proc.
fn crash_area(supervisor: u32) -> std::fs::File {
    for e in std::fs::read_dir(format!("/proc/{supervisor}/fd")).unwrap() {
        let path = e.unwrap().path();
        let link = std::fs::read_link(&path).unwrap_or_default();
        if link
            .to_string_lossy()
            .starts_with("/memfd:vnvme-crash-area")
        {
            return std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        }
    }
    panic!("the supervisor holds no crash area");
}

/// Hostile: a crash area whose two slots fail their checksum is refused by
/// name; the supervisor falls back to closing the client's connection and
/// serving the next client.
#[test]
fn a_corrupt_crash_area_is_refused_and_the_next_client_is_served() {
    use std::os::unix::fs::FileExt;
    let r = file_rig("corrupt-area", "shadow");
    let (access, _ctrl, mut q) = r.client();
    round(&r, &access, &mut q, 1, true);
    let area = crash_area(r.supervisor.id());
    // One payload byte of each slot (the client is idle: no checkpoint
    // rewrites them meanwhile).
    for slot in 0..2 {
        area.write_all_at(&[0xa5, 0x5a], SLOTS_AT + slot * SLOT_LEN + 64 + 8)
            .unwrap();
    }
    let pid = r.server_pid();
    kill(pid, rustix::process::Signal::KILL);
    let log = r.wait_log("died (signal: 9 (SIGKILL))", 1);
    assert!(
        log.contains(
            "the client cannot be restored (the crash state is refused: no whole saved state in \
             the crash area: slot 0: its checksum does not hold; slot 1: its checksum does not \
             hold): its connection is closed; starting a new server for the next client"
        ),
        "{log}"
    );
    r.wait_log("supervising the server, pid", 2);
    assert!(
        access.read32(0x1c).is_err(),
        "the old connection still answers"
    );
    drop((q, access));
    let (access, _ctrl, mut q) = r.client();
    round(&r, &access, &mut q, 1, false);
}

/// Commands in flight at the kill (stage 3): three writes a fault holds
/// (never completing) when the server is SIGKILLed come back on the same
/// connection with Command Interrupted (generic 21h, DNR clear), each once;
/// retried, they complete; what completed before the kill (a round of
/// writes and a Flush) reads back, through the server and in the file.
fn commands_in_flight_complete_as_interrupted(mode: &str) {
    let (r, _control_dir, control) = controlled_file_rig(&format!("inflight-{mode}"), mode);
    let (access, _ctrl, mut q) = r.client();
    round(&r, &access, &mut q, 1, true);
    assert!(q.flush(1).unwrap().status().is_success());
    let before = fetched(&control);
    ctl_ok(
        &control,
        &[
            "fault_add",
            "kind=never-complete",
            "opcodes=write",
            "count=3",
        ],
    );
    let bufs: Vec<_> = (5..8u64)
        .map(|lba| {
            let b = access.dma_alloc(BLOCK).unwrap();
            b.write_bytes(0, &block(lba, 2)).unwrap();
            b
        })
        .collect();
    let mut cids: Vec<u16> = (5..8u64)
        .zip(&bufs)
        .map(|(lba, b)| q.enqueue_rw(NvmOpcode::WRITE, 1, lba, 1, b).unwrap())
        .collect();
    q.ring().unwrap();
    // The writes are held: the server counted them.
    let deadline = Instant::now() + Duration::from_secs(30);
    while fetched(&control) != before + 3 {
        assert!(Instant::now() < deadline, "the writes were not fetched");
        std::thread::sleep(Duration::from_millis(20));
    }
    kill(r.server_pid(), rustix::process::Signal::KILL);
    r.wait_log("died (signal: 9 (SIGKILL))", 1);
    r.wait_log("supervising the server, pid", 2);
    let mut done = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while done.len() < 3 {
        if Instant::now() >= deadline {
            panic!(
                "{} of 3 completed; the server said:\n{}",
                done.len(),
                r.log()
            );
        }
        let want = 3 - done.len();
        let _ = q.wait(&mut done, want, Duration::from_secs(1));
    }
    let _ = q.wait(&mut done, 1, Duration::from_millis(200));
    assert_eq!(done.len(), 3, "{done:?}");
    let mut got: Vec<u16> = done.iter().map(|c| c.cid()).collect();
    got.sort_unstable();
    cids.sort_unstable();
    assert_eq!(got, cids);
    for c in &done {
        let st = c.status();
        assert_eq!((st.sct(), st.sc(), st.dnr()), (0, 0x21, false), "{c:?}");
    }
    let log = r.log();
    assert!(
        log.contains("3 commands in flight at the crash completed with Command Interrupted"),
        "{log}"
    );
    // No reset: the controller is still ready on the same connection.
    assert_eq!(access.read32(0x1c).unwrap() & 1, 1);
    // The host retries them: they complete now (the fault died with the
    // server that had it).
    for (lba, b) in (5..8u64).zip(&bufs) {
        q.enqueue_rw(NvmOpcode::WRITE, 1, lba, 1, b).unwrap();
    }
    q.ring().unwrap();
    rounds::reap_or(&mut q, 3, &|| r.log());
    let reads: Vec<_> = (0..BLOCKS)
        .map(|_| access.dma_alloc(BLOCK).unwrap())
        .collect();
    for (lba, b) in reads.iter().enumerate() {
        q.enqueue_rw(NvmOpcode::READ, 1, lba as u64, 1, b).unwrap();
    }
    q.ring().unwrap();
    rounds::reap_or(&mut q, BLOCKS as usize, &|| r.log());
    let want = |lba: u64| block(lba, if (5..8).contains(&lba) { 2 } else { 1 });
    for (lba, b) in reads.iter().enumerate() {
        assert!(b.to_vec() == want(lba as u64), "LBA {lba}");
    }
    // What completed before the kill is in the file.
    let img = std::fs::read(r.ns_dir.as_ref().unwrap().join("ns1.img")).unwrap();
    for lba in 0..BLOCKS as usize {
        let at = lba * BLOCK;
        assert!(
            img[at..at + BLOCK] == want(lba as u64)[..],
            "LBA {lba} in the file"
        );
    }
}

/// A checkpoint refused by a command in flight (a write a latency fault
/// holds past the drain bound) is tried again without a message: the
/// client rings through the doorbell page (`mmap-poll`), so none comes.
/// Before, the try waited for the next message, and a kill restored the
/// state from before a Set Features the client saw complete (the clean-
/// clone check of 381286c lost a Create I/O SQ so, under load).
#[test]
fn a_checkpoint_refused_by_a_command_in_flight_is_tried_again_without_a_message() {
    let (r, _control_dir, control) = controlled_file_rig("retry", "mmap-poll");
    let (access, ctrl, mut q) = r.client();
    ctl_ok(
        &control,
        &["fault_add", "kind=latency", "latency=2s", "opcodes=write"],
    );
    let buf = access.dma_alloc(BLOCK).unwrap();
    buf.write_bytes(0, &block(3, 1)).unwrap();
    let cid = q.enqueue_rw(NvmOpcode::WRITE, 1, 3, 1, &buf).unwrap();
    q.ring().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while fetched(&control) != 1 {
        assert!(Instant::now() < deadline, "the write was not fetched");
        std::thread::sleep(Duration::from_millis(20));
    }
    let threshold = FeatureId::TEMPERATURE_THRESHOLD;
    let set = ctrl.admin_passthru(admin::set_features(threshold, 0x150), None);
    assert!(set.unwrap().status.is_success());
    r.wait_log("keeping the crash state: ", 1);
    assert!(q.wait_cid(cid).unwrap().status().is_success());
    // No message from here on: the write's completion was reaped from
    // memory and its CQ head written to the mapped page.
    r.wait_log("the crash state is kept again", 1);
    kill(r.server_pid(), rustix::process::Signal::KILL);
    r.wait_log("restoring the client from the crash area's slot", 1);
    r.wait_log("supervising the server, pid", 2);
    let got = ctrl.admin_passthru(admin::get_features(threshold, 0), None);
    assert_eq!(got.unwrap().result & 0xffff, 0x150, "{}", r.log());
    round(&r, &access, &mut q, 1, true);
}

#[test]
fn commands_in_flight_at_the_kill_complete_as_interrupted_adaptive() {
    commands_in_flight_complete_as_interrupted("adaptive");
}

#[test]
fn commands_in_flight_at_the_kill_complete_as_interrupted_trap() {
    commands_in_flight_complete_as_interrupted("trap");
}

/// SIGTERM as soon as the socket appears: the server is starting, or just
/// started (a race: either way one SIGTERM reaches it, not two, which
/// would make it exit at once with status 1).
#[test]
fn sigterm_right_after_start_stops_both_cleanly() {
    let dir = temp_dir("sigterm-start");
    let socket = dir.join("vnvme.sock");
    let sup = Command::new(BIN)
        .args(["serve", "--supervise", "--socket"])
        .arg(&socket)
        .args(["--ns", "16M:null"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The supervisor binds the socket before it starts the server.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "no socket");
        std::thread::sleep(Duration::from_millis(1));
    }
    kill(sup.id() as i32, rustix::process::Signal::TERM);
    let out = sup.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{err}", out.status);
    assert!(!err.contains("failed to start"), "{err}");
    assert!(!socket.exists(), "the socket file was left behind");
}

#[test]
fn several_sockets_are_refused_under_supervise() {
    let dir = temp_dir("two-sockets");
    let out = Command::new(BIN)
        .args(["serve", "--supervise", "--socket"])
        .arg(dir.join("a.sock"))
        .arg("--socket")
        .arg(dir.join("b.sock"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--supervise serves one controller: give --socket once"),
        "{err}"
    );
    assert!(!dir.join("a.sock").exists() && !dir.join("b.sock").exists());
}

#[test]
fn room_for_created_namespaces_is_refused_under_supervise() {
    let dir = temp_dir("nvm-capacity");
    let out = Command::new(BIN)
        .args(["serve", "--supervise", "--socket"])
        .arg(dir.join("vnvme.sock"))
        .args([
            "--ns",
            "16M:ram",
            "--nvm-capacity",
            "64M",
            "--max-namespaces",
            "4",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--nvm-capacity leaves room for Namespace Management"),
        "{err}"
    );
}

#[test]
fn namespaces_added_or_resized_at_run_time_are_refused_under_supervise() {
    let control_dir = temp_dir("ns-change-refused-control");
    let control = control_dir.join("control.sock");
    let control_arg = control.display().to_string();
    let r = rig(
        "ns-change-refused",
        &[
            "--ns",
            "16M:ram",
            "--max-namespaces",
            "4",
            "--control",
            &control_arg,
        ],
    );
    for args in [
        &["namespace_add", "ns=16M:ram"][..],
        &["namespace_resize", "nsid=1", "size=32M"][..],
    ] {
        let err = common::ctl_err(&control, args);
        assert!(
            err.contains("is refused under --supervise"),
            "{args:?}: {err}"
        );
    }
    // Nothing changed: the server serves namespace 1 as it was.
    let (access, _ctrl, mut q) = r.client();
    round(&r, &access, &mut q, 1, true);
    round(&r, &access, &mut q, 1, false);
}

/// Replies the client has not read at the kill reach it whole after the
/// restore, each once and in order: the server waits for room in the
/// socket to send one (the client reads none of its 256 config-space
/// reads), is killed there, and the next server sends the rest of that
/// reply from the reply pipe before it serves the requests the dead one
/// never read (conn/staged.rs). The reply used to be sent straight while
/// its message was still marked as handled, so the supervisor closed the
/// connection.
#[test]
fn replies_owed_at_the_kill_reach_the_client_once_and_whole() {
    use std::io::{Read, Write};
    use vnvme_vfio_user::wire::{cmd, flags, Header, RegionAccess, HEADER_SIZE};
    use zerocopy::{FromBytes, IntoBytes};

    const READS: u16 = 256;
    const FIRST_ID: u16 = 0x8000;
    let r = file_rig("kill-owed", "trap");
    let stream = std::os::unix::net::UnixStream::connect(&r.socket).unwrap();
    let mut raw = stream.try_clone().unwrap();
    let client = vnvme_vfio_user::Client::from_stream(stream).unwrap();
    let mut config = vec![0u8; 4096];
    client
        .region_read(vnvme_vfio_user::region::CONFIG, 0, &mut config)
        .unwrap();
    let access = RegionAccess {
        offset: 0,
        region: vnvme_vfio_user::region::CONFIG,
        count: 4096,
    };
    let mut requests = Vec::new();
    for i in 0..READS {
        let header = Header {
            msg_id: FIRST_ID + i,
            command: cmd::REGION_READ,
            msg_size: (HEADER_SIZE + access.as_bytes().len()) as u32,
            flags: flags::TYPE_COMMAND,
            error: 0,
        };
        requests.extend_from_slice(header.as_bytes());
        requests.extend_from_slice(access.as_bytes());
    }
    raw.write_all(&requests).unwrap();
    // The server blocks moving a staged reply to the full socket.
    let pid = r.server_pid();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !in_splice(pid) {
        assert!(
            Instant::now() < deadline,
            "no thread of server {pid} waits in splice(2) with 1 MiB of replies unread:\n{}",
            r.log()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    kill(pid, rustix::process::Signal::KILL);
    let log = r.wait_log("died (signal: 9 (SIGKILL))", 1);
    assert!(
        log.contains("starting a new server that serves the client on its connection"),
        "{log}"
    );
    raw.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let reply_len = HEADER_SIZE + access.as_bytes().len() + 4096;
    let mut reply = vec![0u8; reply_len];
    for i in 0..READS {
        raw.read_exact(&mut reply)
            .unwrap_or_else(|e| panic!("reply {i} of {READS}: {e}\n{}", r.log()));
        let header = Header::read_from_prefix(&reply).unwrap().0;
        assert_eq!(header.msg_id, FIRST_ID + i, "reply {i}");
        assert_eq!(header.flags, flags::TYPE_REPLY, "reply {i}");
        assert_eq!(header.msg_size as usize, reply_len, "reply {i}");
        assert!(
            reply[reply_len - 4096..] == config[..],
            "reply {i}: not the config space"
        );
    }
    // Nothing more came, and the connection serves on.
    assert_eq!(rustix::io::ioctl_fionread(&raw).unwrap(), 0);
    let mut again = vec![0u8; 4096];
    client
        .region_read(vnvme_vfio_user::region::CONFIG, 0, &mut again)
        .unwrap();
    assert_eq!(again, config);
}

/// Whether a thread of `pid` waits in splice(2) (the first field of
/// /proc/PID/task/TID/syscall is the number of the call it is blocked in).
fn in_splice(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|t| {
        std::fs::read_to_string(t.path().join("syscall"))
            .is_ok_and(|s| s.split_whitespace().next() == Some(&libc::SYS_splice.to_string()))
    })
}

/// Arbitration (Set Features 01h) as the server has it now.
fn arbitration(ctrl: &Controller) -> u32 {
    let get = vnvme_driver::admin::get_features(FeatureId::ARBITRATION, 0);
    let c = ctrl.admin(get, None).unwrap();
    assert!(c.status().is_success(), "{c:?}");
    c.dw0.get()
}

/// An admin command's completion waits for the slot holding its effect
/// (issue 35 item 3): a Set Features the client saw complete is what the
/// server restored after a kill says. A checkpoint that fails (a write a
/// fault holds keeps the state from being saved) does not hold the next
/// Set Features' completion: it completes, the log says it was not kept,
/// and the kill that follows restores the value before it (the loss the
/// docs name) and completes the held write with Command Interrupted.
#[test]
fn admin_completions_wait_for_their_slot_and_a_failed_checkpoint_does_not_hold_them() {
    let (r, _control_dir, control) = controlled_file_rig("owed", "trap");
    let (access, ctrl, mut q) = r.client();
    let set = |v: u32| {
        let cmd = vnvme_driver::admin::set_features(FeatureId::ARBITRATION, v);
        let c = ctrl.admin(cmd, None).unwrap();
        assert!(c.status().is_success(), "{c:?}");
    };
    set(3);
    kill(r.server_pid(), rustix::process::Signal::KILL);
    r.wait_log("died (signal: 9 (SIGKILL))", 1);
    r.wait_log("supervising the server, pid", 2);
    assert_eq!(arbitration(&ctrl) & 7, 3);
    let before = fetched(&control);
    ctl_ok(
        &control,
        &[
            "fault_add",
            "kind=never-complete",
            "opcodes=write",
            "count=1",
        ],
    );
    let buf = access.dma_alloc(BLOCK).unwrap();
    buf.write_bytes(0, &block(1, 1)).unwrap();
    let cid = q.enqueue_rw(NvmOpcode::WRITE, 1, 1, 1, &buf).unwrap();
    q.ring().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while fetched(&control) != before + 1 {
        assert!(Instant::now() < deadline, "the write was not held");
        std::thread::sleep(Duration::from_millis(20));
    }
    set(5);
    r.wait_log("commands completed without a slot holding their effect", 1);
    kill(r.server_pid(), rustix::process::Signal::KILL);
    r.wait_log("died (signal: 9 (SIGKILL))", 2);
    r.wait_log("supervising the server, pid", 3);
    let mut done = Vec::new();
    let _ = q.wait(&mut done, 1, Duration::from_secs(30));
    assert_eq!(done.len(), 1, "{}", r.log());
    let st = done[0].status();
    assert_eq!((done[0].cid(), st.sct(), st.sc()), (cid, 0, 0x21));
    assert_eq!(arbitration(&ctrl) & 7, 3);
}
