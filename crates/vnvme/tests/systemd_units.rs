//! The sample systemd units in contrib/systemd pass `systemd-analyze
//! verify` (which needs no running systemd: CI's containers have none),
//! with not even a warning, for an instance, with ExecStart pointing at
//! the built binary (verify checks that it exists and is executable).

mod common;

use std::process::Command;

use common::{temp_dir, BIN};

const UNITS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../contrib/systemd");

#[test]
fn sample_units_pass_systemd_analyze_verify() {
    let dir = temp_dir("systemd-units");
    let service = std::fs::read_to_string(format!("{UNITS}/vnvme@.service")).unwrap();
    assert!(service.contains("ExecStart=/usr/local/bin/vnvme serve"));
    let service = service.replace("/usr/local/bin/vnvme", BIN);
    std::fs::write(dir.join("vnvme@.service"), service).unwrap();
    std::fs::copy(format!("{UNITS}/vnvme@.socket"), dir.join("vnvme@.socket")).unwrap();

    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(dir.join("vnvme@vm1.socket"))
        .arg(dir.join("vnvme@vm1.service"))
        .output()
        .expect("systemd-analyze (package systemd; tests/install-deps.sh installs it)");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.trim().is_empty(), "warnings: {err}");

    // The check itself finds mistakes: a misspelt key is a warning.
    let socket = std::fs::read_to_string(dir.join("vnvme@.socket")).unwrap();
    std::fs::write(
        dir.join("vnvme@.socket"),
        socket.replace("SocketMode=", "SocketMod="),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(dir.join("vnvme@vm1.socket"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("Unknown key 'SocketMod'"));
}
