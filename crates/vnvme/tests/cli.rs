//! The `vnvme` binary as a user runs it: `serve` in one process, the tools
//! in others, over a real socket.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{serve, vnvme, BIN};

/// A socket path in a fresh folder (removed when the folder is dropped).
fn temp_socket(name: &str) -> (common::TempDir, PathBuf) {
    let dir = common::temp_dir(name);
    let socket = dir.join("vnvme.sock");
    (dir, socket)
}

#[test]
fn serve_answers_list_and_id_ctrl_then_stops_on_sigterm() {
    let (_dir, socket) = temp_socket("list");
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

    let status = server.terminate();
    assert!(status.success(), "serve exited with {status}");
    assert!(!socket.exists(), "the socket was not removed");
}

#[test]
fn a_socket_in_use_is_refused_with_a_clear_message() {
    let (_dir, socket) = temp_socket("inuse");
    let server = serve(&socket, &["--ns", "1M:null"]);
    let out = vnvme(&["serve"], &socket);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use by a running server"), "{err}");
    server.terminate();
}

#[test]
fn bad_flags_get_a_clear_message_and_a_non_zero_exit() {
    let out = Command::new(BIN)
        .args(["serve", "--ns", "1G:floppy"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown backend 'floppy'"));

    let (_dir, socket) = temp_socket("stop-timeout");
    let out = Command::new(BIN)
        .args([
            "serve",
            "--ns",
            "1M:null",
            "--stop-timeout",
            "0",
            "--socket",
        ])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--stop-timeout must be more than 0"), "{err}");
    assert!(!socket.exists(), "a refused start left its socket");

    let out = vnvme(&["list"], Path::new("/nonexistent/vnvme.sock"));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is `vnvme serve --socket"));
}
