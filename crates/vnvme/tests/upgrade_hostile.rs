//! A live upgrade's new process (`vnvme serve --handover-fd N`) given a
//! handover that is not sound: corrupt, truncated, unsealed, naming fds it
//! does not have, or carrying a saved state that does not check out. Each is
//! refused with a clear error (on the status pipe when there is one), never
//! a panic or a guess.

mod common;

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd};
use std::process::Command;

use common::{temp_dir, BIN};
use serde_json::Value;

/// Runs `vnvme serve --handover-fd N` on a memfd holding `bytes` (sealed
/// if `seal`): what it prints and its status.
fn serve_handover(bytes: &[u8], seal: bool) -> (bool, String) {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = rustix::fs::memfd_create("test-handover", MemfdFlags::ALLOW_SEALING).unwrap();
    rustix::io::write(&fd, bytes).unwrap();
    if seal {
        rustix::fs::fcntl_add_seals(&fd, SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW)
            .unwrap();
    }
    let dir = temp_dir(&format!("upgrade-hostile-{}", bytes.len()));
    let out = Command::new(BIN)
        .args(["serve", "--socket"])
        .arg(dir.join("s.sock"))
        .args(["--ns", "1M:null", "--handover-fd"])
        .arg(fd.as_raw_fd().to_string())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_corrupt_or_truncated_handover_is_refused_clearly() {
    let manifest = br#"{"status_fd":3,"listener_fd":4}"#;
    let mut good_head = b"VNVMEHO1".to_vec();
    good_head.extend_from_slice(&(manifest.len() as u32).to_le_bytes());
    let cases: Vec<(Vec<u8>, bool, &str)> = vec![
        (good_head.clone(), false, "not a sealed memfd"),
        (b"VNVME".to_vec(), true, "not a vnvme handover"),
        (b"NOTVNVME\0\0\0\0".to_vec(), true, "not a vnvme handover"),
        (good_head.clone(), true, "its manifest says"),
        (
            [good_head.clone(), manifest.to_vec()].concat(),
            true,
            "not valid",
        ),
        (
            [good_head.clone(), b"{not json".to_vec()].concat(),
            true,
            "its manifest says",
        ),
    ];
    for (bytes, seal, expect) in cases {
        let (ok, err) = serve_handover(&bytes, seal);
        assert!(!ok, "{expect}: served");
        assert!(err.contains(expect), "{expect}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // An fd that is not open.
    let out = Command::new(BIN)
        .args(["serve", "--ns", "1M:null", "--handover-fd", "999"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("fd 999 is not open"), "{err}");
    let out = Command::new(BIN)
        .args(["serve", "--ns", "1M:null", "--handover-fd", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("stdin, stdout or stderr"), "{err}");
}

/// A handover whose fds are real but whose saved state is corrupt: the new
/// process says why on its status pipe and exits; nothing is served.
#[test]
fn a_corrupt_saved_state_is_reported_on_the_status_pipe() {
    use rustix::fs::{MemfdFlags, SealFlags};
    let dir = temp_dir("upgrade-corrupt-state");
    let listener = std::os::unix::net::UnixListener::bind(dir.join("l.sock")).unwrap();
    let (conn, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
    let (mut status_rx, status_tx) = std::io::pipe().unwrap();
    // Inheritable copies at numbers the manifest names.
    let tx = rustix::io::dup(status_tx.as_fd()).unwrap();
    let l = rustix::io::dup(listener.as_fd()).unwrap();
    let c = rustix::io::dup(conn.as_fd()).unwrap();
    drop(status_tx);
    let state = b"VNVMESTA but then nothing that checks out".to_vec();
    let manifest = serde_json::json!({
        "status_fd": tx.as_raw_fd(),
        "listener_fd": l.as_raw_fd(),
        "socket_owned": false,
        "control": null,
        "spawned_ns": 0,
        "client": {
            "conn_fd": c.as_raw_fd(),
            "max_xfer": 1 << 20,
            "maps": [],
            "file_fds": [],
            "vector_fds": [],
            "intx_fd": null,
            "doorbell_fd": null,
            "function": {"config": [], "msix_table": [], "intx_no_automask": false},
            "state_len": state.len(),
        },
    })
    .to_string();
    let mut bytes = b"VNVMEHO1".to_vec();
    bytes.extend_from_slice(&(manifest.len() as u32).to_le_bytes());
    bytes.extend_from_slice(manifest.as_bytes());
    bytes.extend_from_slice(&state);
    let fd = rustix::fs::memfd_create("test-handover", MemfdFlags::ALLOW_SEALING).unwrap();
    rustix::io::write(&fd, &bytes).unwrap();
    rustix::fs::fcntl_add_seals(&fd, SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW)
        .unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--socket"])
        .arg(dir.join("l.sock"))
        .args(["--ns", "1M:null", "--doorbells", "trap", "--handover-fd"])
        .arg(fd.as_raw_fd().to_string())
        .output()
        .unwrap();
    drop((tx, l, c));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    let mut line = String::new();
    status_rx.read_to_string(&mut line).unwrap();
    let v: Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(v["ok"], false, "{line}");
    assert!(
        v["error"].as_str().unwrap().contains("saved state"),
        "{line}"
    );
}
