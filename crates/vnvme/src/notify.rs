//! Telling the service manager how the server is doing, in systemd's
//! notification protocol (sd_notify(3)) without libsystemd: one datagram of
//! `KEY=VALUE` lines to the Unix socket `$NOTIFY_SOCKET` names (a path, or
//! an abstract name written with a leading `@`). Without the variable
//! nothing is sent: a server started by hand or by another init.
//!
//! `vnvme serve` says `READY=1` once its sockets listen (so a `Type=notify`
//! unit counts as started only then), and a live upgrade's old process says
//! `MAINPID=` of the new one before it exits, so the manager keeps the
//! service (and its cgroup) instead of seeing its main process end.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixDatagram;
use std::path::Path;

/// The environment variable naming the manager's socket.
pub const SOCKET_VAR: &str = "NOTIFY_SOCKET";

/// The server listens and serves.
pub fn ready() {
    send("READY=1");
}

/// Process `pid` is the service's main process from now on.
pub fn main_pid(pid: u32) {
    send(&format!("MAINPID={pid}"));
}

/// Sends `message` if a manager listens; a failure is logged, never fatal:
/// the device serves whether or not the manager heard.
fn send(message: &str) {
    let Some(socket) = std::env::var_os(SOCKET_VAR) else {
        return;
    };
    if let Err(e) = send_to(&socket, message) {
        tracing::warn!(
            "telling the service manager {message:?} through {SOCKET_VAR}={}: {e}",
            socket.to_string_lossy()
        );
    }
}

fn send_to(socket: &OsStr, message: &str) -> std::io::Result<()> {
    let datagram = UnixDatagram::unbound()?;
    // A manager whose queue is full loses the message rather than stop us.
    datagram.set_nonblocking(true)?;
    let sent = match socket.as_bytes() {
        [] => return Err(std::io::Error::other("the variable is empty")),
        [b'@', name @ ..] => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            datagram.send_to_addr(message.as_bytes(), &addr)?
        }
        _ => datagram.send_to(message.as_bytes(), Path::new(socket))?,
    };
    if sent != message.len() {
        return Err(std::io::Error::other("the message was cut short"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(listener: &UnixDatagram) -> String {
        let mut buf = [0u8; 256];
        let n = listener.recv(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn a_message_reaches_a_socket_named_by_path_or_abstract_name() {
        let path = std::env::temp_dir().join(format!("vnvme-notify-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let by_path = UnixDatagram::bind(&path).unwrap();
        send_to(path.as_os_str(), "READY=1").unwrap();
        assert_eq!(received(&by_path), "READY=1");
        let _ = std::fs::remove_file(&path);

        use std::os::linux::net::SocketAddrExt;
        let name = format!("vnvme-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let abstract_socket = UnixDatagram::bind_addr(&addr).unwrap();
        send_to(OsStr::new(&format!("@{name}")), "MAINPID=42").unwrap();
        assert_eq!(received(&abstract_socket), "MAINPID=42");
    }

    #[test]
    fn a_socket_nobody_listens_on_is_an_error_not_a_hang() {
        let path = std::env::temp_dir().join("vnvme-notify-nobody-listens");
        assert!(send_to(path.as_os_str(), "READY=1").is_err());
        assert!(send_to(OsStr::new(""), "READY=1").is_err());
    }
}
