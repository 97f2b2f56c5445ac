//! `vnvme bench --controllers`: several controllers at once, each with its
//! own driver client, served by `vnvme serve` processes the bench starts.

use std::process::Command;

fn vnvme(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_vnvme"))
        .args(args)
        .output()
        .expect("running vnvme")
}

#[test]
fn every_controller_of_every_point_completes_io_as_processes() {
    every_controller_completes_io("processes");
}

#[test]
fn every_controller_of_every_point_completes_io_in_one_process() {
    every_controller_completes_io("one-process");
}

#[test]
fn every_controller_of_every_point_completes_io_in_one_subsystem() {
    every_controller_completes_io("subsystem");
}

/// A sweep of 1 and 3 controllers served as `server` ("processes",
/// "one-process" or "subsystem"): every client of every point completed I/O, none failed.
fn every_controller_completes_io(server: &str) {
    let dir = std::env::temp_dir().join(format!(
        "vnvme-bench-scale-test-{}-{server}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("scale.json");
    let json_arg = json.to_str().unwrap();
    let mut args = vec![
        "bench",
        "--controllers",
        "1,3",
        "--modes",
        "adaptive",
        "--qd",
        "4",
        "--runtime",
        "0.3",
        "--idle-seconds",
        "0.2",
        "--size",
        "64M",
        "--json",
        json_arg,
    ];
    match server {
        "processes" => args.push("--processes"),
        "subsystem" => args.push("--subsystem"),
        _ => {}
    }
    let out = vnvme(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {stderr}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = doc["scale"].as_array().expect("a scale array");
    let counts: Vec<u64> = rows
        .iter()
        .map(|r| r["controllers"].as_u64().unwrap())
        .collect();
    assert_eq!(counts, [1, 3], "{doc}");
    for r in rows {
        assert_eq!(r["server"], server, "{r}");
        assert_eq!(r["errors"], 0, "{r}");
        // The slowest controller completed I/O too: every client ran.
        let min = r["min_controller_iops"].as_f64().unwrap();
        let max = r["max_controller_iops"].as_f64().unwrap();
        let all = r["iops"].as_f64().unwrap();
        assert!(min > 0.0 && min <= max && max <= all, "{r}");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("min/max"), "no table: {stdout}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs `vnvme bench ARGS`, which must fail, and returns its stderr.
fn refused(args: &[&str]) -> String {
    let out = vnvme(&[&["bench"], args].concat());
    assert!(!out.status.success(), "{args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn attach_needs_a_socket_per_controller() {
    let stderr = refused(&["--controllers", "2", "--attach", "/nonexistent/a.sock"]);
    assert!(
        stderr.contains("--controllers 2 needs 2 sockets, --attach gave 1"),
        "{stderr}"
    );
}

#[test]
fn attach_and_processes_together_are_refused() {
    let stderr = refused(&[
        "--controllers",
        "1",
        "--attach",
        "/nonexistent/a.sock",
        "--processes",
    ]);
    assert!(stderr.contains("leave out --processes"), "{stderr}");
}

#[test]
fn a_socket_nobody_serves_is_named() {
    let stderr = refused(&[
        "--controllers",
        "1",
        "--attach",
        "/nonexistent/a.sock",
        "--modes",
        "mmap-poll",
        "--idle-seconds",
        "0.1",
    ]);
    assert!(
        stderr.contains("connecting to /nonexistent/a.sock"),
        "{stderr}"
    );
}
