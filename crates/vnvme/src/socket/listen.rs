//! Where `vnvme serve` listens: a socket it binds itself, or the one a
//! launcher passed (socket activation).

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use vnvme_vfio_user::activation::Activated;

use super::access::{resolve_group, Access};
use super::bind::{bind, unreachable_by, SocketFile};

/// How the vfio-user socket is to be had, checked before anything starts.
#[derive(Debug)]
pub enum Plan {
    Bind { path: PathBuf, access: Access },
    Inherit(Activated),
}

impl Plan {
    /// The plan for `socket` (`default` if none), `mode` and `group`, or
    /// for the socket a launcher passed: then the unit decides who may
    /// connect, and a mode or group given as well is an error (it would
    /// not be applied).
    pub fn new(
        inherited: Option<Activated>,
        socket: Option<&Path>,
        default: &Path,
        mode: Option<u32>,
        group: Option<&str>,
    ) -> Result<Self> {
        let Some(activated) = inherited else {
            let group = group
                .map(resolve_group)
                .transpose()
                .map_err(anyhow::Error::msg)?;
            return Ok(Plan::Bind {
                path: socket.unwrap_or(default).to_owned(),
                access: Access::new(mode, group),
            });
        };
        if mode.is_some() || group.is_some() {
            bail!(
                "the socket was passed by a launcher (LISTEN_FDS, socket activation): its mode and \
                 group are the unit's (SocketMode=, SocketGroup= in the .socket unit); remove \
                 --socket-mode/--socket-group (socket_mode/socket_group in the configuration)"
            );
        }
        if let Some(given) = socket {
            if activated.path.as_deref() != Some(given) {
                bail!(
                    "--socket {} but the socket passed by the launcher (LISTEN_FDS) is {}: give \
                     the .socket unit's ListenStream= path, or leave --socket out",
                    given.display(),
                    activated
                        .path
                        .as_deref()
                        .map_or("unnamed".into(), |p| p.display().to_string())
                );
            }
        }
        Ok(Plan::Inherit(activated))
    }

    /// The socket's path: the one to bind, or the passed one's if named.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Plan::Bind { path, .. } => Some(path),
            Plan::Inherit(a) => a.path.as_deref(),
        }
    }

    /// Binds the socket, or takes the passed one.
    pub fn listen(self) -> Result<Listening> {
        match self {
            Plan::Bind { path, access } => {
                let (listener, file) = bind(&path, &access, "--socket", "vfio-user socket")?;
                if let Some(why) = unreachable_by(&path, &access) {
                    tracing::warn!("{why}");
                }
                tracing::info!(
                    "vfio-user socket {} made with mode {:03o}{}",
                    path.display(),
                    access.mode,
                    access
                        .group
                        .as_ref()
                        .map_or(String::new(), |g| format!(", group {}", g.name))
                );
                Ok(Listening::Bound { listener, file })
            }
            Plan::Inherit(a) => {
                tracing::info!("serving the socket passed by the launcher (LISTEN_FDS)");
                Ok(Listening::Inherited {
                    listener: a.listener,
                    path: a.path,
                })
            }
        }
    }
}

/// The listening vfio-user socket. Dropping it removes the socket file if
/// this process made it; a passed socket is the launcher's, and stays for
/// the next start.
#[derive(Debug)]
pub enum Listening {
    /// Made by this process: removed at exit.
    Bound {
        listener: UnixListener,
        file: SocketFile,
    },
    /// Passed by a launcher, which owns the file: left in place.
    Inherited {
        listener: UnixListener,
        path: Option<PathBuf>,
    },
}

impl Listening {
    pub fn listener(&self) -> &UnixListener {
        match self {
            Listening::Bound { listener, .. } | Listening::Inherited { listener, .. } => listener,
        }
    }

    /// The socket's path, if it has one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Listening::Bound { file, .. } => Some(file.path()),
            Listening::Inherited { path, .. } => path.as_deref(),
        }
    }

    /// The file to remove at exit: only one this process made.
    pub fn own_file(&self) -> Option<SocketFile> {
        match self {
            Listening::Bound { file, .. } => Some(file.clone()),
            Listening::Inherited { .. } => None,
        }
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        if let Listening::Bound { file, .. } = self {
            file.remove();
        }
    }
}
