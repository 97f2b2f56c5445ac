//! Binding a listening socket with its final mode and group from the first
//! moment anyone else can reach it.
//!
//! `bind(2)` creates the socket file with `0777 & ~umask` and the process's
//! group, and a `chmod`/`chown` after it leaves a moment in which the file
//! has other permissions; narrowing the umask around `bind` instead changes
//! it for every thread of the process (a file another thread creates then
//! gets the wrong mode), and still leaves the group to a later `chown` by
//! path, which another user who can write the folder could redirect by
//! swapping the file. So the socket is bound inside a private folder (mode
//! 0700, made next to the final path, on the same filesystem): there only
//! the server's user can reach it while its group and mode are set through
//! that folder's fd; then `rename(2)` moves the finished file to its path
//! in one step, without replacing anything (`RENAME_NOREPLACE`), and the
//! folder is removed.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags, CWD};

use super::access::Access;

/// Longest path a `sockaddr_un` holds (108 bytes with the final NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// The name the socket has inside the private folder.
const INNER: &str = "s";

/// A socket file this process made, by path and identity: removed only if
/// the path still names that file (not one another server made since).
#[derive(Debug, Clone)]
pub struct SocketFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl SocketFile {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The socket file a previous process made at `path` (a live
    /// upgrade's: this process removes it at exit as that one would have).
    pub fn existing(path: &Path) -> std::io::Result<Self> {
        let m = std::fs::symlink_metadata(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            dev: m.dev(),
            ino: m.ino(),
        })
    }

    /// Removes the file if it is still the one this process made.
    pub fn remove(&self) {
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| m.dev() == self.dev && m.ino() == self.ino);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Binds `path` (the `what`, set by `flag`) with `access`, replacing a
/// stale socket file but refusing a live server's socket or a file that is
/// not a socket.
pub fn bind(
    path: &Path,
    access: &Access,
    flag: &str,
    what: &str,
) -> Result<(UnixListener, SocketFile)> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        bail!(
            "{what} path {} is {len} bytes: a UNIX socket path holds at most {MAX_SOCKET_PATH}; \
             choose a shorter {flag}",
            path.display()
        );
    }
    if path.file_name().is_none() {
        bail!("{flag} {} names no file", path.display());
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        bail!(
            "cannot create socket {}: directory {} does not exist",
            path.display(),
            parent.display()
        );
    }
    remove_stale(path, flag)?;
    let dir = PrivateDir::create(parent).with_context(|| {
        format!(
            "making a private folder in {} to bind {what} in",
            parent.display()
        )
    })?;
    let listener = UnixListener::bind(dir.bind_path())
        .with_context(|| format!("binding {what} {}", path.display()))?;
    if let Some(group) = &access.group {
        rustix::fs::chownat(
            &dir.fd,
            INNER,
            None,
            Some(rustix::fs::Gid::from_raw(group.gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(io::Error::from)
        .with_context(|| {
            format!(
                "giving {what} {} to group {} (gid {}): the server must be a member of that group \
                 or have CAP_CHOWN",
                path.display(),
                group.name,
                group.gid
            )
        })?;
    }
    rustix::fs::chmodat(
        &dir.fd,
        INNER,
        Mode::from_raw_mode(access.mode),
        AtFlags::empty(),
    )
    .map_err(io::Error::from)
    .with_context(|| format!("setting the mode of {what} {}", path.display()))?;
    let stat = rustix::fs::statat(&dir.fd, INNER, AtFlags::SYMLINK_NOFOLLOW)
        .map_err(io::Error::from)
        .with_context(|| format!("reading back {what} {}", path.display()))?;
    dir.move_to(path).map_err(|e| match e.kind() {
        io::ErrorKind::AlreadyExists => anyhow::anyhow!(
            "{} was created by another program while this server started: stop it first or \
             choose another {flag}",
            path.display()
        ),
        _ => anyhow::Error::new(e).context(format!("moving {what} to {}", path.display())),
    })?;
    let file = SocketFile {
        path: path.to_owned(),
        dev: stat.st_dev,
        ino: stat.st_ino,
    };
    Ok((listener, file))
}

/// Removes a socket file nothing listens on (a server that died), but not
/// a live server's socket nor anything that is not a socket.
fn remove_stale(path: &Path, flag: &str) -> Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("looking at {}", path.display())),
    };
    if !meta.file_type().is_socket() {
        bail!(
            "{} exists and is not a socket: remove it or choose another {flag}",
            path.display()
        );
    }
    // Only a refused connection proves nothing listens: a socket this
    // user may not connect to may well have a live server behind it.
    match UnixStream::connect(path) {
        Ok(_) => bail!(
            "{} is in use by a running server: stop it first or choose another {flag}",
            path.display()
        ),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
        Err(e) => {
            return Err(e).with_context(|| {
                format!(
                    "{} exists and cannot be probed for a running server: remove it if none \
                     runs, or choose another {flag}",
                    path.display()
                )
            })
        }
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing stale socket {}", path.display()))
        }
        _ => Ok(()),
    }
}

/// A folder only this process's user can enter, removed (with the socket
/// file, if it is still inside) when dropped.
struct PrivateDir {
    /// Its path, for `bind` when short enough.
    path: PathBuf,
    fd: OwnedFd,
}

impl PrivateDir {
    fn create(parent: &Path) -> io::Result<Self> {
        let pid = std::process::id();
        let mut last = io::Error::from(io::ErrorKind::AlreadyExists);
        // A crashed earlier start of the same pid may have left one.
        for n in 0..16 {
            let path = parent.join(format!(".vnvme-bind-{pid}-{n}"));
            match rustix::fs::mkdir(&path, Mode::RWXU) {
                Ok(()) => {}
                Err(rustix::io::Errno::EXIST) => {
                    last = io::Error::from(io::ErrorKind::AlreadyExists);
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
            let opened = rustix::fs::open(
                &path,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            );
            return match opened {
                Ok(fd) => Ok(Self { path, fd }),
                Err(e) => {
                    let _ = std::fs::remove_dir(&path);
                    Err(e.into())
                }
            };
        }
        Err(last)
    }

    /// Where to bind: the folder's path, or where that would not fit in a
    /// `sockaddr_un`, the same folder through `/proc/self/fd`.
    fn bind_path(&self) -> PathBuf {
        let direct = self.path.join(INNER);
        if direct.as_os_str().len() <= MAX_SOCKET_PATH {
            return direct;
        }
        let fd = rustix::fd::AsRawFd::as_raw_fd(&self.fd);
        PathBuf::from(format!("/proc/self/fd/{fd}/{INNER}"))
    }

    /// Moves the socket to `to`, failing if something is there.
    fn move_to(&self, to: &Path) -> io::Result<()> {
        match rustix::fs::renameat_with(&self.fd, INNER, CWD, to, RenameFlags::NOREPLACE) {
            Ok(()) => Ok(()),
            // A filesystem without RENAME_NOREPLACE: a plain rename (the
            // path was free a moment ago).
            Err(rustix::io::Errno::INVAL) if !to.exists() => {
                rustix::fs::renameat(&self.fd, INNER, CWD, to).map_err(Into::into)
            }
            Err(e) => Err(e.into()),
        }
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = rustix::fs::unlinkat(&self.fd, INNER, AtFlags::empty());
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// Why members of `access`'s group, or others, whom its mode lets connect,
/// still cannot reach `path`: the first folder above it they may not
/// search. `None` when they can, or when the mode lets in only the owner.
pub fn unreachable_by(path: &Path, access: &Access) -> Option<String> {
    let (who, need) = match &access.group {
        Some(g) if access.mode & 0o020 != 0 => {
            (format!("members of group {}", g.name), Some(g.gid))
        }
        _ if access.mode & 0o002 != 0 => ("other users".to_string(), None),
        _ => return None,
    };
    let dir = std::fs::canonicalize(path.parent()?).ok()?;
    for d in dir.ancestors() {
        let m = std::fs::metadata(d).ok()?;
        let searchable = m.mode() & 0o001 != 0
            || need.is_some_and(|gid| m.gid() == gid && m.mode() & 0o010 != 0);
        if !searchable {
            return Some(format!(
                "{who} cannot reach {}: folder {} ({}:{} mode {:03o}) does not let them search it",
                path.display(),
                d.display(),
                super::access::user_name(m.uid()),
                super::access::group_name(m.gid()),
                m.mode() & 0o7777
            ));
        }
    }
    None
}
