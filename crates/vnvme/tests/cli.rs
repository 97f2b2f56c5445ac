//! The `vnvme` binary as a user runs it: `serve` in one process, the tools
//! in others, over a real socket.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_vnvme");

fn temp_socket(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vnvme-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("vnvme.sock")
}

/// A `vnvme serve` child, killed if a test fails before stopping it (else
/// it would hold the test's output pipe and hang `cargo test`).
struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn serve(socket: &Path, extra: &[&str]) -> Served {
    let mut child = Command::new(BIN)
        .args(["serve", "--socket"])
        .arg(socket)
        .args(extra)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "serve did not create its socket");
        assert!(child.try_wait().unwrap().is_none(), "serve exited early");
        std::thread::sleep(Duration::from_millis(20));
    }
    Served(child)
}

fn vnvme(args: &[&str], socket: &Path) -> Output {
    Command::new(BIN)
        .args(args)
        .arg("--socket")
        .arg(socket)
        .output()
        .unwrap()
}

fn terminate(mut served: Served) -> std::process::ExitStatus {
    let child = &mut served.0;
    let pid = rustix::process::Pid::from_child(child);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "serve did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn serve_answers_list_and_id_ctrl_then_stops_on_sigterm() {
    let socket = temp_socket("list");
    let server = serve(
        &socket,
        &[
            "--ns", "64M:ram", "--ns", "16M:null", "--serial", "CLI-TEST",
        ],
    );

    let out = vnvme(&["list", "--json"], &socket);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let devices = doc["Devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[0]["PhysicalSize"], 64 << 20);
    assert_eq!(devices[1]["NameSpace"], 2);
    assert_eq!(devices[0]["SerialNumber"], "CLI-TEST");

    // A second client after the first disconnected is served too.
    let out = vnvme(&["id-ctrl"], &socket);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("mn        : vnvme"), "{text}");
    assert!(text.contains("nn        : 2"), "{text}");

    let status = terminate(server);
    assert!(status.success(), "serve exited with {status}");
    assert!(!socket.exists(), "the socket was not removed");
}

#[test]
fn a_socket_in_use_is_refused_with_a_clear_message() {
    let socket = temp_socket("inuse");
    let server = serve(&socket, &["--ns", "1M:null"]);
    let out = vnvme(&["serve"], &socket);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use by a running server"), "{err}");
    terminate(server);
}

#[test]
fn bad_flags_get_a_clear_message_and_a_non_zero_exit() {
    let out = Command::new(BIN)
        .args(["serve", "--ns", "1G:floppy"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown backend 'floppy'"));

    let out = vnvme(&["list"], Path::new("/nonexistent/vnvme.sock"));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is `vnvme serve --socket"));
}
