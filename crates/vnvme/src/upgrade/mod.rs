//! Live upgrade of `vnvme serve` (issue 35 item 2; docs/upgrade.md): the
//! running server hands its client to a new process running a new binary,
//! and the guest sees a pause.
//!
//! Asked on the control socket (`vnvme ctl upgrade [--exe PATH]`) or with
//! [`SIGNAL`]. Between two vfio-user messages the server:
//!
//! 1. *drain*: stops the queue workers, letting the commands in flight on
//!    the backends complete, at most [`DRAIN_BOUND`]; a command that takes
//!    longer makes the upgrade refuse, and the server goes on (never
//!    handed over: run again while its first copy may still land, a write
//!    could overwrite data the guest wrote after seeing the second
//!    complete). Commands held back and not yet given to a backend (a QoS
//!    limit, a fault, a Preempt and Abort's fence) are handed to the new
//!    process, which holds them again;
//! 2. *save*: the controller's state (docs/state-format.md), the PCI
//!    function's (config space, MSI-X table) and the list of fds, written
//!    to a sealed memfd ([`manifest`]);
//! 3. *pass*: starts the new binary with the same arguments plus
//!    `--handover-fd N`, which inherits the fds: the client connection, the
//!    listening socket, the control and metrics sockets, the files behind the DMA maps,
//!    the interrupt eventfds, BAR0's doorbell memfd, the `ram` namespaces'
//!    memfds ([`ram`]); the `file` backends'
//!    locks are let go for it to open them;
//! 4. *restore*: the new process maps the guest memory again, restores the
//!    controller onto it, says it is ready on a pipe, and serves the
//!    connection from the next message on.
//!
//! The old process then exits without touching what the new one serves.
//! If the new process fails to start, refuses the state or says nothing
//! within [`HANDOVER_TIMEOUT`], the old one takes its locks back, resumes
//! its workers and reports why. The client keeps its connection: no
//! message is lost or left unanswered (the handover happens between
//! messages, after the requests already read are answered), and no reset.
//!
//! A server with several controllers (`--socket A --socket B`, one
//! subsystem) hands them all over at once ([`Several`]), and so does a
//! `[[controllers]]` server, every controller its own subsystem, their
//! clients on one connection thread ([`Many`]; a controller added to or
//! removed from its file since makes the new process refuse).

use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::{Context, Result};
use parking_lot::Mutex;
use serde_json::Value;

mod handoff;
pub mod manifest;
mod many;
pub mod ram;
mod several;
mod successor;

pub(crate) use handoff::{pass_copy, status_pipe, wait_ready};
pub use handoff::{OtherSockets, Upgrader};
pub use many::{Many, Member as ManyMember};
pub use several::{Door, Several};
pub use successor::{take, CrashedFds, Reporter, Taken, TakenClient, TakenController, TakenCrash};

/// Told of every change in the client's fds, between two messages: the
/// forwarder of a supervised server (`vnvme serve --supervise`), which
/// the [`Upgrader`] serving it calls.
pub trait ClientWatch: Send + Sync + std::fmt::Debug {
    fn changed(
        &self,
        device: &vnvme_device::NvmeDevice,
        change: vnvme_vfio_user::handover::ClientChange<'_>,
    );
    /// Between two messages: keeps the crash state (see
    /// [`Handover::checkpoint`](vnvme_vfio_user::handover::Handover::checkpoint)).
    fn checkpoint(&self, device: &vnvme_device::NvmeDevice);
    /// The message being handled (see
    /// [`Handover::handling`](vnvme_vfio_user::handover::Handover::handling)).
    fn handling(&self, msg: Option<vnvme_vfio_user::handover::Marked<'_>>);
    /// Where replies wait (see
    /// [`Handover::reply_pipe`](vnvme_vfio_user::handover::Handover::reply_pipe)).
    fn reply_pipe(&self) -> Option<std::sync::Arc<vnvme_vfio_user::ReplyPipe>>;
    /// A live upgrade paused the workers and saved `state`: keeps it in
    /// the crash area before the new process starts; `Err`: why not (the
    /// upgrade is refused then).
    fn keep_paused(
        &self,
        device: &vnvme_device::NvmeDevice,
        state: &vnvme_controller::SavedState,
    ) -> Result<(), String>;
    /// Adds to `manifest` what the new process of a supervised server
    /// serves on: the supervisor's socketpair, the crash area, the reply
    /// pipe and the supervisor's pid, each fd given to `pass`.
    fn hand_on(
        &self,
        manifest: &mut manifest::Manifest,
        pass: &mut dyn FnMut(BorrowedFd<'_>) -> Result<i32, String>,
    ) -> Result<(), String>;
    /// Tells the supervisor how the upgrade's new process is doing.
    fn successor(&self, event: SuccessorEvent<'_>);
}

/// What a supervised server tells its supervisor of an upgrade's new
/// process, which the supervisor adopts once the old one exits.
#[derive(Debug, Clone, Copy)]
pub enum SuccessorEvent<'a> {
    /// Started, with this pid; not ready yet.
    Started(u32),
    /// It failed and is gone: this process serves on.
    Failed,
    /// It is ready and serves from now on: this process exits next.
    TookOver { pid: u32, exe: &'a str },
}

/// The signal that asks `vnvme serve` for an upgrade to the binary it was
/// started as (its argv\[0\]): free in serve (SIGTERM and SIGINT stop it),
/// and what an init system's reload can send (systemd:
/// `ExecReload=kill -USR2 $MAINPID`).
pub const SIGNAL: i32 = signal_hook::consts::SIGUSR2;

/// Most time the queue workers get to complete the commands in flight on
/// a backend: well under a host's I/O timeout (Linux: 30 s), and long
/// enough for storage that is slow for a moment (it was 1 s).
pub const DRAIN_BOUND: Duration = Duration::from_secs(5);

/// Most time the new process gets to say it is ready.
pub const HANDOVER_TIMEOUT: Duration = Duration::from_secs(20);

/// Added to a gather's bound (several controllers meeting between their
/// clients' messages, `several.rs`) for the threads to wake and meet.
pub const GATHER_SLACK: Duration = Duration::from_secs(2);

/// How long `ask` waits for the outcome, for a server whose clients'
/// messages must be whole within `message_timeout`: the longest its
/// threads take to reach a point between two messages and meet, the drain,
/// the new process's start, and slack. Shorter, and the asker could hear
/// "no outcome" from an upgrade that then succeeds.
fn ask_timeout(message_timeout: Duration) -> Duration {
    message_timeout + GATHER_SLACK + DRAIN_BOUND + HANDOVER_TIMEOUT + Duration::from_secs(5)
}

/// What happened to a request, for its asker.
pub type Outcome = Result<Value, String>;

/// One upgrade request being served.
#[derive(Debug)]
struct Pending {
    /// The binary to start; `None`: this process's argv\[0\].
    exe: Option<PathBuf>,
    /// When it was asked (CLOCK_MONOTONIC, ns), for the total time.
    asked_ns: u64,
    /// Where its outcome goes (`None`: asked by the signal: logged).
    reply: Option<mpsc::SyncSender<Outcome>>,
    /// Told once the reply is written out, so the old process exits only
    /// then.
    written: Option<mpsc::Receiver<()>>,
}

/// Upgrade requests, from the control socket and the signal to the
/// thread serving the client. One at a time: another asked meanwhile is
/// refused at once.
#[derive(Debug)]
pub struct Requests {
    pending: Mutex<Option<Pending>>,
    signal: Arc<AtomicBool>,
    /// Readable once a request is made (a byte from [`SIGNAL`]'s handler
    /// or from [`ask`](Self::ask)): the server loop polls it with the
    /// client's socket, so it sees the request at once and not at its
    /// next stop poll (up to 100 ms later; most of the stall an upgrade
    /// caused in the guest when the client traps nothing).
    wake: UnixStream,
    /// The other end, which `ask` writes to.
    waker: UnixStream,
    /// More wakes' other ends ([`another_wake`](Self::another_wake)).
    more: Mutex<Vec<UnixStream>>,
    /// How long [`ask`](Self::ask) waits for the outcome.
    ask_timeout: Duration,
}

/// Sent by the control socket once the reply to an upgrade is written.
#[derive(Debug)]
pub struct Written(mpsc::SyncSender<()>);

impl Written {
    pub fn done(self) {
        let _ = self.0.send(());
    }
}

impl Requests {
    /// Requests with [`SIGNAL`] installed, for a server whose clients'
    /// messages must be whole within `message_timeout`.
    pub fn new(message_timeout: Duration) -> Result<Arc<Self>> {
        let signal = Arc::new(AtomicBool::new(false));
        let (wake, waker) = UnixStream::pair().context("creating the upgrade wake socket")?;
        wake.set_nonblocking(true)
            .context("creating the upgrade wake socket")?;
        waker
            .set_nonblocking(true)
            .context("creating the upgrade wake socket")?;
        // The flag first: the byte the pipe handler writes must find it set.
        signal_hook::flag::register(SIGNAL, Arc::clone(&signal))
            .context("installing the upgrade signal (SIGUSR2)")?;
        let signal_waker = waker
            .try_clone()
            .context("creating the upgrade wake socket")?;
        signal_hook::low_level::pipe::register(SIGNAL, signal_waker)
            .context("installing the upgrade signal (SIGUSR2)")?;
        Ok(Arc::new(Self {
            pending: Mutex::new(None),
            signal,
            wake,
            waker,
            more: Mutex::new(Vec::new()),
            ask_timeout: ask_timeout(message_timeout),
        }))
    }

    /// Whether an upgrade is asked for (and not yet answered).
    pub fn asked(&self) -> bool {
        self.signal.load(Ordering::Acquire) || self.pending.lock().is_some()
    }

    /// Asks for an upgrade to `exe` and waits for the outcome; with it, what
    /// to tell once the reply is written (on success the old process
    /// waits for that, briefly, before it exits).
    pub fn ask(&self, exe: Option<PathBuf>) -> (Outcome, Option<Written>) {
        let (reply, outcome) = mpsc::sync_channel(1);
        let (written_tx, written) = mpsc::sync_channel(1);
        {
            let mut pending = self.pending.lock();
            if pending.is_some() || self.signal.load(Ordering::Acquire) {
                return (
                    Err(
                        "an upgrade is already under way: wait for its outcome and ask again"
                            .into(),
                    ),
                    None,
                );
            }
            *pending = Some(Pending {
                exe,
                asked_ns: manifest::now_ns(),
                reply: Some(reply),
                written: Some(written),
            });
        }
        // A full socket (WouldBlock) already wakes the loop.
        let _ = (&self.waker).write(&[1]);
        for w in self.more.lock().iter() {
            let _ = (&*w).write(&[1]);
        }
        match outcome.recv_timeout(self.ask_timeout) {
            Ok(o) => (o, Some(Written(written_tx))),
            Err(_) => (
                Err(format!(
                    "no outcome within {:?}: the server did not reach a point between two \
                     messages (is its client thread stuck?)",
                    self.ask_timeout
                )),
                None,
            ),
        }
    }

    /// Another fd readable once a request is made, for one more thread
    /// serving a client (each controller of a server with several): the
    /// signal and [`ask`](Self::ask) write to it too.
    pub fn another_wake(&self) -> Result<UnixStream> {
        let (wake, waker) = UnixStream::pair().context("creating an upgrade wake socket")?;
        wake.set_nonblocking(true)
            .context("creating an upgrade wake socket")?;
        waker
            .set_nonblocking(true)
            .context("creating an upgrade wake socket")?;
        let signal_waker = waker
            .try_clone()
            .context("creating an upgrade wake socket")?;
        signal_hook::low_level::pipe::register(SIGNAL, signal_waker)
            .context("installing the upgrade signal (SIGUSR2)")?;
        self.more.lock().push(waker);
        Ok(wake)
    }

    /// A copy of the socket that wakes the client's thread: a crash
    /// record pokes it after an admin command, for a checkpoint.
    pub fn waker(&self) -> std::io::Result<UnixStream> {
        self.waker.try_clone()
    }

    /// The fd that is readable once a request is made (see the field).
    pub fn wake_fd(&self) -> BorrowedFd<'_> {
        self.wake.as_fd()
    }

    /// The request to serve now (a signal becomes one without a reply).
    pub(crate) fn current(&self) -> Option<(Option<PathBuf>, u64)> {
        let mut pending = self.pending.lock();
        if pending.is_none() && self.signal.swap(false, Ordering::AcqRel) {
            tracing::info!("upgrade asked by signal (SIGUSR2)");
            *pending = Some(Pending {
                exe: None,
                asked_ns: manifest::now_ns(),
                reply: None,
                written: None,
            });
        }
        pending.as_ref().map(|p| (p.exe.clone(), p.asked_ns))
    }

    /// Answers the current request with `outcome`; on success waits (at
    /// most a second) until the asker's reply is written out.
    pub(crate) fn answer(&self, outcome: Outcome) {
        self.signal.store(false, Ordering::Release);
        let Some(p) = self.pending.lock().take() else {
            return;
        };
        match (&outcome, p.reply) {
            (_, Some(reply)) => {
                let ok = outcome.is_ok();
                if reply.send(outcome).is_ok() && ok {
                    if let Some(w) = p.written {
                        let _ = w.recv_timeout(Duration::from_secs(1));
                    }
                }
            }
            (Ok(report), None) => tracing::info!("upgraded: {report}"),
            (Err(why), None) => tracing::warn!("upgrade refused: {why}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_asker_waits_longer_than_the_slowest_upgrade_that_succeeds() {
        for secs in [1, 5, 60] {
            let message_timeout = Duration::from_secs(secs);
            // Several controllers: the gather's bound (several.rs), then
            // the new process's start.
            let slowest = message_timeout + DRAIN_BOUND + GATHER_SLACK + HANDOVER_TIMEOUT;
            assert!(ask_timeout(message_timeout) > slowest, "{secs} s");
        }
    }
}
