//! The metrics endpoint: a small HTTP/1.x server on a std `TcpListener`,
//! one thread accepting and one per connection, that answers `GET
//! /metrics` and closes. An HTTP client is hostile input: a request head
//! is read within [`REQUEST_DEADLINE`] and [`MAX_REQUEST`] bytes, the
//! answer written within [`WRITE_TIMEOUT`] (and the connection drained
//! for at most a second before it closes), at most [`MAX_CONNECTIONS`]
//! are served at once (more are closed unanswered), so no client can
//! wedge the endpoint, and none the NVMe controller, which it only reads.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use vnvme_controller::Controller;

/// Bytes of a request head (request line and headers) read at most.
pub const MAX_REQUEST: usize = 8192;
/// Time a client has to send its request head whole.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(2);
/// Time a client has to take the answer.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 16;
/// How often the accepting thread looks at its stop flag.
const POLL: Duration = Duration::from_millis(50);

/// The running endpoint; [`MetricsServer::stop`] ends it.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// The listening socket for `addr` (port 0: any free port).
    pub fn bind(addr: SocketAddr) -> Result<TcpListener> {
        TcpListener::bind(addr).with_context(|| format!("binding --metrics address {addr}"))
    }

    /// Serves `ctrl`'s metrics on `listener` (bound here, or handed over by
    /// a live upgrade's old process) until stopped.
    pub fn serve(listener: TcpListener, ctrl: Arc<Controller>) -> Result<Self> {
        let addr = listener
            .local_addr()
            .context("reading the metrics address")?;
        listener
            .set_nonblocking(true)
            .context("setting the metrics socket non-blocking")?;
        let done = Arc::new(AtomicBool::new(false));
        let d = Arc::clone(&done);
        let thread = std::thread::Builder::new()
            .name("vnvme-metrics".into())
            .spawn(move || accept_loop(&listener, &ctrl, &d))
            .context("starting the metrics thread")?;
        Ok(Self {
            addr,
            done,
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting; connections being served finish on their own
    /// within their deadlines.
    pub fn stop(mut self) {
        self.done.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, ctrl: &Arc<Controller>, done: &AtomicBool) {
    let active = Arc::new(AtomicUsize::new(0));
    let mut last_error: Option<io::ErrorKind> = None;
    while !done.load(Ordering::Acquire) {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(POLL);
                continue;
            }
            Err(e) => {
                // Out of fds and the like: warn once per kind, do not spin.
                if last_error != Some(e.kind()) {
                    tracing::warn!("metrics: accepting a connection: {e}");
                    last_error = Some(e.kind());
                }
                std::thread::sleep(POLL);
                continue;
            }
        };
        if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::AcqRel);
            continue;
        }
        let (ctrl, slot) = (Arc::clone(ctrl), Arc::clone(&active));
        let spawned = std::thread::Builder::new()
            .name("vnvme-metrics-conn".into())
            .spawn(move || {
                if let Err(e) = serve_connection(stream, &ctrl) {
                    tracing::debug!("metrics: connection: {e}");
                }
                slot.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            active.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!("metrics: starting a connection thread: {e}");
        }
    }
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
enum Request {
    Metrics,
    NotFound,
    MethodNotAllowed,
    Bad,
}

/// Parses a request head's first line.
fn parse(head: &[u8]) -> Request {
    let line = head
        .split(|&b| b == b'\r' || b == b'\n')
        .next()
        .unwrap_or_default();
    let Ok(line) = std::str::from_utf8(line) else {
        return Request::Bad;
    };
    let mut words = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Request::Bad;
    };
    if !version.starts_with("HTTP/1.") {
        return Request::Bad;
    }
    let path = target.split('?').next().unwrap_or_default();
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => Request::Metrics,
        ("GET" | "HEAD", _) => Request::NotFound,
        _ => Request::MethodNotAllowed,
    }
}

/// Reads the request head: up to the blank line, [`MAX_REQUEST`] bytes
/// and [`REQUEST_DEADLINE`] (a deadline for the whole head, not per read,
/// so a byte at a time does not extend it). `None` if it did not come.
fn read_head(stream: &mut TcpStream) -> io::Result<Option<Vec<u8>>> {
    let deadline = Instant::now() + REQUEST_DEADLINE;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        stream.set_read_timeout(Some(left))?;
        let n = match stream.read(&mut buf) {
            Ok(0) => return Ok(None),
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(None)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        head.extend_from_slice(buf.get(..n).unwrap_or_default());
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
            return Ok(Some(head));
        }
        if head.len() >= MAX_REQUEST {
            return Ok(Some(head));
        }
    }
}

fn serve_connection(mut stream: TcpStream, ctrl: &Controller) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let Some(head) = read_head(&mut stream)? else {
        return Ok(());
    };
    let too_long = head.len() >= MAX_REQUEST;
    let head_only = head.starts_with(b"HEAD ");
    let (status, content_type, body) = match parse(&head) {
        _ if too_long => (
            "431 Request Header Fields Too Large",
            "text/plain",
            String::new(),
        ),
        Request::Metrics => (
            "200 OK",
            super::CONTENT_TYPE,
            super::encode_subsystem(&ctrl.subsystem_stats()),
        ),
        Request::NotFound => (
            "404 Not Found",
            "text/plain",
            "metrics are at /metrics\n".into(),
        ),
        Request::MethodNotAllowed => ("405 Method Not Allowed", "text/plain", String::new()),
        Request::Bad => ("400 Bad Request", "text/plain", String::new()),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        response.extend_from_slice(body.as_bytes());
    }
    stream.write_all(&response)?;
    stream.flush()?;
    linger(&mut stream);
    Ok(())
}

/// Closes after the answer without losing it: closing a socket with
/// unread request bytes (a head cut at [`MAX_REQUEST`]) sends a reset
/// that can discard the answer before the client reads it, so what the
/// client still sends is read and dropped first, within bounds.
fn linger(stream: &mut TcpStream) {
    const MAX_DRAIN: usize = 1 << 20;
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut buf = [0u8; 4096];
    let mut drained = 0;
    while drained < MAX_DRAIN {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            break;
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines_are_parsed_strictly() {
        assert_eq!(
            parse(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Request::Metrics
        );
        assert_eq!(
            parse(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Request::Metrics
        );
        assert_eq!(parse(b"GET / HTTP/1.1\r\n\r\n"), Request::NotFound);
        assert_eq!(
            parse(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Request::MethodNotAllowed
        );
        assert_eq!(parse(b"GET /metrics\r\n\r\n"), Request::Bad);
        assert_eq!(parse(b"GET /metrics SPDY/3 extra\r\n\r\n"), Request::Bad);
        assert_eq!(parse(b"\xff\xfe /metrics HTTP/1.1\r\n\r\n"), Request::Bad);
        assert_eq!(parse(b""), Request::Bad);
    }
}
