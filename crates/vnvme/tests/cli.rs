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

/// `vnvme list --json`: the serial number, NQN, and each namespace's
/// NGUID and EUI-64.
fn identities(socket: &Path) -> (String, String, Vec<String>) {
    let out = vnvme(&["list", "--json"], socket);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let devices = doc["Devices"].as_array().unwrap();
    let text = |d: &serde_json::Value, key: &str| d[key].as_str().unwrap().to_string();
    let ids = devices
        .iter()
        .flat_map(|d| [text(d, "NGUID"), text(d, "EUI64")])
        .collect();
    (
        text(&devices[0], "SerialNumber"),
        text(&devices[0], "SubsystemNQN"),
        ids,
    )
}

#[test]
fn default_servers_have_their_own_identity_and_keep_it_across_restarts() {
    let (_dir, a) = temp_socket("ident-a");
    let (_dir2, b) = temp_socket("ident-b");
    let first = serve(&a, &["--ns", "8M:ram"]);
    let other = serve(&b, &["--ns", "8M:ram"]);
    let ident_a = identities(&a);
    let ident_b = identities(&b);
    assert!(first.terminate().success());
    assert!(other.terminate().success());
    let (serial, nqn, ids) = &ident_a;
    assert!(serial.starts_with("VNVME-"), "{serial}");
    assert_eq!(nqn, &format!("nqn.2024-01.io.vnvme:{serial}"));
    assert_ne!(serial, &ident_b.0);
    assert_ne!(nqn, &ident_b.1);
    for (x, y) in ids.iter().zip(&ident_b.2) {
        assert_ne!(x, y, "namespace identifiers");
        assert!(x.chars().any(|c| c != '0'), "{x}");
    }
    let again = serve(&a, &["--ns", "8M:ram"]);
    assert_eq!(identities(&a), ident_a, "after a restart");
    assert!(again.terminate().success());
}

#[test]
fn two_namespaces_with_one_identifier_are_refused_at_start() {
    let (_dir, socket) = temp_socket("dup-id");
    let uuid = "uuid=5d1e7a2c-3f4b-4e8e-9a61-0c2b7d9fe310";
    let out = Command::new(BIN)
        .args([
            "serve",
            "--ns",
            &format!("1M,{uuid}"),
            "--ns",
            &format!("1M:null,{uuid}"),
            "--socket",
        ])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("namespaces 1 and 2 have the same UUID"),
        "{err}"
    );
}

/// Issue 37 item 3: `--ns`'s help hid the NBD backend. Every storage form
/// and option the parser takes (it takes no other, see
/// `vnvme::ns_syntax`) is in the help of each command that takes `--ns`.
#[test]
fn ns_help_names_every_form_and_option_the_parser_takes() {
    use vnvme::ns_syntax::{NS_FORMS, NS_OPTIONS};
    use vnvme::qos::NS_QOS_OPTIONS;
    use vnvme::zoned_options::ZONED_OPTIONS;
    let help = |args: &[&str]| {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert!(out.status.success(), "vnvme {}", args.join(" "));
        String::from_utf8(out.stdout).unwrap()
    };
    for command in [&["serve"][..], &["bench", "init"]] {
        let long = help(&[command, &["--help"]].concat());
        for form in NS_FORMS
            .iter()
            .chain(NS_OPTIONS)
            .chain(ZONED_OPTIONS)
            .chain(NS_QOS_OPTIONS)
        {
            assert!(
                long.contains(form),
                "`vnvme {command:?} --help` lacks {form}"
            );
        }
        // The short help names every backend too.
        let short = help(&[command, &["-h"]].concat());
        for form in NS_FORMS {
            assert!(short.contains(form), "`vnvme {command:?} -h` lacks {form}");
        }
    }
}
