//! A live upgrade of a server with several controllers (`vnvme serve
//! --socket A --socket B ...`: one subsystem). Each controller's client has
//! its own thread, which reaches a point between two messages on its own
//! time; the handover must take them all at once, since they share the
//! namespaces, reservations and ANA states.
//!
//! So each controller's thread has a [`Member`] as its [`Handover`]: asked,
//! it pauses its controller's workers (bounded drain) and hands its client's
//! parts in, then waits. The thread that hands in last saves every
//! controller's state (all paused now: the subsystem's shared parts agree
//! in every state), starts the new process with every client's fds and
//! every listening socket, and on success exits the process. A controller
//! without a client hands in just its listening socket. If some thread does
//! not hand in within [`Several::bound`] (a client that half-sent a message
//! is read until the message timeout drops it, then its thread hands in
//! without it), the upgrade is refused, naming the controllers that did
//! not, and every thread resumes: nothing waits without bound.

use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use serde_json::{json, Value};
use vnvme_blockdev::BlockDevice;
use vnvme_controller::Controller;
use vnvme_device::{FunctionState, IrqFds, NvmeDevice};
use vnvme_vfio_user::handover::{ClientChange, ClientParts, HandedMap, Handover};

use super::handoff::{added_at_run_time, pass_copy, start_successor, status_pipe};
use super::manifest::{
    ms, now_ns, HandedClient, HandedController, HandedRam, HandedSocket, Manifest,
};
use super::{OtherSockets, Requests, DRAIN_BOUND};

/// One controller's listening socket, to pass on.
#[derive(Debug)]
pub struct Door {
    pub listener: UnixListener,
    /// This process made the socket file (and removes it at exit).
    pub owned: bool,
}

/// What a controller's thread hands in: its client's fds (copies, closed
/// on exec), or none.
#[derive(Debug)]
struct HandedIn {
    client: Option<ClientCopy>,
}

#[derive(Debug)]
struct ClientCopy {
    conn: OwnedFd,
    max_xfer: usize,
    maps: Vec<HandedMap>,
    files: Vec<OwnedFd>,
    irqs: IrqFds,
    doorbell: Option<OwnedFd>,
    function: FunctionState,
}

/// One upgrade request, as the controllers' threads meet on it.
#[derive(Debug)]
struct Round {
    /// The request's time ([`Requests::current`]): its identity.
    id: u64,
    started: Instant,
    handed: Vec<Option<HandedIn>>,
    /// Some thread is passing the handover on (the others wait for it).
    passing: bool,
    outcome: Option<Result<(), String>>,
}

/// The upgrade of every controller of this process.
#[derive(Debug)]
pub struct Several {
    requests: Arc<Requests>,
    doors: Vec<Door>,
    controllers: Vec<Arc<Controller>>,
    control: OtherSockets,
    program: OsString,
    args: Vec<OsString>,
    backends: Vec<Arc<dyn BlockDevice>>,
    configured: Vec<(u32, Arc<dyn BlockDevice>)>,
    unsupported: Option<String>,
    /// How long the threads wait for each other to hand in.
    bound: Duration,
    round: Mutex<Option<Round>>,
    met: Condvar,
    /// Each controller's wake: readable once a request is made.
    wakes: Vec<UnixStream>,
    /// Each controller's last drain, in ms.
    drains: Mutex<Vec<f64>>,
}

impl Several {
    /// For the controllers `controllers` (CNTLID order) with their
    /// `doors`, the control and metrics sockets, the namespaces' backends
    /// and those `configured` (see [`super::Upgrader::new`]), `unsupported`:
    /// why no upgrade can work here. `message_timeout`: the longest a
    /// client's thread can be in one message, which the wait allows for.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        requests: Arc<Requests>,
        doors: Vec<Door>,
        controllers: Vec<Arc<Controller>>,
        control: OtherSockets,
        backends: Vec<Arc<dyn BlockDevice>>,
        configured: Vec<(u32, Arc<dyn BlockDevice>)>,
        unsupported: Option<String>,
        message_timeout: Duration,
    ) -> anyhow::Result<Arc<Self>> {
        let (program, args) = super::handoff::own_command();
        let mut wakes = Vec::new();
        for _ in &controllers {
            wakes.push(requests.another_wake()?);
        }
        Ok(Arc::new(Self {
            requests,
            doors,
            controllers,
            control,
            program,
            args,
            backends,
            configured,
            unsupported,
            bound: message_timeout + DRAIN_BOUND + super::GATHER_SLACK,
            round: Mutex::new(None),
            met: Condvar::new(),
            drains: Mutex::new(vec![0.0; wakes.len()]),
            wakes,
        }))
    }

    /// Controller `index`'s handover.
    pub fn member(self: &Arc<Self>, index: usize) -> Member {
        Member {
            several: Arc::clone(self),
            index,
        }
    }

    /// Why this server cannot be upgraded now, if so.
    fn refusal(&self) -> Option<String> {
        self.unsupported.clone().or_else(|| {
            let now = self.controllers.first()?.namespace_backends();
            added_at_run_time(&self.configured, &now)
        })
    }

    /// The round of request `id`, made if it is a new one.
    fn round_of<'a>(&self, guard: &'a mut Option<Round>, id: u64) -> &'a mut Round {
        if guard.as_ref().is_none_or(|r| r.id != id) {
            *guard = Some(Round {
                id,
                started: Instant::now(),
                handed: self.controllers.iter().map(|_| None).collect(),
                passing: false,
                outcome: None,
            });
        }
        guard.as_mut().expect("made above")
    }

    /// Ends round `id` with `why` unless it has an outcome.
    fn fail(&self, id: u64, why: &str) {
        let mut guard = self.round.lock();
        let round = self.round_of(&mut guard, id);
        if round.outcome.is_none() {
            round.outcome = Some(Err(why.to_string()));
        }
        self.met.notify_all();
    }

    /// Controller `index` hands in for request `id` and waits for the
    /// outcome; the last to hand in passes everything on. Returns only on
    /// failure (success ends the process).
    fn hand_in(
        &self,
        index: usize,
        id: u64,
        exe: Option<std::path::PathBuf>,
        handed: HandedIn,
    ) -> String {
        let mut guard = self.round.lock();
        let round = self.round_of(&mut guard, id);
        if let Some(Err(why)) = &round.outcome {
            return why.clone();
        }
        round.handed[index] = Some(handed);
        let all = round.handed.iter().all(Option::is_some);
        if all && !round.passing && round.outcome.is_none() {
            round.passing = true;
            let handed: Vec<HandedIn> = round.handed.iter_mut().filter_map(Option::take).collect();
            drop(guard);
            let outcome = self.pass(handed, id, exe);
            let mut guard = self.round.lock();
            let round = self.round_of(&mut guard, id);
            match outcome {
                Ok(report) => {
                    tracing::info!("the new process took over every controller: {report}");
                    self.requests.answer(Ok(report));
                    // As for one controller: nothing of ours may run now.
                    std::process::exit(0)
                }
                Err(why) => {
                    round.outcome = Some(Err(why.clone()));
                    self.met.notify_all();
                    return why;
                }
            }
        }
        let deadline = round.started + self.bound;
        loop {
            let round = self.round_of(&mut guard, id);
            if let Some(Err(why)) = &round.outcome {
                return why.clone();
            }
            if Instant::now() >= deadline && !round.passing {
                let missing: Vec<String> = (round.handed.iter().enumerate())
                    .filter(|(_, h)| h.is_none())
                    .map(|(i, _)| (i + 1).to_string())
                    .collect();
                let why = format!(
                    "controller(s) {} did not reach a point between two messages within {:?} \
                     (a client sending a message slowly, or a thread stuck): try again",
                    missing.join(", "),
                    self.bound
                );
                round.outcome = Some(Err(why.clone()));
                self.met.notify_all();
                return why;
            }
            // The passing thread's wait has its own bound (the new
            // process's start): wait for it past ours.
            let until = if round.passing {
                Instant::now() + Duration::from_millis(100)
            } else {
                deadline
            };
            self.met.wait_until(&mut guard, until);
        }
    }

    /// Saves every controller (all paused now), starts the new process
    /// with everything handed in, and waits for it to be ready.
    fn pass(
        &self,
        handed: Vec<HandedIn>,
        asked_ns: u64,
        exe: Option<std::path::PathBuf>,
    ) -> Result<Value, String> {
        if let Some(why) = self.refusal() {
            return Err(why);
        }
        let save_started_ns = now_ns();
        let mut states = Vec::new();
        for (i, c) in self.controllers.iter().enumerate() {
            // Commands held back (a QoS limit, a fault) go beside the
            // state, as for one controller.
            let state = c.save_state_handing().map_err(|e| {
                format!(
                    "controller {} cannot be saved now: {e} (after waiting up to {DRAIN_BOUND:?} \
                     for the commands on its storage): try again",
                    i + 1
                )
            })?;
            states.push((state.encode(), state.handed().to_vec()));
        }
        let mut passed: Vec<OwnedFd> = Vec::new();
        let (status_rx, status_fd) = status_pipe(&mut passed)?;
        let mut pass = |fd: BorrowedFd<'_>| pass_copy(&mut passed, fd);
        let control = match &self.control.control {
            Some(l) => Some(HandedSocket {
                fd: pass(l.as_fd())?,
            }),
            None => None,
        };
        let metrics = match &self.control.metrics {
            Some(l) => Some(HandedSocket {
                fd: pass(l.as_fd())?,
            }),
            None => None,
        };
        let mut entries = Vec::new();
        let mut bytes = Vec::new();
        let mut maps = 0;
        let mut clients = 0;
        let drain_ms = self.drains.lock().iter().copied().fold(0.0, f64::max);
        let mut handed_commands = 0;
        for ((door, h), (state, commands)) in self.doors.iter().zip(&handed).zip(&states) {
            let listener_fd = pass(door.listener.as_fd())?;
            let client = match &h.client {
                None => None,
                Some(c) => {
                    let mut vector_fds = Vec::new();
                    for v in &c.irqs.vectors {
                        vector_fds.push(v.as_ref().map(|fd| pass(fd.as_fd())).transpose()?);
                    }
                    let intx_fd = c
                        .irqs
                        .intx
                        .as_ref()
                        .map(|fd| pass(fd.as_fd()))
                        .transpose()?;
                    let doorbell_fd = c.doorbell.as_ref().map(|fd| pass(fd.as_fd())).transpose()?;
                    let file_fds = (c.files.iter())
                        .map(|fd| pass(fd.as_fd()))
                        .collect::<Result<Vec<_>, _>>()?;
                    maps += c.maps.len();
                    clients += 1;
                    handed_commands += commands.len();
                    Some(HandedClient {
                        conn_fd: pass(c.conn.as_fd())?,
                        max_xfer: c.max_xfer,
                        maps: c.maps.clone(),
                        file_fds,
                        vector_fds,
                        intx_fd,
                        doorbell_fd,
                        function: c.function.clone(),
                        state_len: 0,
                        commands: commands.clone(),
                    })
                }
            };
            entries.push(HandedController {
                listener_fd,
                socket_owned: door.owned,
                client,
                state_len: state.len() as u64,
                socket: None,
                control: None,
                ram: Vec::new(),
                qos: None,
            });
            bytes.extend_from_slice(state);
        }
        // The first's listening socket once more where a one-controller
        // handover has it (the new process closes this copy).
        let first = self.doors.first().ok_or("no controller to hand over")?;
        let mut ram = Vec::new();
        for (nsid, fd) in super::ram::memfds(&self.configured) {
            ram.push(HandedRam {
                nsid,
                fd: pass(fd)?,
            });
        }
        let manifest = Manifest {
            ram,
            status_fd,
            listener_fd: pass(first.listener.as_fd())?,
            socket_owned: first.owned,
            control,
            metrics,
            qos: None,
            supervisor: None,
            supervisor_pid: None,
            client: None,
            crash: None,
            spawned_ns: now_ns(),
            controllers: entries,
        };
        let successor = start_successor(
            &exe.map_or_else(|| self.program.clone(), OsString::from),
            &self.args,
            (&manifest, &bytes),
            (passed, &|_| {}),
            &status_rx,
            &self.backends,
        )?;
        Ok(json!({
            "pid": successor.pid,
            "exe": successor.exe,
            "controllers": self.controllers.len(),
            "clients": clients,
            "state_bytes": bytes.len(),
            "dma_maps": maps,
            "handed_commands": handed_commands,
            "client": clients > 0,
            "phases_ms": successor.phases(drain_ms, save_started_ns),
            "total_ms": ms(asked_ns, successor.ready_ns),
        }))
    }
}

/// One controller's [`Handover`] in a [`Several`].
#[derive(Debug)]
pub struct Member {
    several: Arc<Several>,
    index: usize,
}

impl Member {
    /// The request being served, unless this controller handed in for it
    /// already or it has an outcome.
    fn open_request(&self) -> Option<(Option<std::path::PathBuf>, u64)> {
        let (exe, id) = self.several.requests.current()?;
        let guard = self.several.round.lock();
        match guard.as_ref().filter(|r| r.id == id) {
            Some(r) if r.outcome.is_some() || r.handed[self.index].is_some() || r.passing => None,
            _ => Some((exe, id)),
        }
    }
}

impl Handover<NvmeDevice> for Member {
    fn asked(&self) -> bool {
        self.several.requests.asked() && self.open_request().is_some()
    }

    fn wake_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.several.wakes[self.index].as_fd())
    }

    fn refuse(&self, why: String) {
        // The other controllers' threads stop waiting for this one.
        if let Some((_, id)) = self.several.requests.current() {
            self.several.fail(id, &why);
        }
        self.several.requests.answer(Err(why));
    }

    fn pause(&self, device: &mut NvmeDevice) -> Result<(), String> {
        if self.open_request().is_none() {
            return Err("no upgrade is asked for".into());
        }
        if let Some(why) = self.several.refusal() {
            return Err(why);
        }
        let started = Instant::now();
        device.controller().pause_draining(DRAIN_BOUND);
        let drain_ms = (started.elapsed().as_secs_f64() * 1e6).round() / 1e3;
        if let Some(d) = self.several.drains.lock().get_mut(self.index) {
            *d = drain_ms;
        }
        Ok(())
    }

    fn resume(&self, device: &mut NvmeDevice) {
        if let Err(e) = device.controller().resume() {
            tracing::error!("resuming after a failed upgrade: {e}");
        }
    }

    fn client_changed(&self, _device: &NvmeDevice, _change: ClientChange<'_>) {}

    fn transfer(&self, device: &mut NvmeDevice, client: Option<ClientParts<'_>>) -> String {
        let Some((exe, id)) = self.open_request() else {
            return "no upgrade is asked for".into();
        };
        let copy = match client.map(|c| copy_client(device, c)).transpose() {
            Ok(c) => c,
            Err(why) => {
                self.several.fail(id, &why);
                return why;
            }
        };
        let handed = HandedIn { client: copy };
        self.several.hand_in(self.index, id, exe, handed)
    }
}

/// Copies (closed on exec) of the client's fds and the function's state.
fn copy_client(device: &NvmeDevice, c: ClientParts<'_>) -> Result<ClientCopy, String> {
    let dup = |fd: BorrowedFd<'_>| {
        rustix::io::fcntl_dupfd_cloexec(fd, 0).map_err(|e| format!("copying a client's fd: {e}"))
    };
    let irqs = device
        .irq_fds()
        .map_err(|e| format!("copying the interrupt eventfds: {e}"))?;
    Ok(ClientCopy {
        conn: dup(c.conn)?,
        max_xfer: c.max_xfer,
        maps: c.maps,
        files: c.files.into_iter().map(dup).collect::<Result<_, _>>()?,
        irqs,
        doorbell: device.doorbell_fd().map(dup).transpose()?,
        function: device.function_state(),
    })
}
