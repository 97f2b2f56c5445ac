//! Connecting to a server's socket, with an error that says what stands in
//! the way: permissions (whose socket, which mode, what to change), no
//! socket, or a socket nobody listens on.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use super::access::{group_name, user_name};

/// Which socket a tool connects to, for its messages.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// `vnvme serve`'s flag that makes it (`--socket`, `--control`).
    pub flag: &'static str,
    /// The flags that set who may connect (`--socket-group/--socket-mode`).
    pub access_flags: &'static str,
    /// What it is (`vfio-user socket`, `control socket`).
    pub what: &'static str,
}

/// The vfio-user socket `vnvme serve --socket` makes.
pub const VFIO_USER: Target = Target {
    flag: "--socket",
    access_flags: "--socket-group/--socket-mode",
    what: "vfio-user socket",
};

/// The control socket `vnvme serve --control` makes.
pub const CONTROL: Target = Target {
    flag: "--control",
    access_flags: "--control-mode",
    what: "control socket",
};

/// A connection that could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(
        "permission denied connecting to {path}: the socket belongs to {owner}:{group} mode \
         {mode:03o}; run as {allowed}, or start serve with {access_flags}"
    )]
    Denied {
        path: PathBuf,
        owner: String,
        group: String,
        mode: u32,
        /// Who may connect, e.g. `root or a member of group kvm`.
        allowed: String,
        access_flags: &'static str,
    },
    #[error(
        "permission denied connecting to {path}: folder {dir} ({owner}:{group} mode {mode:03o}) \
         does not let you search it; run as a user who may, or serve the socket in another folder"
    )]
    FolderDenied {
        path: PathBuf,
        dir: PathBuf,
        owner: String,
        group: String,
        mode: u32,
    },
    #[error("no {what} at {path}: is `vnvme serve {flag} {path}` running?")]
    Missing {
        path: PathBuf,
        what: &'static str,
        flag: &'static str,
    },
    #[error("{path} is not a socket: is the path the one given to `vnvme serve {flag}`?")]
    NotSocket { path: PathBuf, flag: &'static str },
    #[error(
        "nothing listens on {path}: the server that made it has stopped (or is still starting); \
         start `vnvme serve {flag} {path}`"
    )]
    Refused { path: PathBuf, flag: &'static str },
    #[error("the server on {path} accepts no more connections now (its queue is full): try again")]
    Full { path: PathBuf },
    #[error("connecting to {}", path.display())]
    Other {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Connects to `path`, explaining a failure.
pub fn connect(path: &Path, target: Target) -> Result<UnixStream, ConnectError> {
    UnixStream::connect(path).map_err(|e| explain(path, target, e))
}

fn explain(path: &Path, target: Target, e: io::Error) -> ConnectError {
    use rustix::io::Errno;
    let path_buf = path.to_owned();
    match Errno::from_io_error(&e) {
        Some(Errno::ACCESS | Errno::PERM) => denied(path, target, e),
        Some(Errno::NOENT | Errno::NOTDIR) => ConnectError::Missing {
            path: path_buf,
            what: target.what,
            flag: target.flag,
        },
        Some(Errno::CONNREFUSED) => match std::fs::metadata(path) {
            Ok(m) if !m.file_type().is_socket() => ConnectError::NotSocket {
                path: path_buf,
                flag: target.flag,
            },
            _ => ConnectError::Refused {
                path: path_buf,
                flag: target.flag,
            },
        },
        Some(Errno::AGAIN) => ConnectError::Full { path: path_buf },
        _ => ConnectError::Other {
            path: path_buf,
            source: e,
        },
    }
}

/// EACCES: the socket's own mode, or a folder above it.
fn denied(path: &Path, target: Target, e: io::Error) -> ConnectError {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(_) => {
            return folder_denied(path).unwrap_or(ConnectError::Other {
                path: path.to_owned(),
                source: e,
            })
        }
    };
    let mode = meta.mode() & 0o7777;
    let owner = user_name(meta.uid());
    let group = group_name(meta.gid());
    let allowed = match (mode & 0o200 != 0, mode & 0o020 != 0) {
        (_, true) => format!("{owner} or a member of group {group}"),
        (true, false) => owner.clone(),
        (false, false) => "root".to_string(),
    };
    let allowed = if owner == "root" || allowed == "root" {
        allowed
    } else {
        format!("{allowed} (or root)")
    };
    ConnectError::Denied {
        path: path.to_owned(),
        owner,
        group,
        mode,
        allowed,
        access_flags: target.access_flags,
    }
}

/// The first folder above `path` this process may not search.
fn folder_denied(path: &Path) -> Option<ConnectError> {
    let absolute = std::path::absolute(path).ok()?;
    let mut dirs: Vec<&Path> = absolute.ancestors().skip(1).collect();
    dirs.reverse();
    for dir in dirs {
        let searchable = rustix::fs::access(dir, rustix::fs::Access::EXEC_OK).is_ok();
        if !searchable {
            let m = std::fs::metadata(dir).ok()?;
            return Some(ConnectError::FolderDenied {
                path: path.to_owned(),
                dir: dir.to_owned(),
                owner: user_name(m.uid()),
                group: group_name(m.gid()),
                mode: m.mode() & 0o7777,
            });
        }
    }
    None
}
