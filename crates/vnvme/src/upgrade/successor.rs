//! The new process's side: `vnvme serve ... --handover-fd N` takes what
//! the old process handed over, and reports on its status pipe whether it
//! is ready (or why not).

use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};

use anyhow::{bail, Context, Result};
use serde_json::json;
use vnvme_controller::SavedState;
use vnvme_device::{FunctionState, IrqFds};
use vnvme_vfio_user::handover::{claim_inherited, HandedMap};

use super::manifest::{self, now_ns, Manifest};

/// What the old process handed over, owned.
#[derive(Debug)]
pub struct Taken {
    pub listener: Option<UnixListener>,
    pub socket_owned: bool,
    pub control: Option<UnixListener>,
    pub metrics: Option<std::net::TcpListener>,
    pub qos: Option<crate::qos::HandedQos>,
    /// The socketpair to the supervisor (`--supervise`).
    pub supervisor: Option<OwnedFd>,
    /// The supervisor's pid, if this process is a supervised server's
    /// successor (see [`Manifest::supervisor_pid`]).
    pub supervisor_pid: Option<u32>,
    pub client: Option<TakenClient>,
    /// The supervisor's crash area (`--supervise`).
    pub crash: Option<TakenCrash>,
    /// A server of several controllers: each one's (see
    /// [`Manifest::controllers`]).
    pub controllers: Vec<TakenController>,
    /// The `ram` namespaces' memfds, by NSID ([`super::ram::adopt`]).
    pub ram: Vec<(u32, OwnedFd)>,
}

/// One controller of a server with several.
#[derive(Debug)]
pub struct TakenController {
    pub listener: UnixListener,
    pub socket_owned: bool,
    /// Its client (whose `state` is the controller's, as below).
    pub client: Option<TakenClient>,
    pub state: SavedState,
    /// A `[[controllers]]` controller's: its socket's path, control
    /// socket, `ram` memfds (by NSID) and limits (see
    /// [`HandedController`](super::manifest::HandedController)).
    pub socket: Option<std::path::PathBuf>,
    pub control: Option<UnixListener>,
    pub ram: Vec<(u32, OwnedFd)>,
    pub qos: Option<crate::qos::HandedQos>,
}

/// The crash area, and a dead child's client to restore from it.
#[derive(Debug)]
pub struct TakenCrash {
    pub area: OwnedFd,
    pub client: Option<CrashedFds>,
    /// The reply pipe's ends (read, write).
    pub replies: Option<(OwnedFd, OwnedFd)>,
    /// The serial of the client an upgrade handed over.
    pub serial: Option<u64>,
}

/// A dead child's client as the supervisor handed it: its fds.
#[derive(Debug)]
pub struct CrashedFds {
    pub conn: UnixStream,
    pub max_xfer: usize,
    pub serial: u64,
    /// The files behind the maps, by the supervisor's id.
    pub files: Vec<(u64, OwnedFd)>,
    pub irqs: IrqFds,
    pub doorbells: Option<OwnedFd>,
    /// The fds of the message the dead child marked last that carried
    /// some, and the id they were forwarded under.
    pub message: (u64, Vec<OwnedFd>),
}

/// The client, with everything needed to serve it again.
#[derive(Debug)]
pub struct TakenClient {
    pub conn: UnixStream,
    pub max_xfer: usize,
    pub maps: Vec<HandedMap>,
    pub files: Vec<OwnedFd>,
    pub irqs: IrqFds,
    pub doorbells: Option<OwnedFd>,
    pub function: FunctionState,
    pub state: SavedState,
}

/// The status pipe to the old process: one line, `ready` or why not. If
/// dropped unsent (an error on the way), it says the start failed.
#[derive(Debug)]
pub struct Reporter {
    pipe: Option<std::fs::File>,
    started_ns: u64,
}

impl Reporter {
    /// Tells the old process this one serves from now on.
    pub fn ready(&mut self) {
        let line = json!({"ok": true, "started_ns": self.started_ns, "ready_ns": now_ns()});
        self.send(&line);
    }

    /// Tells the old process why this one cannot take over.
    pub fn fail(&mut self, why: &anyhow::Error) {
        self.send(&json!({"ok": false, "error": format!("{why:#}")}));
    }

    fn send(&mut self, line: &serde_json::Value) {
        if let Some(mut pipe) = self.pipe.take() {
            let mut bytes = line.to_string().into_bytes();
            bytes.push(b'\n');
            // The old process may be gone (it gave up waiting): nothing to
            // tell then.
            let _ = pipe.write_all(&bytes);
        }
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        self.send(&json!({"ok": false, "error": "the new process stopped before it was ready"}));
    }
}

/// Takes the handover in fd `handover_fd`: reads and checks the manifest,
/// claims the fds it names (each must be open and of the kind it should
/// be), decodes the saved state. First thing in the process, before it
/// opens anything of its own.
pub fn take(handover_fd: i32) -> Result<(Taken, Reporter)> {
    let started_ns = now_ns();
    let fd = claim_inherited(&[handover_fd])
        .map_err(anyhow::Error::msg)
        .context("--handover-fd (an internal flag: a running vnvme serve passes it to the new process of an upgrade)")?
        .pop()
        .context("--handover-fd: no fd claimed")?;
    let (manifest, state) = manifest::read(fd).context("--handover-fd")?;
    let fds = manifest.fds();
    let mut owned = claim_inherited(&fds)
        .map_err(anyhow::Error::msg)
        .context("the fds the handover names")?
        .into_iter();
    let mut next = || {
        owned
            .next()
            .context("the handover names fewer fds than it has")
    };
    let mut reporter = Reporter {
        pipe: Some(std::fs::File::from(next()?)),
        started_ns,
    };
    let taken = take_rest(manifest, &state, &mut next);
    if let Err(e) = &taken {
        reporter.fail(e);
    }
    Ok((taken?, reporter))
}

/// The rest of [`take`], after the status pipe: its errors go there too.
fn take_rest(
    manifest: Manifest,
    state: &[u8],
    next: &mut impl FnMut() -> Result<OwnedFd>,
) -> Result<Taken> {
    let listener = UnixListener::from(expect_socket(next()?, "listening socket")?);
    let control = match manifest.control {
        Some(_) => Some(UnixListener::from(expect_socket(
            next()?,
            "control socket",
        )?)),
        None => None,
    };
    let metrics = match manifest.metrics {
        Some(_) => Some(std::net::TcpListener::from(expect_socket(
            next()?,
            "metrics socket",
        )?)),
        None => None,
    };
    let supervisor = match manifest.supervisor {
        Some(_) => Some(expect_socket(next()?, "supervisor socket")?),
        None => None,
    };
    let Manifest {
        socket_owned,
        qos,
        supervisor_pid,
        client,
        crash,
        controllers: handed_controllers,
        ram,
        ..
    } = manifest;
    let mut rest = state;
    let mut state_of = |len: u64| -> Result<SavedState> {
        let len = usize::try_from(len).context("the handover's state length")?;
        if len > rest.len() {
            bail!("the handover's states are longer than its bytes");
        }
        let (one, after) = rest.split_at(len);
        rest = after;
        SavedState::decode(one).context("the handover's saved state")
    };
    let client = match client {
        None => None,
        Some(c) => {
            let state = state_of(c.state_len)?;
            Some(take_client(c, state, next)?)
        }
    };
    let crash = match crash {
        None => None,
        Some(c) => {
            let area = next()?;
            let client = match c.client {
                None => None,
                Some(c) => {
                    let conn = UnixStream::from(expect_socket(next()?, "client connection")?);
                    if c.file_ids.len() != c.file_fds.len() {
                        bail!(
                            "the handover names {} file ids for {} files",
                            c.file_ids.len(),
                            c.file_fds.len()
                        );
                    }
                    let mut files = Vec::new();
                    for id in &c.file_ids {
                        files.push((*id, next()?));
                    }
                    let (vectors, intx) = take_irqs(&c.vector_fds, c.intx_fd, next)?;
                    let doorbells = match c.doorbell_fd {
                        Some(_) => Some(next()?),
                        None => None,
                    };
                    let message_fds = c
                        .message_fds
                        .iter()
                        .map(|_| next())
                        .collect::<Result<Vec<_>>>()?;
                    Some(CrashedFds {
                        conn,
                        max_xfer: c.max_xfer,
                        serial: c.serial,
                        files,
                        irqs: IrqFds { vectors, intx },
                        doorbells,
                        message: (c.message_fds_id, message_fds),
                    })
                }
            };
            let replies = match c.replies {
                Some(_) => Some((next()?, next()?)),
                None => None,
            };
            Some(TakenCrash {
                area,
                client,
                replies,
                serial: c.serial,
            })
        }
    };
    let mut controllers = Vec::new();
    for c in handed_controllers {
        let listener = UnixListener::from(expect_socket(next()?, "listening socket")?);
        let state = state_of(c.state_len)?;
        let client = match c.client {
            None => None,
            Some(client) => Some(take_client(client, state.clone(), next)?),
        };
        let control = match c.control {
            Some(_) => Some(UnixListener::from(expect_socket(
                next()?,
                "control socket",
            )?)),
            None => None,
        };
        // Checked when they are mapped (super::ram::adopt).
        let ram = (c.ram.iter())
            .map(|r| Ok((r.nsid, next()?)))
            .collect::<Result<Vec<_>>>()?;
        controllers.push(TakenController {
            listener,
            socket_owned: c.socket_owned,
            client,
            state,
            socket: c.socket,
            control,
            ram,
            qos: c.qos,
        });
    }
    // Checked when they are mapped (super::ram::adopt).
    let ram = ram
        .iter()
        .map(|r| Ok((r.nsid, next()?)))
        .collect::<Result<Vec<_>>>()?;
    Ok(Taken {
        controllers,
        listener: Some(listener),
        socket_owned,
        control,
        metrics,
        qos,
        supervisor,
        supervisor_pid,
        client,
        crash,
        ram,
    })
}

/// A client's fds, in the order [`Manifest::fds`] names them, with its
/// controller's `state`.
fn take_client(
    c: super::manifest::HandedClient,
    state: SavedState,
    next: &mut impl FnMut() -> Result<OwnedFd>,
) -> Result<TakenClient> {
    let conn = UnixStream::from(expect_socket(next()?, "client connection")?);
    let mut files = Vec::new();
    for _ in &c.file_fds {
        files.push(next()?);
    }
    let (vectors, intx) = take_irqs(&c.vector_fds, c.intx_fd, next)?;
    let doorbells = match c.doorbell_fd {
        Some(_) => Some(next()?),
        None => None,
    };
    Ok(TakenClient {
        conn,
        max_xfer: c.max_xfer,
        maps: c.maps,
        files,
        irqs: IrqFds { vectors, intx },
        doorbells,
        function: c.function,
        state: state.with_handed(c.commands),
    })
}

/// The interrupt eventfds a manifest names: per vector, then INTx's.
type Irqs = (Vec<Option<OwnedFd>>, Option<OwnedFd>);

fn take_irqs(
    vector_fds: &[Option<i32>],
    intx_fd: Option<i32>,
    next: &mut impl FnMut() -> Result<OwnedFd>,
) -> Result<Irqs> {
    let mut vectors = Vec::new();
    for v in vector_fds {
        vectors.push(match v {
            Some(_) => Some(expect_eventfd(next()?)?),
            None => None,
        });
    }
    let intx = match intx_fd {
        Some(_) => Some(expect_eventfd(next()?)?),
        None => None,
    };
    Ok((vectors, intx))
}

fn expect_socket(fd: OwnedFd, what: &str) -> Result<OwnedFd> {
    let st = rustix::fs::fstat(&fd).with_context(|| format!("the handed-over {what}"))?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::Socket {
        bail!("the handed-over {what} is not a socket");
    }
    Ok(fd)
}

fn expect_eventfd(fd: OwnedFd) -> Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .context("inspecting a handed-over interrupt fd")?;
    if link.as_os_str() != "anon_inode:[eventfd]" {
        bail!(
            "a handed-over interrupt fd is {}, not an eventfd",
            link.display()
        );
    }
    Ok(fd)
}
