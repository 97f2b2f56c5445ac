//! The old process's side: pause, save, start the new binary with the fds,
//! wait for it, then exit, or resume if it failed.

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{json, Value};
use vnvme_blockdev::BlockDevice;
use vnvme_device::NvmeDevice;
use vnvme_vfio_user::handover::{ClientChange, ClientParts, Handover};

use super::manifest::{self, ms, now_ns, HandedClient, HandedRam, HandedSocket, Manifest};
use super::{Requests, SuccessorEvent, DRAIN_BOUND, HANDOVER_TIMEOUT};

/// The control socket and the metrics socket, to pass on.
#[derive(Debug, Default)]
pub struct OtherSockets {
    pub control: Option<UnixListener>,
    pub metrics: Option<std::net::TcpListener>,
}

/// What a pause saved, for the transfer that follows.
#[derive(Debug)]
struct Saved {
    state: Vec<u8>,
    /// The commands held back, handed over beside the state.
    handed: Vec<vnvme_controller::HandedCommand>,
    asked_ns: u64,
    drain_ms: f64,
    save_started_ns: u64,
    exe: Option<std::path::PathBuf>,
}

/// The old process's [`Handover`] for `vnvme serve` with one controller.
#[derive(Debug)]
pub struct Upgrader {
    requests: Arc<Requests>,
    listener: UnixListener,
    socket_owned: bool,
    /// The control and metrics sockets.
    control: OtherSockets,
    /// argv\[0\] and the arguments after it, without `--handover-fd`.
    program: OsString,
    args: Vec<OsString>,
    /// The namespaces' storage, whose locks the new process needs.
    backends: Vec<Arc<dyn BlockDevice>>,
    /// The namespaces as this process configured them from its arguments
    /// (or restored them), by NSID: what a new process will configure.
    configured: Vec<(u32, Arc<dyn BlockDevice>)>,
    /// Why this server cannot be upgraded at all, known at start.
    unsupported: Option<String>,
    saved: Mutex<Option<Saved>>,
    /// The supervisor's socketpair (`--supervise`), where the client's
    /// fds are forwarded as they change.
    forward: Option<Box<dyn super::ClientWatch>>,
}

impl Upgrader {
    /// `listener` (a copy of the served socket; `socket_owned`: this process
    /// made its file), `control`, the namespaces' `backends`, the
    /// namespaces `configured` by NSID, and `unsupported`: why no upgrade
    /// can work here, if so.
    pub fn new(
        requests: Arc<Requests>,
        listener: UnixListener,
        socket_owned: bool,
        control: OtherSockets,
        backends: Vec<Arc<dyn BlockDevice>>,
        configured: Vec<(u32, Arc<dyn BlockDevice>)>,
        unsupported: Option<String>,
    ) -> Self {
        let (program, args) = own_command();
        Self {
            requests,
            listener,
            socket_owned,
            control,
            program,
            args,
            backends,
            configured,
            unsupported,
            saved: Mutex::new(None),
            forward: None,
        }
    }

    /// With the client's fds forwarded to a supervisor, if `forward`.
    pub fn supervised_by(mut self, forward: Option<Box<dyn super::ClientWatch>>) -> Self {
        self.forward = forward;
        self
    }

    /// Why this server cannot be upgraded now, if so.
    fn refusal(&self, device: &NvmeDevice) -> Option<String> {
        self.unsupported.clone().or_else(|| {
            added_at_run_time(&self.configured, &device.controller().namespace_backends())
        })
    }

    /// Supervised: keeps the `state` a pause saved in the crash area, so
    /// the new process continues from a slot holding what it restores.
    /// Commands held back refuse it: the new process would hold them
    /// again with no record of them in the area, and a crash of it would
    /// forget them. So do admin commands a restore runs again and the
    /// admin worker has not yet (its first pass): the handed state does
    /// not carry them.
    fn keep_paused(
        &self,
        device: &NvmeDevice,
        state: &vnvme_controller::SavedState,
    ) -> Result<(), String> {
        let Some(f) = &self.forward else {
            return Ok(());
        };
        if state.reruns() > 0 {
            return Err(format!(
                "{} admin commands a crash interrupted wait to run again: try again once they ran",
                state.reruns()
            ));
        }
        match state.handed().len() {
            0 => f.keep_paused(device, state),
            n => Err(format!(
                "{n} commands are held back (a QoS limit, a fault, a Preempt and Abort's fence): \
                 under --supervise an upgrade hands none over; try again once they ran"
            )),
        }
    }

    /// Starts the new process on `client` and waits for it; `Ok` with the
    /// report once it is ready, `Err` with why not (it is gone then).
    fn pass(&self, device: &NvmeDevice, client: Option<ClientParts<'_>>) -> Result<Value, String> {
        if let Some(why) = self.refusal(device) {
            return Err(why);
        }
        let saved = self.saved.lock().take();
        let (state, handed, asked_ns, drain_ms, save_started_ns, exe) = match saved {
            Some(s) => (
                s.state,
                s.handed,
                s.asked_ns,
                s.drain_ms,
                s.save_started_ns,
                s.exe,
            ),
            None => {
                let (exe, asked_ns) = self.requests.current().unwrap_or((None, now_ns()));
                (Vec::new(), Vec::new(), asked_ns, 0.0, now_ns(), exe)
            }
        };
        let handed_count = handed.len();
        let mut passed: Vec<OwnedFd> = Vec::new();
        let (status_rx, status_fd) = status_pipe(&mut passed)?;
        let mut pass = |fd: BorrowedFd<'_>| pass_copy(&mut passed, fd);
        let listener_fd = pass(self.listener.as_fd())?;
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
        let client = match client {
            None => None,
            Some(c) => Some(handed_client(
                device,
                c,
                state.len() as u64,
                handed,
                &mut pass,
            )?),
        };
        let mut ram = Vec::new();
        for (nsid, fd) in super::ram::memfds(&device.controller().namespace_backends()) {
            ram.push(HandedRam {
                nsid,
                fd: pass(fd)?,
            });
        }
        let mut manifest = Manifest {
            ram,
            status_fd,
            listener_fd,
            socket_owned: self.socket_owned,
            control,
            metrics,
            qos: Some(crate::qos::HandedQos::of(device.controller())),
            supervisor: None,
            supervisor_pid: None,
            client,
            crash: None,
            spawned_ns: now_ns(),
            controllers: Vec::new(),
        };
        if let Some(f) = &self.forward {
            f.hand_on(&mut manifest, &mut pass)?;
        }
        // The supervisor hears of a new process that started, and then
        // how it ended; of nothing if none started.
        let started_pid = std::cell::Cell::new(None);
        let started = |pid| {
            started_pid.set(Some(pid));
            if let Some(f) = &self.forward {
                f.successor(SuccessorEvent::Started(pid));
            }
        };
        let successor = start_successor(
            &exe.map_or_else(|| self.program.clone(), OsString::from),
            &self.args,
            (&manifest, &state),
            (passed, &started),
            &status_rx,
            &self.backends,
        );
        if let Some(f) = self
            .forward
            .as_ref()
            .filter(|_| started_pid.get().is_some())
        {
            f.successor(match &successor {
                Ok(s) => SuccessorEvent::TookOver {
                    pid: s.pid,
                    exe: &s.exe,
                },
                Err(_) => SuccessorEvent::Failed,
            });
        }
        let successor = successor?;
        Ok(json!({
            "pid": successor.pid,
            "exe": successor.exe,
            "state_bytes": state.len(),
            "dma_maps": manifest.client.as_ref().map_or(0, |c| c.maps.len()),
            "client": manifest.client.is_some(),
            "handed_commands": handed_count,
            "phases_ms": successor.phases(drain_ms, save_started_ns),
            "total_ms": ms(asked_ns, successor.ready_ns),
        }))
    }
}

/// `c`, the client of `device`, as the manifest names it: its fds (and
/// the device's interrupt eventfds and doorbell memfd) given to `pass`,
/// with `state_len` bytes of state and the `commands` held back.
pub(super) fn handed_client(
    device: &NvmeDevice,
    c: ClientParts<'_>,
    state_len: u64,
    commands: Vec<vnvme_controller::HandedCommand>,
    pass: &mut dyn FnMut(BorrowedFd<'_>) -> Result<i32, String>,
) -> Result<HandedClient, String> {
    let irqs = device
        .irq_fds()
        .map_err(|e| format!("copying the interrupt eventfds: {e}"))?;
    let mut vector_fds = Vec::new();
    for v in &irqs.vectors {
        vector_fds.push(v.as_ref().map(|fd| pass(fd.as_fd())).transpose()?);
    }
    let intx_fd = irqs.intx.as_ref().map(|fd| pass(fd.as_fd())).transpose()?;
    let doorbell_fd = device.doorbell_fd().map(&mut *pass).transpose()?;
    let file_fds = (c.files.iter())
        .map(|fd| pass(*fd))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(HandedClient {
        conn_fd: pass(c.conn)?,
        max_xfer: c.max_xfer,
        maps: c.maps,
        file_fds,
        vector_fds,
        intx_fd,
        doorbell_fd,
        function: device.function_state(),
        state_len,
        commands,
    })
}

/// A new process that said it is ready: its pid, the binary it runs, and
/// when (CLOCK_MONOTONIC, ns) it was started, began its restore and was
/// ready.
pub(super) struct Successor {
    pub pid: u32,
    pub exe: String,
    spawned_ns: u64,
    started_ns: u64,
    pub ready_ns: u64,
}

impl Successor {
    /// The handover's phases in ms: the drain (`drain_ms`), the save (from
    /// `save_started_ns`), the pass and the restore.
    pub fn phases(&self, drain_ms: f64, save_started_ns: u64) -> Value {
        json!({
            "drain": drain_ms,
            "save": ms(save_started_ns, self.spawned_ns),
            "pass": ms(self.spawned_ns, self.started_ns),
            "restore": ms(self.started_ns, self.ready_ns),
        })
    }
}

/// Writes the handover (`manifest` and the states after it) to a sealed
/// memfd, lets the `backends`' locks go, starts `program` with `args` and
/// `--handover-fd`, which inherits `passed` (closed here once it started),
/// tells `started` its pid, and waits for it to say it is ready on
/// `status`. On any failure the locks are taken back and the new process
/// is gone: this one serves on.
pub(super) fn start_successor(
    program: &OsString,
    args: &[OsString],
    (manifest, state): (&Manifest, &[u8]),
    (mut passed, started): (Vec<OwnedFd>, &dyn Fn(u32)),
    status: &OwnedFd,
    backends: &[Arc<dyn BlockDevice>],
) -> Result<Successor, String> {
    let handover =
        manifest::write(manifest, state).map_err(|e| format!("writing the handover memfd: {e}"))?;
    let handover_fd = pass_copy(&mut passed, handover.as_fd())?;
    drop(handover);
    release_locks(backends)?;
    let spawned_ns = now_ns();
    let child = Command::new(program)
        .args(args)
        .arg("--handover-fd")
        .arg(handover_fd.to_string())
        .spawn();
    drop(passed);
    let exe = std::path::Path::new(program).display().to_string();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            retake_locks(backends);
            return Err(format!("starting {exe}: {e}"));
        }
    };
    started(child.id());
    match wait_ready(status, &mut child) {
        Ok(ready) => {
            let started_ns =
                (ready.get("started_ns").and_then(Value::as_u64)).unwrap_or(spawned_ns);
            let ready_ns = (ready.get("ready_ns").and_then(Value::as_u64)).unwrap_or(started_ns);
            // Before this process exits: a manager that saw its main
            // process end would stop the service, the new one with it.
            crate::notify::main_pid(child.id());
            Ok(Successor {
                pid: child.id(),
                exe,
                spawned_ns,
                started_ns,
                ready_ns,
            })
        }
        Err(why) => {
            let _ = child.kill();
            let status = child.wait();
            retake_locks(backends);
            let status = status.map_or_else(|e| format!("unknown ({e})"), |s| s.to_string());
            Err(format!(
                "the new process ({exe}) {why}; it is gone ({status}), this one serves on"
            ))
        }
    }
}

impl Handover<NvmeDevice> for Upgrader {
    fn asked(&self) -> bool {
        self.requests.asked()
    }

    fn wake_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.requests.wake_fd())
    }

    fn refuse(&self, why: String) {
        self.requests.answer(Err(why));
    }

    fn supervised(&self) -> bool {
        self.forward.is_some()
    }

    fn client_changed(&self, device: &NvmeDevice, change: ClientChange<'_>) {
        if let Some(f) = &self.forward {
            f.changed(device, change);
        }
    }

    fn checkpoint(&self, device: &NvmeDevice) {
        if let Some(f) = &self.forward {
            f.checkpoint(device);
        }
    }

    fn handling(&self, msg: Option<vnvme_vfio_user::handover::Marked<'_>>) {
        if let Some(f) = &self.forward {
            f.handling(msg);
        }
    }

    fn reply_pipe(&self) -> Option<std::sync::Arc<vnvme_vfio_user::ReplyPipe>> {
        self.forward.as_ref()?.reply_pipe()
    }

    fn pause(&self, device: &mut NvmeDevice) -> Result<(), String> {
        let Some((exe, asked_ns)) = self.requests.current() else {
            return Err("no upgrade is asked for".into());
        };
        if let Some(why) = self.refusal(device) {
            return Err(why);
        }
        let ctrl = device.controller();
        let started = Instant::now();
        ctrl.pause_draining(DRAIN_BOUND);
        let drain_ms = started.elapsed().as_secs_f64() * 1e3;
        let save_started_ns = now_ns();
        match ctrl.save_state_handing() {
            Ok(state) => {
                if let Err(why) = self.keep_paused(device, &state) {
                    if let Err(e) = ctrl.resume() {
                        tracing::error!("resuming after a refused upgrade: {e}");
                    }
                    return Err(why);
                }
                *self.saved.lock() = Some(Saved {
                    state: state.encode(),
                    handed: state.handed().to_vec(),
                    asked_ns,
                    drain_ms: (drain_ms * 1000.0).round() / 1000.0,
                    save_started_ns,
                    exe,
                });
                Ok(())
            }
            Err(e) => {
                if let Err(e) = ctrl.resume() {
                    tracing::error!("resuming after a refused upgrade: {e}");
                }
                Err(format!(
                    "the controller cannot be saved now: {e} (after waiting up to \
                     {DRAIN_BOUND:?} for the commands on its storage: a command a backend has \
                     is never handed over, since running it again could overwrite newer \
                     data): try again"
                ))
            }
        }
    }

    fn resume(&self, device: &mut NvmeDevice) {
        self.saved.lock().take();
        if let Err(e) = device.controller().resume() {
            tracing::error!("resuming after a failed upgrade: {e}");
        }
    }

    fn transfer(&self, device: &mut NvmeDevice, client: Option<ClientParts<'_>>) -> String {
        match self.pass(device, client) {
            Ok(report) => {
                tracing::info!("the new process took over: {report}");
                self.requests.answer(Ok(report));
                // Nothing of ours may run now: no socket file removed, no
                // connection shut down, no worker resumed. The new process
                // serves them.
                std::process::exit(0)
            }
            Err(why) => why,
        }
    }
}

/// This process's argv\[0\] and the arguments after it, without
/// `--handover-fd`: what a new process is started with.
pub(super) fn own_command() -> (OsString, Vec<OsString>) {
    let mut argv = std::env::args_os();
    let program = argv.next().unwrap_or_else(|| "vnvme".into());
    (program, without_handover_fd(argv.collect()))
}

/// Lets go of the namespaces' locks, for the new process to take them.
pub(super) fn release_locks(backends: &[Arc<dyn BlockDevice>]) -> Result<(), String> {
    for (i, b) in backends.iter().enumerate() {
        b.hand_over_lock(false)
            .map_err(|e| format!("letting go of namespace {}'s lock: {e}", i + 1))?;
    }
    Ok(())
}

/// Takes the namespaces' locks back after a failed upgrade.
pub(super) fn retake_locks(backends: &[Arc<dyn BlockDevice>]) {
    for (i, b) in backends.iter().enumerate() {
        if let Err(e) = b.hand_over_lock(true) {
            tracing::error!(
                "taking namespace {}'s lock back after a failed upgrade: {e} (another \
                 process may now open its file)",
                i + 1
            );
        }
    }
}

/// Passes a copy of `fd` to the process about to start: the copy has no
/// close-on-exec, so the new process inherits it at the same number, the
/// one returned (to tell it). `passed` keeps the copies until the start;
/// ours are closed then.
pub(crate) fn pass_copy(passed: &mut Vec<OwnedFd>, fd: BorrowedFd<'_>) -> Result<i32, String> {
    let copy = rustix::io::dup(fd).map_err(|e| format!("copying an fd to pass: {e}"))?;
    let n = copy.as_raw_fd();
    passed.push(copy);
    Ok(n)
}

/// The pipe the new process says on whether it is ready: our read end,
/// and the number of its write end, passed as [`pass_copy`] does.
pub(crate) fn status_pipe(passed: &mut Vec<OwnedFd>) -> Result<(OwnedFd, i32), String> {
    let (rx, tx) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| format!("making the status pipe: {e}"))?;
    Ok((rx, pass_copy(passed, tx.as_fd())?))
}

/// Waits for the new process's status line: its `ready` object, or why
/// not (it said so, it exited, or it said nothing in time).
pub(crate) fn wait_ready(status: &OwnedFd, child: &mut Child) -> Result<Value, String> {
    let deadline = Instant::now() + HANDOVER_TIMEOUT;
    let mut buf = Vec::new();
    let mut file = std::fs::File::from(
        rustix::io::fcntl_dupfd_cloexec(status, 0).map_err(|e| format!("status pipe: {e}"))?,
    );
    loop {
        if let Some(end) = buf.iter().position(|&b| b == b'\n') {
            let line: Value = serde_json::from_slice(&buf[..end])
                .map_err(|e| format!("sent a status that is not JSON ({e})"))?;
            if line.get("ok").and_then(Value::as_bool) == Some(true) {
                return Ok(line);
            }
            let why = line
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("gave no reason");
            return Err(format!("refused: {why}"));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("was not ready within {HANDOVER_TIMEOUT:?}"));
        }
        let mut pfd = [rustix::event::PollFd::new(
            status,
            rustix::event::PollFlags::IN,
        )];
        let wait = rustix::event::Timespec {
            tv_sec: left.min(Duration::from_millis(100)).as_secs() as i64,
            tv_nsec: i64::from(left.min(Duration::from_millis(100)).subsec_nanos()),
        };
        match rustix::event::poll(&mut pfd, Some(&wait)) {
            Ok(0) | Err(rustix::io::Errno::INTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(format!("status pipe: {e}")),
        }
        let mut chunk = [0u8; 4096];
        match file.read(&mut chunk) {
            Ok(0) => {
                // It closed the pipe: most likely by exiting; give it a
                // moment so the report can say how.
                let mut status = None;
                for _ in 0..50 {
                    status = child.try_wait().ok().flatten();
                    if status.is_some() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                return Err(match status {
                    Some(s) => format!("exited ({s}) before it was ready"),
                    None => "closed its status pipe before it was ready".into(),
                });
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("status pipe: {e}")),
        }
        if buf.len() > 64 * 1024 {
            return Err("sent a status line longer than 64 KiB".into());
        }
    }
}

/// `args` without `--handover-fd N` (or `=N`): a successor's own, which its
/// successor replaces.
fn without_handover_fd(args: Vec<OsString>) -> Vec<OsString> {
    let mut out = Vec::with_capacity(args.len());
    let mut skip = false;
    for a in args {
        if skip {
            skip = false;
            continue;
        }
        if a == "--handover-fd" {
            skip = true;
            continue;
        }
        if a.to_str().is_some_and(|s| s.starts_with("--handover-fd=")) {
            continue;
        }
        out.push(a);
    }
    out
}

/// Why the namespaces `now` differ from those `configured`, if they do:
/// the operator added one (`namespace_add`), perhaps under a configured
/// NSID it removed first. A new process started with the same arguments
/// would not serve it, and a saved namespace it does not configure would
/// come back empty; removed and detached namespaces are in the state.
pub(super) fn added_at_run_time(
    configured: &[(u32, Arc<dyn BlockDevice>)],
    now: &[(u32, Arc<dyn BlockDevice>)],
) -> Option<String> {
    let (nsid, _) = now.iter().find(|(nsid, backend)| {
        !configured
            .iter()
            .any(|(n, b)| n == nsid && Arc::ptr_eq(b, backend))
    })?;
    Some(format!(
        "namespace {nsid} was added at run time (namespace_add): a new process started with this \
         server's arguments would not serve it; remove it (namespace_remove), or restart the \
         server with it in its arguments, to upgrade"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_successors_handover_fd_is_not_passed_on() {
        let args: Vec<OsString> = ["serve", "--handover-fd", "7", "-s", "x", "--handover-fd=9"]
            .iter()
            .map(OsString::from)
            .collect();
        assert_eq!(
            without_handover_fd(args),
            ["serve", "-s", "x"].map(OsString::from).to_vec()
        );
    }
}
