//! The supervisor's watch of the server serving now: keeps the table of
//! the client's fds as its notes say, passes a stop and an upgrade signal
//! on, and follows a live upgrade to the new process.
//!
//! A live upgrade under `--supervise` runs in the server as any other
//! ([`crate::upgrade`]): the server starts the new process itself, handing
//! it the supervisor's socketpair, the crash area and the reply pipe
//! besides the client. It says so on the socketpair: the new process's pid
//! once started ([`Note::Successor`]), then that it failed
//! ([`Note::SuccessorFailed`]: the server serves on) or took over
//! ([`Note::HandedOver`]: the server exits next). The supervisor is a child
//! subreaper, so the new process becomes its child when the old one exits;
//! the watch then goes on with it, and a crash of it later is recovered as
//! any other. A server that dies while its new process starts takes the
//! new process with it (SIGKILL, before anything else is started): two
//! processes must never serve the client at once.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rustix::process::{Pid, PidfdFlags, Signal, WaitOptions};

use super::notes::{self, Note, Received};
use super::table::Table;
use super::{Ended, POLL};
use crate::stopping::Stop;

/// What the watch works with.
pub(super) struct Watch<'a> {
    /// The supervisor's end of the socketpair.
    pub ours: &'a OwnedFd,
    pub table: &'a mut Table,
    pub stop: &'a Stop,
    pub stop_timeout: Duration,
    /// Set by SIGUSR2 to the supervisor: passed to the server.
    pub upgrade: &'a AtomicBool,
    /// The binary the next server is started as: an upgrade's new one
    /// from then on.
    pub program: &'a mut OsString,
}

/// How the watch ended: the last server watched, since when it served,
/// and how it ended.
pub(super) struct Watched {
    pub pid: Pid,
    pub since: Instant,
    /// It took over from the server first watched by an upgrade.
    pub upgraded: bool,
    pub ended: Ended,
}

/// An upgrade under way in the server watched.
#[derive(Default)]
struct Upgrade {
    /// Its new process, not ready yet.
    starting: Option<(Pid, Option<OwnedFd>)>,
    /// The new process that took over, and its binary.
    took_over: Option<(Pid, String)>,
}

/// A server, by pid and pidfd.
struct Server {
    pid: Pid,
    pidfd: OwnedFd,
}

impl Server {
    fn open(pid: Pid) -> Result<Self> {
        let pidfd = rustix::process::pidfd_open(pid, PidfdFlags::empty())
            .context("watching the server (pidfd_open)")?;
        Ok(Self { pid, pidfd })
    }

    fn signal(&self, sig: Signal) {
        let _ = rustix::process::pidfd_send_signal(&self.pidfd, sig);
    }

    /// Its exit status once it exited (reaped then). Reaps any other
    /// child that exited too: as a subreaper the supervisor adopts every
    /// orphan below it (a new binary's own children, left when it was
    /// killed as it started), which nobody else would reap.
    fn exited(&self) -> Result<Option<ExitStatus>> {
        loop {
            let got = match rustix::process::waitpid(None, WaitOptions::NOHANG) {
                Ok(got) => got,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e).context("waiting for the server"),
            };
            match got {
                None => return Ok(None),
                Some((pid, status)) if pid == self.pid => {
                    return Ok(Some(ExitStatus::from_raw(status.as_raw())))
                }
                Some((pid, status)) => tracing::debug!(
                    "reaped pid {pid:?}, an orphan the supervisor adopted ({})",
                    ExitStatus::from_raw(status.as_raw())
                ),
            }
        }
    }
}

/// Keeps `w.table` as the server's notes say until the server exits
/// (following an upgrade to its new process) or a stop is asked (then
/// passed on to the server, unless `term_sent` says it was already; it
/// gets `w.stop_timeout` and two seconds more before it is killed).
pub(super) fn watch(w: &mut Watch<'_>, pid: Pid, term_sent: bool) -> Result<Watched> {
    let mut server = Server::open(pid)?;
    let mut since = Instant::now();
    let mut upgraded = false;
    // A second SIGTERM would make the server exit at once, without its
    // clean stop: one only.
    let mut stopping: Option<Instant> = term_sent.then(Instant::now);
    let mut reading = true;
    let mut up = Upgrade::default();
    loop {
        if let Some(status) = server.exited()? {
            // Notes sent just before the end still count (an upgrade's
            // new process keeps the socket open: read until empty).
            while reading {
                match read_notes(w.ours, w.table, &mut up) {
                    Reading::More => {}
                    Reading::Emptied => break,
                    Reading::Closed => reading = false,
                }
            }
            if let Some((next, exe)) = up.took_over.take() {
                tracing::info!(
                    "the server (pid {}) handed over to a new process running {exe} and exited \
                     ({status}): supervising the server, pid {next}",
                    server.pid
                );
                let fd = up
                    .starting
                    .take()
                    .and_then(|(p, fd)| fd.filter(|_| p == next));
                server = match fd {
                    Some(pidfd) => Server { pid: next, pidfd },
                    None => Server::open(next)?,
                };
                *w.program = exe.into();
                since = Instant::now();
                upgraded = true;
                up = Upgrade::default();
                if stopping.is_some() {
                    // The stop went to the old one, which handed over
                    // first: the new one gets it.
                    server.signal(Signal::TERM);
                    stopping = Some(Instant::now());
                }
                continue;
            }
            if let Some((next, fd)) = up.starting.take() {
                // Adopted now that its parent is gone, and killed before
                // a server is started to restore the client.
                if let Some(fd) = &fd {
                    let _ = rustix::process::pidfd_send_signal(fd, Signal::KILL);
                }
                let _ = rustix::process::waitpid(Some(next), WaitOptions::empty());
                tracing::error!(
                    "the server (pid {}) died ({status}) while its upgrade's new process (pid \
                     {next}) started: the new process is killed",
                    server.pid
                );
            }
            let ended = match stopping {
                Some(_) => Ended::Stopped(status),
                None => Ended::Exited(status),
            };
            return Ok(Watched {
                pid: server.pid,
                since,
                upgraded,
                ended,
            });
        }
        if w.stop.asked() {
            match stopping {
                None => {
                    server.signal(Signal::TERM);
                    stopping = Some(Instant::now());
                }
                Some(at) if at.elapsed() > w.stop_timeout + Duration::from_secs(2) => {
                    tracing::error!(
                        "the server (pid {}) did not stop within {:?}: killing it",
                        server.pid,
                        w.stop_timeout
                    );
                    server.signal(Signal::KILL);
                }
                Some(_) => {}
            }
        }
        if w.upgrade.swap(false, Ordering::AcqRel) {
            match &up.starting {
                Some((next, _)) => tracing::warn!(
                    "SIGUSR2: an upgrade is under way (its new process, pid {next}, is \
                     starting): this one is dropped; send it again after"
                ),
                None => {
                    tracing::info!("SIGUSR2: asking the server (pid {}) to upgrade", server.pid);
                    server.signal(Signal::USR2);
                }
            }
        }
        let mut fds = vec![rustix::event::PollFd::new(
            &server.pidfd,
            rustix::event::PollFlags::IN,
        )];
        if reading {
            fds.push(rustix::event::PollFd::new(
                w.ours,
                rustix::event::PollFlags::IN,
            ));
        }
        let wait = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: i64::from(POLL.subsec_nanos()),
        };
        match rustix::event::poll(&mut fds, Some(&wait)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e).context("waiting for the server"),
        }
        let readable = fds.get(1).is_some_and(|f| !f.revents().is_empty());
        if readable {
            reading = !matches!(read_notes(w.ours, w.table, &mut up), Reading::Closed);
        }
    }
}

/// What [`read_notes`] left.
enum Reading {
    /// Nothing to read now.
    Emptied,
    /// Notes still waiting (it reads a bounded number at a time).
    More,
    /// The server's end is closed (by every process that had it).
    Closed,
}

/// Reads the notes waiting.
fn read_notes(ours: &OwnedFd, table: &mut Table, up: &mut Upgrade) -> Reading {
    // Bounded, so a server sending without end cannot keep the supervisor
    // from looking at its stop flag.
    for _ in 0..1024 {
        match notes::recv(ours) {
            Ok(Received::Note(note, fd)) => upgrade_note(note, fd, table, up),
            Ok(Received::Bad(why)) => tracing::warn!("the server sent {why}"),
            Ok(Received::Empty) => return Reading::Emptied,
            Ok(Received::Closed) => return Reading::Closed,
            Err(e) => {
                tracing::warn!("reading the server's notes: {e}");
                return Reading::Closed;
            }
        }
    }
    Reading::More
}

/// Applies one note: an upgrade's to `up`, the others to `table`.
fn upgrade_note(note: Note, fd: Option<OwnedFd>, table: &mut Table, up: &mut Upgrade) {
    let pid = |raw: u32| Pid::from_raw(raw as i32);
    match note {
        Note::Successor { pid: raw } => match pid(raw) {
            Some(p) => {
                tracing::info!("the server is upgrading: its new process, pid {raw}, starts");
                // Opened now, while it is surely the new process: a kill
                // through it never reaches another that took the pid.
                let fd = rustix::process::pidfd_open(p, PidfdFlags::empty()).ok();
                up.starting = Some((p, fd));
            }
            None => tracing::warn!("the server sent an upgrade's new process with pid {raw}"),
        },
        Note::SuccessorFailed => {
            tracing::info!("the server's upgrade failed: it serves on");
            up.starting = None;
        }
        Note::HandedOver { pid: raw, exe } => match pid(raw) {
            Some(p) => up.took_over = Some((p, exe)),
            None => tracing::warn!("the server handed over to pid {raw}, which is not one"),
        },
        note => {
            if let Err(why) = table.apply(note, fd) {
                tracing::warn!("the server sent a note that does not fit: {why}");
            }
        }
    }
}
