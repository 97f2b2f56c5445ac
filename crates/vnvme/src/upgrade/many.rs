//! A live upgrade of a `[[controllers]]` server (`vnvme serve --config F`
//! with a table per controller: each its own socket, subsystem and
//! namespaces, every client served by one connection thread): the whole
//! process goes to a new one, every controller at once.
//!
//! The connection thread gathers the clients (`vnvme_vfio_user`'s
//! `hub/gather.rs`): once every one is between two messages it pauses each
//! controller with a client (bounded drain) and calls
//! [`HandoverAll::transfer`] here, which saves every controller, passes
//! every listening socket, control socket, client (connection, DMA files,
//! interrupt eventfds, doorbell memfd) and `ram` memfd, and starts the new
//! binary with the same arguments. Each controller is named in the
//! manifest by its socket's path, which the new process matches to its
//! `[[controllers]]` tables: a controller added to or removed from the
//! file since makes it refuse, and this process serves on.

use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{json, Value};
use vnvme_blockdev::BlockDevice;
use vnvme_controller::Controller;
use vnvme_device::NvmeDevice;
use vnvme_vfio_user::handover::{ClientParts, HandoverAll};

use super::handoff::{added_at_run_time, handed_client, pass_copy, start_successor, status_pipe};
use super::manifest::{ms, now_ns, HandedController, HandedRam, HandedSocket, Manifest};
use super::{Requests, DRAIN_BOUND};

/// One controller of a [`Many`].
#[derive(Debug)]
pub struct Member {
    /// For messages: `controllers[i] (socket)`.
    pub name: String,
    /// Its socket's path as the configuration gives it.
    pub socket: PathBuf,
    /// A copy of its listening socket; `owned`: this process made its file.
    pub listener: UnixListener,
    pub owned: bool,
    /// A copy of its control socket, if it has one.
    pub control: Option<UnixListener>,
    pub controller: Arc<Controller>,
    /// Its namespaces' storage, whose locks the new process needs.
    pub backends: Vec<Arc<dyn BlockDevice>>,
    /// Its namespaces as configured, by NSID (see [`super::Upgrader::new`]).
    pub configured: Vec<(u32, Arc<dyn BlockDevice>)>,
    /// Why it cannot be upgraded at all, known at start.
    pub unsupported: Option<String>,
}

/// The old process's [`HandoverAll`] for a `[[controllers]]` server.
#[derive(Debug)]
pub struct Many {
    requests: Arc<Requests>,
    members: Vec<Member>,
    program: OsString,
    args: Vec<OsString>,
    /// How long the clients get to be between two messages at once.
    bound: Duration,
    /// Each controller's last drain, in ms.
    drains: Mutex<Vec<f64>>,
}

impl Many {
    /// For `members`, in the order the connection thread serves them;
    /// `message_timeout`: the longest any client may be in one message.
    pub fn new(requests: Arc<Requests>, members: Vec<Member>, message_timeout: Duration) -> Self {
        let (program, args) = super::handoff::own_command();
        Self {
            requests,
            drains: Mutex::new(vec![0.0; members.len()]),
            members,
            program,
            args,
            bound: message_timeout + super::GATHER_SLACK,
        }
    }

    /// Why controller `m` cannot be upgraded now, if so.
    fn refusal(m: &Member) -> Option<String> {
        let why = (m.unsupported.clone())
            .or_else(|| added_at_run_time(&m.configured, &m.controller.namespace_backends()))?;
        Some(format!("{}: {why}", m.name))
    }

    /// Saves every controller (those with a client paused), starts the new
    /// process with everything, and waits for it to be ready.
    fn pass(
        &self,
        servers: Vec<(&mut NvmeDevice, Option<ClientParts<'_>>)>,
        asked_ns: u64,
        exe: Option<PathBuf>,
    ) -> Result<Value, String> {
        if let Some(why) = self.members.iter().find_map(Self::refusal) {
            return Err(why);
        }
        if servers.len() != self.members.len() {
            return Err(format!(
                "{} controllers served and {} to hand over",
                servers.len(),
                self.members.len()
            ));
        }
        let save_started_ns = now_ns();
        let mut states = Vec::new();
        for ((device, _), m) in servers.iter().zip(&self.members) {
            // Commands held back (a QoS limit, a fault) go beside the
            // state, as for one controller.
            let state = device.controller().save_state_handing().map_err(|e| {
                format!(
                    "{} cannot be saved now: {e} (after waiting up to {DRAIN_BOUND:?} for the \
                     commands on its storage): try again",
                    m.name
                )
            })?;
            states.push((state.encode(), state.handed().to_vec()));
        }
        let mut passed: Vec<OwnedFd> = Vec::new();
        let (status_rx, status_fd) = status_pipe(&mut passed)?;
        let mut pass = |fd: BorrowedFd<'_>| pass_copy(&mut passed, fd);
        let mut entries = Vec::new();
        let mut bytes = Vec::new();
        let (mut maps, mut clients, mut handed_commands) = (0, 0, 0);
        for (((device, client), m), (state, commands)) in
            servers.into_iter().zip(&self.members).zip(states)
        {
            let listener_fd = pass(m.listener.as_fd())?;
            let client = match client {
                None => None,
                Some(c) => {
                    maps += c.maps.len();
                    clients += 1;
                    handed_commands += commands.len();
                    Some(handed_client(device, c, 0, commands, &mut pass)?)
                }
            };
            let control = match &m.control {
                Some(l) => Some(HandedSocket {
                    fd: pass(l.as_fd())?,
                }),
                None => None,
            };
            let mut ram = Vec::new();
            for (nsid, fd) in super::ram::memfds(&m.controller.namespace_backends()) {
                ram.push(HandedRam {
                    nsid,
                    fd: pass(fd)?,
                });
            }
            entries.push(HandedController {
                listener_fd,
                socket_owned: m.owned,
                client,
                state_len: state.len() as u64,
                socket: Some(m.socket.clone()),
                control,
                ram,
                qos: Some(crate::qos::HandedQos::of(&m.controller)),
            });
            bytes.extend_from_slice(&state);
        }
        // The first's listening socket once more where a one-controller
        // handover has it (the new process closes this copy).
        let first = self.members.first().ok_or("no controller to hand over")?;
        let manifest = Manifest {
            ram: Vec::new(),
            status_fd,
            listener_fd: pass(first.listener.as_fd())?,
            socket_owned: first.owned,
            control: None,
            metrics: None,
            qos: None,
            supervisor: None,
            supervisor_pid: None,
            client: None,
            crash: None,
            spawned_ns: now_ns(),
            controllers: entries,
        };
        let backends: Vec<_> = (self.members.iter())
            .flat_map(|m| m.backends.iter().cloned())
            .collect();
        let drain_ms = self.drains.lock().iter().copied().fold(0.0, f64::max);
        let successor = start_successor(
            &exe.map_or_else(|| self.program.clone(), OsString::from),
            &self.args,
            (&manifest, &bytes),
            (passed, &|_| {}),
            &status_rx,
            &backends,
        )?;
        Ok(json!({
            "pid": successor.pid,
            "exe": successor.exe,
            "controllers": self.members.len(),
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

impl HandoverAll<NvmeDevice> for Many {
    fn asked(&self) -> bool {
        self.requests.asked()
    }

    fn wake_fd(&self) -> BorrowedFd<'_> {
        self.requests.wake_fd()
    }

    fn gather_bound(&self) -> Duration {
        self.bound
    }

    fn refuse(&self, why: String) {
        self.requests.answer(Err(why));
    }

    fn pause(&self, index: usize, device: &mut NvmeDevice) -> Result<(), String> {
        if self.requests.current().is_none() {
            return Err("no upgrade is asked for".into());
        }
        if let Some(why) = self.members.get(index).and_then(Self::refusal) {
            return Err(why);
        }
        let started = Instant::now();
        device.controller().pause_draining(DRAIN_BOUND);
        let drain_ms = (started.elapsed().as_secs_f64() * 1e6).round() / 1e3;
        if let Some(d) = self.drains.lock().get_mut(index) {
            *d = drain_ms;
        }
        Ok(())
    }

    fn resume(&self, _index: usize, device: &mut NvmeDevice) {
        if let Err(e) = device.controller().resume() {
            tracing::error!("resuming after a failed upgrade: {e}");
        }
    }

    fn transfer(&self, servers: Vec<(&mut NvmeDevice, Option<ClientParts<'_>>)>) -> String {
        let Some((exe, asked_ns)) = self.requests.current() else {
            return "no upgrade is asked for".into();
        };
        match self.pass(servers, asked_ns, exe) {
            Ok(report) => {
                tracing::info!("the new process took over every controller: {report}");
                self.requests.answer(Ok(report));
                // As for one controller: nothing of ours may run now (no
                // socket file removed, no connection shut down).
                std::process::exit(0)
            }
            Err(why) => why,
        }
    }
}
