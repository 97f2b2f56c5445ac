//! `vnvme serve --supervise` (issue 35 item 3, crash recovery; stage 1):
//! a small supervisor that never touches a guest command keeps what a
//! crashed server's successor would need, and starts a new server when the
//! one serving dies.
//!
//! The supervisor binds the sockets (the vfio-user socket, `--control`,
//! `--metrics`) and starts the server as its child the way a live upgrade
//! starts a new process (`--handover-fd`, [`crate::upgrade`]), with one end
//! of a `SOCK_SEQPACKET` socketpair. The child forwards on it, with
//! SCM_RIGHTS, every fd a successor needs as it gets it ([`Forwarder`],
//! `notes`): the client's connection once it negotiated, BAR0's doorbell
//! memfd, one fd per file behind the DMA maps (dropped when the last map in
//! it goes), the interrupt eventfds at each SET_IRQS; and says when the
//! client went. The supervisor keeps them in a `table`.
//!
//! The supervisor also makes the crash area ([`crash_area`]) every child
//! shares, where the child keeps the client's state as it changes
//! ([`keeper`]), and the pipe its replies wait in until the message they
//! answer is kept (`vnvme_vfio_user::ReplyPipe`), so a reply is never both
//! sent and owed. When the child dies (SIGKILL, a panic, an abort: any exit
//! but a clean one), the supervisor logs it with what it held and starts a
//! new child with the client's fds, which restores the client from the
//! area ([`restore`]) and serves it on the same connection; if it cannot
//! (commands in flight, no whole slot, the child died handling a message),
//! the supervisor closes the client's connection, saying why, and the new
//! child serves the next connection. A child that fails before
//! it is ready [`MAX_FAILED_STARTS`] times in a row ends the supervisor
//! with the last reason. SIGTERM or SIGINT to the supervisor is passed to
//! the child, and both stop; a child that stops cleanly by itself (the
//! control socket's `shutdown`) ends the supervisor too.
//!
//! A live upgrade (`vnvme ctl upgrade`, or SIGUSR2 to the supervisor,
//! passed to the child) is the child's, as unsupervised: it starts the new
//! process, which the supervisor (a child subreaper) adopts and watches
//! once the old one exits (`watch.rs`).

use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::{ServeOptions, DEFAULT_SOCKET};
use crate::socket::Plan;
use crate::stopping::Stop;
use crate::upgrade::manifest::{
    self, now_ns, CrashedClient, HandedCrash, HandedRam, HandedSocket, Manifest,
};
use crate::upgrade::{pass_copy, status_pipe};

pub mod crash_area;
mod forward;
pub mod keeper;
mod notes;
pub mod parent;
pub mod restore;
mod table;
mod watch;
pub mod zone_room;

use crash_area::CrashArea;
pub use forward::Forwarder;
pub use keeper::Keeper;
use table::Table;

/// Starts in a row that may fail (the child exits or refuses before it is
/// ready) before the supervisor gives up.
pub const MAX_FAILED_STARTS: u32 = 3;

/// A server that dies sooner than this after its start is started again
/// only after this long.
const CRASH_LOOP: Duration = Duration::from_secs(1);

/// How often the supervisor looks at its stop flag while it waits.
const POLL: Duration = Duration::from_millis(100);

/// How the watch of one child ended.
pub(super) enum Ended {
    /// Asked to stop (signal), and the child is gone with this status.
    Stopped(ExitStatus),
    /// The child exited by itself with this status.
    Exited(ExitStatus),
}

/// Runs `vnvme serve --supervise`.
pub fn run(mut opts: ServeOptions) -> Result<()> {
    // First, while the process has one thread: taking the passed socket
    // removes LISTEN_* from the environment.
    let inherited = vnvme_vfio_user::activation::take_listener()
        .context("taking the socket passed by the launcher (socket activation)")?;
    if let Some(path) = &opts.config {
        match crate::config::ServeFile::load(path)? {
            crate::config::ServeFile::One(file) => {
                opts.socket_mode = opts.socket_mode.or(file.socket_mode);
                opts.socket_group = opts.socket_group.take().or(file.socket_group.clone());
                opts.stop_timeout = opts.stop_timeout.or(file.stop_timeout);
                if opts.socket.is_empty() {
                    opts.socket = file.sockets.clone();
                }
            }
            crate::config::ServeFile::Many { .. } => {
                bail!("--supervise serves one controller: a [[controllers]] configuration is not supported")
            }
        }
    }
    if opts.socket.len() > 1 {
        bail!("--supervise serves one controller: give --socket once");
    }
    let stop_timeout = opts.stop_timeout.unwrap_or(super::STOP_TIMEOUT);
    let plan = Plan::new(
        inherited,
        opts.socket.first().map(PathBuf::as_path),
        Path::new(DEFAULT_SOCKET),
        opts.socket_mode,
        opts.socket_group.as_deref(),
    )?;
    let metrics = opts
        .metrics
        .map(crate::metrics::http::MetricsServer::bind)
        .transpose()?;
    let stop = Stop::new()?;
    stop.on_signals()?;
    // SIGUSR2 (what `systemctl reload` sends the main process) is passed
    // to the server as an upgrade request.
    let upgrade = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(crate::upgrade::SIGNAL, Arc::clone(&upgrade))
        .context("installing the upgrade signal (SIGUSR2)")?;
    // An upgrade's new process is started by the server: it becomes the
    // supervisor's child when the server exits (watch.rs).
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .context("becoming a child subreaper (prctl)")?;
    // Dropped (their files removed) when the supervisor returns.
    let listening = plan.listen()?;
    let control = match &opts.control {
        Some(path) => Some(crate::control::bind(path, opts.control_mode)?),
        None => None,
    };
    let sockets = Sockets {
        listener: listening.listener().as_fd(),
        control: control.as_ref().map(|(l, _)| l.as_fd()),
        metrics: metrics.as_ref().map(|l| l.as_fd()),
    };
    let mut argv = std::env::args_os();
    let mut program = argv.next().unwrap_or_else(|| "vnvme".into());
    let args: Vec<OsString> = argv.collect();
    // A stop asked while a child starts (up to the upgrade's 20 s) is
    // passed to it at once: the watch below passes it on only later.
    let starting = Arc::new(AtomicI32::new(0));
    {
        let (stop, starting) = (stop.clone(), Arc::clone(&starting));
        std::thread::Builder::new()
            .name("vnvme-supervise-stop".into())
            .spawn(move || {
                stop.wait();
                if let Some(pid) = rustix::process::Pid::from_raw(starting.swap(0, SeqCst)) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
                }
            })
            .context("starting the supervisor's stop thread")?;
    }
    let area_fd = crash_area::create().context("making the crash area (memfd)")?;
    let area = CrashArea::open(area_fd.as_fd()).context("the crash area")?;
    let replies = vnvme_vfio_user::ReplyPipe::create().context("making the reply pipe")?;
    let mut table = Table::default();
    let mut failed = 0;
    let mut told_ready = false;
    // The next child restores the client in `table`.
    let mut restore = false;
    // Restored children in a row that died within CRASH_LOOP.
    let mut quick_restores = 0;
    loop {
        if stop.asked() {
            return Ok(());
        }
        let handed = Handed {
            sockets: &sockets,
            area: area_fd.as_fd(),
            replies: (replies.0.as_fd(), replies.1.as_fd()),
            memories: &table,
            client: restore.then_some(&table),
        };
        let started = start(&program, &args, &handed, &starting);
        if stop.asked() && started.is_err() {
            return Ok(());
        }
        let (child, ours, term_sent) = match started {
            Ok(c) => c,
            Err(why) if restore => {
                tracing::error!(
                    "the server restoring the client failed ({why}): the client's connection \
                     is closed; starting a new server for the next client"
                );
                restore = false;
                table.clear();
                continue;
            }
            Err(why) => {
                failed += 1;
                if failed >= MAX_FAILED_STARTS {
                    bail!("the server failed to start {failed} times in a row; the last: {why}");
                }
                tracing::error!("the server failed to start ({why}); starting it again");
                std::thread::sleep(POLL);
                continue;
            }
        };
        failed = 0;
        let pid = child.id();
        tracing::info!("supervising the server, pid {pid}");
        if !told_ready {
            crate::notify::ready();
            told_ready = true;
        }
        // Watched by pid from now on (reaped there): an upgrade replaces it
        // by a process that is no `Child` of ours.
        drop(child);
        let mut w = watch::Watch {
            ours: &ours,
            table: &mut table,
            stop: &stop,
            stop_timeout,
            upgrade: &upgrade,
            program: &mut program,
        };
        let pid = rustix::process::Pid::from_raw(pid as i32).context("the server's pid")?;
        let watched = watch::watch(&mut w, pid, term_sent)?;
        let (pid, ready_at) = (watched.pid, watched.since);
        // A restored server that upgraded is not counted as a restore.
        restore &= !watched.upgraded;
        match watched.ended {
            Ended::Stopped(status) | Ended::Exited(status) if status.success() => {
                tracing::info!("the server (pid {pid}) stopped; the supervisor stops");
                return Ok(());
            }
            Ended::Stopped(status) => bail!("the server (pid {pid}) stopped with {status}"),
            Ended::Exited(status) => {
                // A server that dies as soon as it serves (on every
                // client, say) is not started again in a tight loop.
                let quick = ready_at.elapsed() < CRASH_LOOP;
                let pause = quick.then_some(CRASH_LOOP);
                quick_restores = if restore && quick {
                    quick_restores + 1
                } else {
                    0
                };
                let verdict = match restorable(&area, &table) {
                    Err(why) => Err(why),
                    Ok(_) if quick_restores >= MAX_FAILED_STARTS => Err(format!(
                        "{quick_restores} servers restoring it in a row died within \
                         {CRASH_LOOP:?}"
                    )),
                    Ok(seq) => Ok(seq),
                };
                restore = verdict.is_ok();
                let next = match &verdict {
                    Ok(seq) => format!(
                        "starting a new server that serves the client on its connection (the \
                         crash area's slot {seq})"
                    ),
                    Err(why) => format!(
                        "the client cannot be restored ({why}): its connection is closed; \
                         starting a new server for the next client"
                    ),
                };
                tracing::error!(
                    "the server (pid {pid}) died ({status}) holding {}: {next}{}",
                    table.summary(),
                    pause.map_or(String::new(), |p| format!(
                        " in {p:?} (it died within {p:?} of its start)"
                    ))
                );
                if !restore {
                    table.clear();
                    quick_restores = 0;
                }
                if let Some(p) = pause {
                    let until = Instant::now() + p;
                    while !stop.asked() && Instant::now() < until {
                        std::thread::sleep(POLL);
                    }
                }
            }
        }
    }
}

/// What every child is handed.
struct Sockets<'a> {
    listener: BorrowedFd<'a>,
    control: Option<BorrowedFd<'a>>,
    metrics: Option<BorrowedFd<'a>>,
}

/// What one child is handed: the sockets, the crash area and the reply
/// pipe, the `ram` namespaces' memfds (in `memories`, the table), and the
/// client a dead child served, to restore.
struct Handed<'a> {
    sockets: &'a Sockets<'a>,
    area: BorrowedFd<'a>,
    /// Its read and write ends.
    replies: (BorrowedFd<'a>, BorrowedFd<'a>),
    memories: &'a Table,
    client: Option<&'a Table>,
}

/// Whether the client in `table` can be restored from `area`: the slot
/// the next child will read, or why not. The child checks the rest (the
/// slot is this client's, its state decodes and fits).
fn restorable(area: &CrashArea, table: &Table) -> Result<u64, String> {
    if table.conn.is_none() {
        return Err("no client was connected".into());
    }
    if let Some((msg_id, command)) = area.handling() {
        let held = (table.message.as_ref()).map_or((0, 0), |(id, _, fds)| (*id, fds.len()));
        restore::redo_fds(area.redo().as_ref(), held).map_err(|why| {
            format!(
                "the server died handling vfio-user message {msg_id} (command {command}), {why}"
            )
        })?;
    }
    let seq = area
        .newest()
        .map(|(seq, _)| seq)
        .map_err(|e| format!("the crash state is refused: {e}"))?;
    Ok(seq)
}

/// Starts a child and waits until it is ready: the child, the
/// supervisor's end of its socketpair and whether the stop thread already
/// sent it SIGTERM; or why not (the child is gone then). `starting` holds
/// its pid meanwhile.
fn start(
    program: &OsString,
    args: &[OsString],
    handed: &Handed<'_>,
    starting: &AtomicI32,
) -> Result<(Child, OwnedFd, bool), String> {
    let s = handed.sockets;
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let (ours, theirs) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| format!("making the supervisor's socketpair: {e}"))?;
    // Copies without close-on-exec: the child inherits them at the same
    // numbers. Ours are closed once it has started.
    let mut passed: Vec<OwnedFd> = Vec::new();
    let (status_rx, status_fd) = status_pipe(&mut passed)?;
    let mut pass = |fd: BorrowedFd<'_>| pass_copy(&mut passed, fd);
    let mut ram = Vec::new();
    for (nsid, fd) in &handed.memories.ram {
        ram.push(HandedRam {
            nsid: *nsid,
            fd: pass(fd.as_fd())?,
        });
    }
    let manifest = Manifest {
        ram,
        status_fd,
        listener_fd: pass(s.listener)?,
        // The supervisor's: it removes the file when it stops.
        socket_owned: false,
        control: s
            .control
            .map(&mut pass)
            .transpose()?
            .map(|fd| HandedSocket { fd }),
        metrics: s
            .metrics
            .map(&mut pass)
            .transpose()?
            .map(|fd| HandedSocket { fd }),
        qos: None,
        supervisor: Some(HandedSocket {
            fd: pass(theirs.as_fd())?,
        }),
        supervisor_pid: None,
        client: None,
        crash: Some(HandedCrash {
            fd: pass(handed.area)?,
            client: handed.client.map(|t| crashed(t, &mut pass)).transpose()?,
            replies: Some([pass(handed.replies.0)?, pass(handed.replies.1)?]),
            serial: None,
        }),
        spawned_ns: now_ns(),
        controllers: Vec::new(),
    };
    drop(theirs);
    let handover =
        manifest::write(&manifest, &[]).map_err(|e| format!("writing the handover memfd: {e}"))?;
    let handover_fd = pass(handover.as_fd())?;
    drop(handover);
    // The supervisor alone talks to the service manager: the server's
    // upgrades must not name their new process the main one.
    let child = Command::new(program)
        .env_remove(crate::notify::SOCKET_VAR)
        .args(args)
        .arg("--handover-fd")
        .arg(handover_fd.to_string())
        .spawn();
    drop(passed);
    let mut child = child.map_err(|e| format!("starting {}: {e}", Path::new(program).display()))?;
    starting.store(child.id() as i32, SeqCst);
    let ready = crate::upgrade::wait_ready(&status_rx, &mut child);
    // Taken back: 0 means the stop thread took it and signalled the child.
    let term_sent = starting.swap(0, SeqCst) == 0;
    match ready {
        Ok(_) => Ok((child, ours, term_sent)),
        Err(why) => {
            let _ = child.kill();
            let status = child.wait();
            let status = status.map_or_else(|e| format!("unknown ({e})"), |s| s.to_string());
            Err(format!("it {why}; it is gone ({status})"))
        }
    }
}

/// The client in `t` for a manifest, its fds passed with `pass`.
fn crashed(
    t: &Table,
    pass: &mut impl FnMut(BorrowedFd<'_>) -> Result<i32, String>,
) -> Result<CrashedClient, String> {
    let (conn, max_xfer) = t.conn.as_ref().ok_or("no client was connected")?;
    let mut file_ids = Vec::new();
    let mut file_fds = Vec::new();
    for (id, fd) in &t.files {
        file_ids.push(*id);
        file_fds.push(pass(fd.as_fd())?);
    }
    let count = t.vectors.keys().next_back().map_or(0, |&i| i + 1);
    let mut vector_fds = vec![None; count];
    for (i, fd) in &t.vectors {
        if let Some(slot) = vector_fds.get_mut(*i) {
            *slot = Some(pass(fd.as_fd())?);
        }
    }
    Ok(CrashedClient {
        conn_fd: pass(conn.as_fd())?,
        max_xfer: *max_xfer,
        serial: t.serial,
        file_ids,
        file_fds,
        vector_fds,
        intx_fd: t.intx.as_ref().map(|fd| pass(fd.as_fd())).transpose()?,
        doorbell_fd: t
            .doorbells
            .as_ref()
            .map(|fd| pass(fd.as_fd()))
            .transpose()?,
        message_fds_id: t.message.as_ref().map_or(0, |(id, ..)| *id),
        message_fds: (t.message.iter())
            .flat_map(|(_, _, fds)| fds)
            .map(|fd| pass(fd.as_fd()))
            .collect::<Result<_, _>>()?,
    })
}
