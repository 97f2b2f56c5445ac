//! `vnvme serve --metrics`: I/O through our driver (`vnvme io-passthru`)
//! moves the metrics by exactly what it did, `promtool check metrics`
//! accepts the text, and hostile HTTP clients get an answer or are cut
//! off without holding up the next scrape.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{serve, temp_dir, vnvme, Served};

/// A port free now (the server binds it next).
fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Sends `request` and returns the whole answer.
fn http(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The body of GET /metrics, after checking the status line.
fn scrape(addr: SocketAddr) -> String {
    let answer = http(addr, b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n");
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    body.to_string()
}

/// Samples by `name{labels}` (labels sorted by name), values as numbers.
fn samples(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (key, value) = line.rsplit_once(' ').unwrap();
        let key = match key.split_once('{') {
            Some((name, labels)) => {
                let mut l: Vec<&str> = labels.trim_end_matches('}').split(',').collect();
                l.sort();
                format!("{name}{{{}}}", l.join(","))
            }
            None => key.to_string(),
        };
        out.insert(key, value.parse().unwrap());
    }
    out
}

fn delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>, key: &str) -> f64 {
    let a = after.get(key).copied().unwrap_or(0.0);
    a - before.get(key).copied().unwrap_or(0.0)
}

/// Waits until the metrics port answers.
fn wait_listening(addr: SocketAddr, server: &mut Served) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "metrics port never opened");
        assert!(server.running(), "serve exited");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn io_moves_the_metrics_by_exact_counts_and_promtool_accepts_them() {
    let dir = temp_dir("metrics");
    let socket = dir.join("vnvme.sock");
    let addr = free_addr();
    let metrics = addr.to_string();
    let mut server = serve(&socket, &["--ns", "16M:ram", "--metrics", &metrics]);
    wait_listening(addr, &mut server);
    let before = samples(&scrape(addr));

    let data = dir.join("data");
    std::fs::write(&data, vec![0x5Au8; 8192]).unwrap();
    let write = [
        "io-passthru",
        "--opcode",
        "1",
        "-n",
        "1",
        "--cdw12",
        "1",
        "-l",
        "8192",
        "-w",
        "-i",
    ];
    let out = vnvme(&[&write[..], &[data.to_str().unwrap()]].concat(), &socket);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read = [
        "io-passthru",
        "--opcode",
        "2",
        "-n",
        "1",
        "--cdw12",
        "0",
        "-l",
        "4096",
        "-r",
    ];
    let out = vnvme(&read, &socket);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // An opcode no command set has: Invalid Command Opcode.
    vnvme(&["io-passthru", "--opcode", "0x7f", "-n", "1"], &socket);

    let text = scrape(addr);
    let after = samples(&text);
    let d = |key: &str| delta(&before, &after, key);
    assert_eq!(
        d("vnvme_commands_total{opcode=\"write\",queue_type=\"io\"}"),
        1.0
    );
    assert_eq!(
        d("vnvme_commands_total{opcode=\"read\",queue_type=\"io\"}"),
        1.0
    );
    assert_eq!(d("vnvme_completions_total{status=\"invalid-opcode\"}"), 1.0);
    assert_eq!(d("vnvme_queue_commands_total{qid=\"1\"}"), 3.0);
    assert_eq!(d("vnvme_queue_errors_total{qid=\"1\"}"), 1.0);
    assert_eq!(d("vnvme_namespace_write_commands_total{nsid=\"1\"}"), 1.0);
    assert_eq!(d("vnvme_namespace_written_bytes_total{nsid=\"1\"}"), 8192.0);
    assert_eq!(d("vnvme_namespace_read_commands_total{nsid=\"1\"}"), 1.0);
    assert_eq!(d("vnvme_namespace_read_bytes_total{nsid=\"1\"}"), 4096.0);
    // The first command of a queue is sampled, then one in 64.
    assert_eq!(d("vnvme_command_latency_seconds_count{qid=\"1\"}"), 1.0);
    assert_eq!(
        after.get("vnvme_command_latency_seconds_bucket{le=\"+Inf\",qid=\"1\"}"),
        Some(&1.0)
    );
    assert_eq!(d("vnvme_enables_total"), 3.0, "one enable per tool run");

    let promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus) is needed: apt-get install prometheus");
    promtool
        .stdin
        .as_ref()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let status = server.terminate();
    assert!(status.success(), "serve exited with {status}");
}

#[test]
fn hostile_http_clients_get_an_error_or_are_cut_off_and_scrapes_go_on() {
    let dir = temp_dir("metrics-hostile");
    let socket = dir.join("vnvme.sock");
    let addr = free_addr();
    let mut server = serve(&socket, &["--ns", "1M:ram", "--metrics", &addr.to_string()]);
    wait_listening(addr, &mut server);
    // Clients that connect and say nothing, or half a request line.
    let silent: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let mut half = TcpStream::connect(addr).unwrap();
    half.write_all(b"GET /met").unwrap();
    assert!(
        scrape(addr).contains("vnvme_enables_total"),
        "served meanwhile"
    );

    let status_of = |req: &[u8]| {
        http(addr, req)
            .lines()
            .next()
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(
        status_of(b"GET / HTTP/1.1\r\n\r\n"),
        "HTTP/1.1 404 Not Found"
    );
    assert_eq!(
        status_of(b"POST /metrics HTTP/1.1\r\n\r\n"),
        "HTTP/1.1 405 Method Not Allowed"
    );
    assert_eq!(
        status_of(b"\x16\x03\x01 hello\r\n\r\n"),
        "HTTP/1.1 400 Bad Request"
    );
    let mut long = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
    long.resize(100_000, b'a');
    let answer = {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // The server stops reading at its limit: the rest may not be sent.
        let _ = s.write_all(&long);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    };
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:.80}");

    // The silent ones are cut off at the request deadline.
    let mut s = silent.into_iter().next().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(s.read(&mut buf).unwrap_or(0), 0, "closed without an answer");
    let status = server.terminate();
    assert!(status.success(), "serve exited with {status}");
}
