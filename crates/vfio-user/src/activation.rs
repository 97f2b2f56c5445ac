//! Socket activation (systemd's `sd_listen_fds(3)` protocol): a service
//! manager, or any launcher that follows the protocol (e.g.
//! `systemd-socket-activate`), opens the listening socket itself and
//! passes it to the server at fd 3, naming it with `LISTEN_PID` (the pid
//! it is meant for) and `LISTEN_FDS` (how many fds from 3 on). The unit
//! file then decides the socket's path, owner, group and mode, and the
//! socket outlives the server (a restart loses no connection attempt).
//!
//! Here one socket is expected: the vfio-user socket. Whatever the outcome
//! the three variables are removed, as `sd_listen_fds(1)` does, so that no
//! child process takes the fds for its own.

use std::io;
use std::os::fd::{AsFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::FileType;
use rustix::net::{AddressFamily, SocketType};

/// The first passed fd (`SD_LISTEN_FDS_START`).
pub const LISTEN_FDS_START: RawFd = 3;

const VARIABLES: [&str; 3] = ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"];

/// A passed fd that cannot serve: what it is, and what to fix in the unit.
#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    #[error("LISTEN_PID={0:?} is not a process id")]
    BadPid(String),
    #[error("LISTEN_FDS={0:?} is not a number of file descriptors")]
    BadCount(String),
    #[error(
        "LISTEN_FDS={0}: exactly one socket is expected (the vfio-user socket): give the .socket \
         unit a single ListenStream="
    )]
    Count(u32),
    #[error("fd 3 (passed with LISTEN_FDS) is not open")]
    NotOpen(#[source] io::Error),
    #[error("fd 3 (passed with LISTEN_FDS) is not a socket but a {0}: the .socket unit needs ListenStream=PATH")]
    NotSocket(&'static str),
    #[error("fd 3 (passed with LISTEN_FDS) is not a UNIX socket (family {0}): the .socket unit needs ListenStream=/PATH, a path")]
    NotUnix(u16),
    #[error("fd 3 (passed with LISTEN_FDS) is not a stream socket (ListenDatagram= or ListenSequentialPacket=?): the .socket unit needs ListenStream=PATH")]
    NotStream,
    #[error("fd 3 (passed with LISTEN_FDS) is not listening (a connection, as with Accept=yes?): the .socket unit needs Accept=no")]
    NotListening,
    #[error("inspecting fd 3 (passed with LISTEN_FDS)")]
    Inspect(#[source] io::Error),
}

/// The listening socket a launcher passed.
#[derive(Debug)]
pub struct Activated {
    pub listener: UnixListener,
    /// Its path; `None` for an abstract or unnamed socket.
    pub path: Option<PathBuf>,
}

/// What the environment says was passed: `None` when nothing was meant for
/// this process (no `LISTEN_PID`, another pid, `LISTEN_FDS` unset or 0).
fn passed_count(
    pid: Option<&str>,
    fds: Option<&str>,
    own_pid: u32,
) -> Result<Option<u32>, ActivationError> {
    let Some(pid) = pid else { return Ok(None) };
    let pid_num: u32 = pid
        .trim()
        .parse()
        // The parser's error says only "invalid digit"; the value says more.
        .map_err(|_| ActivationError::BadPid(pid.to_string()))?;
    if pid_num != own_pid {
        return Ok(None);
    }
    let Some(fds) = fds else { return Ok(None) };
    let n: u32 = fds
        .trim()
        .parse()
        // As above: the value is the whole cause.
        .map_err(|_| ActivationError::BadCount(fds.to_string()))?;
    match n {
        0 => Ok(None),
        1 => Ok(Some(1)),
        n => Err(ActivationError::Count(n)),
    }
}

/// Takes the listening socket passed at fd 3, if the environment names
/// this process; removes `LISTEN_PID`, `LISTEN_FDS` and `LISTEN_FDNAMES`
/// in every case.
///
/// Call it before starting threads: it changes the environment, which is
/// not safe while another thread may read it. A second call finds the
/// variables gone and returns `Ok(None)`.
pub fn take_listener() -> Result<Option<Activated>, ActivationError> {
    let pid = std::env::var("LISTEN_PID").ok();
    let fds = std::env::var("LISTEN_FDS").ok();
    for v in VARIABLES {
        std::env::remove_var(v);
    }
    if passed_count(pid.as_deref(), fds.as_deref(), std::process::id())?.is_none() {
        return Ok(None);
    }
    let fd = claim_fd3()?;
    check_listening(&fd)?;
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC)
        .map_err(|e| ActivationError::Inspect(e.into()))?;
    let listener = UnixListener::from(fd);
    let path = listener
        .local_addr()
        .ok()
        .and_then(|a| a.as_pathname().map(PathBuf::from));
    Ok(Some(Activated { listener, path }))
}

/// Fd 3 as an owned fd, at most once per process.
fn claim_fd3() -> Result<OwnedFd, ActivationError> {
    static CLAIMED: AtomicBool = AtomicBool::new(false);
    if CLAIMED.swap(true, Ordering::AcqRel) {
        return Err(ActivationError::NotOpen(io::Error::other(
            "already taken by an earlier call",
        )));
    }
    // SAFETY: F_GETFD reads the flags of a descriptor number; on a number
    // that is not open it fails with EBADF and touches nothing.
    if unsafe { libc::fcntl(LISTEN_FDS_START, libc::F_GETFD) } < 0 {
        return Err(ActivationError::NotOpen(io::Error::last_os_error()));
    }
    // SAFETY: fd 3 is open, and the launcher gave it to this process
    // (LISTEN_PID is our pid and LISTEN_FDS counts it), so nothing else in
    // the process opened it: no other owner exists. CLAIMED makes this the
    // only OwnedFd ever made of it.
    Ok(unsafe { OwnedFd::from_raw_fd(LISTEN_FDS_START) })
}

/// Refuses anything but a listening AF_UNIX stream socket.
fn check_listening(fd: &OwnedFd) -> Result<(), ActivationError> {
    let inspect = |e: rustix::io::Errno| ActivationError::Inspect(e.into());
    let stat = rustix::fs::fstat(fd).map_err(inspect)?;
    let kind = FileType::from_raw_mode(stat.st_mode);
    if kind != FileType::Socket {
        return Err(ActivationError::NotSocket(describe(kind)));
    }
    let family = rustix::net::sockopt::socket_domain(fd.as_fd()).map_err(inspect)?;
    if family != AddressFamily::UNIX {
        return Err(ActivationError::NotUnix(family.as_raw()));
    }
    if rustix::net::sockopt::socket_type(fd.as_fd()).map_err(inspect)? != SocketType::STREAM {
        return Err(ActivationError::NotStream);
    }
    if !rustix::net::sockopt::socket_acceptconn(fd.as_fd()).map_err(inspect)? {
        return Err(ActivationError::NotListening);
    }
    Ok(())
}

fn describe(kind: FileType) -> &'static str {
    match kind {
        FileType::RegularFile => "regular file",
        FileType::Directory => "directory",
        FileType::Fifo => "pipe",
        FileType::CharacterDevice => "character device",
        FileType::BlockDevice => "block device",
        FileType::Symlink => "symbolic link",
        _ => "file of another kind",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_passed_without_our_pid_and_a_count() {
        assert!(passed_count(None, Some("1"), 42).unwrap().is_none());
        assert!(passed_count(Some("41"), Some("1"), 42).unwrap().is_none());
        assert!(passed_count(Some("42"), None, 42).unwrap().is_none());
        assert!(passed_count(Some("42"), Some("0"), 42).unwrap().is_none());
        assert_eq!(passed_count(Some("42"), Some("1"), 42).unwrap(), Some(1));
    }

    #[test]
    fn malformed_or_several_fds_are_refused() {
        assert!(matches!(
            passed_count(Some("x"), Some("1"), 42),
            Err(ActivationError::BadPid(_))
        ));
        assert!(matches!(
            passed_count(Some("42"), Some("-1"), 42),
            Err(ActivationError::BadCount(_))
        ));
        assert!(matches!(
            passed_count(Some("42"), Some("2"), 42),
            Err(ActivationError::Count(2))
        ));
    }
}
