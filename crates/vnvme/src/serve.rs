//! `vnvme serve`: the controller on a vfio-user socket, one client at a time.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use vnvme_controller::Controller;
use vnvme_vfio_user::{
    DmaLimits, ServerOptions, HANDSHAKE_TIMEOUT, MAX_FD_DMA_MAPS, MESSAGE_TIMEOUT,
};

use crate::control::{ControlServer, Hooks};
use crate::device::DeviceOptions;
use crate::identity::Origin;
use crate::namespace::NamespaceSpec;
use crate::ns_syntax;
use crate::socket::Listening;
use crate::socket::{parse_mode, Plan, SocketFile};
use crate::stopping::Stop;
use crate::upgrade::{OtherSockets, Reporter, Taken, Upgrader};
use vnvme_vfio_user::handover::Adopted;

mod many;
mod subsystem;
pub mod supervise;

/// Where `vnvme serve` listens and the tools connect by default.
pub const DEFAULT_SOCKET: &str = "/run/vnvme.sock";

/// What `vnvme serve --help` says about the client, after the options.
const CLIENT_HELP: &str = "\
Clients: one at a time. While one owns the device, other connections get an EBUSY reply to their
VERSION and are closed; the next client is served as soon as the owner disconnects. A connection
must send VERSION within --handshake-timeout (and one that has not gives way to the first connection
that does), and every message, once started, must arrive whole within --message-timeout; an idle
client that has negotiated is never dropped.

Guest memory (DMA_MAP): a memfd (QEMU's memory-backend-memfd, sealed by default) or a regular file
shared with the client (memory-backend-file,share=on on /dev/shm or hugetlbfs; SPDK's hugepage
files). Maps without an fd are served with DMA_READ/DMA_WRITE messages. If the client shrinks a file
it shared, the lost pages are replaced with zeroes, that map is marked broken, and every command
touching it fails with Data Transfer Error until the client unmaps it; the server keeps running.
At most --max-dma-maps maps and --max-dma-size bytes are accepted. Interrupt fds (SET_IRQS) must
be eventfds.

Who may connect: the socket is made with its final mode and group (bound in a private folder, then
moved into place), 600 by default (the server's user), 660 with --socket-group. Connecting needs
write permission on the socket and search permission on its folders. For QEMU run by libvirt as
libvirt-qemu: --socket-group libvirt-qemu (the server must be root or a member of that group).

Socket activation: when LISTEN_PID is this process and LISTEN_FDS=1 (systemd, or
systemd-socket-activate), the listening socket at fd 3 is served instead of binding one; the .socket
unit sets its path, owner and mode (--socket-mode and --socket-group are refused then), and it is
left in place at exit.";

#[derive(Args, Debug, Clone)]
#[command(after_help = CLIENT_HELP)]
pub struct ServeOptions {
    /// The vfio-user socket to listen on (a stale socket file is replaced; a live one, or a file
    /// that is not a socket, is an error). Default /run/vnvme.sock. With socket activation, if
    /// given, it must be the inherited socket's path. Given more than once: one NVM subsystem (one
    /// serial and NQN, derived from the first socket) with a controller per socket, CNTLID 1, 2,
    /// ... in the order given, sharing the namespaces (multipath, shared disks; see
    /// docs/subsystem.md); `vnvme ctl upgrade` hands every controller over at once.
    #[arg(long, short = 's', value_name = "PATH")]
    pub socket: Vec<PathBuf>,
    /// The vfio-user socket's permissions, in octal (connecting needs write permission). Default
    /// 600 (the server's user only), or 660 with --socket-group.
    #[arg(long, value_name = "MODE", value_parser = parse_mode)]
    pub socket_mode: Option<u32>,
    /// Give the vfio-user socket to this group (a name or a number), e.g. the group the VMM runs
    /// as (libvirt-qemu, kvm); the server must be root or a member of it.
    #[arg(long, value_name = "GROUP")]
    pub socket_group: Option<String>,
    // Help from crate::ns_syntax, which lists every form and option the
    // parser takes (the tests hold the two together).
    #[arg(
        long = "ns",
        value_name = "STORAGE[,OPTION]...",
        help = ns_syntax::short_help("1G:ram (without --config)"),
        long_help = ns_syntax::long_help("1G:ram (without --config)")
    )]
    pub namespaces: Vec<NamespaceSpec>,
    /// A TOML file describing the controller and its namespaces (see `vnvme::config`); flags given
    /// on the command line override it, and --ns replaces its namespaces. With `[[controllers]]`
    /// tables (each a controller with its own socket = "PATH", control = "PATH" and namespaces),
    /// one process serves them all, their queues on --workers poll-group threads (default 1, or
    /// the file's top-level workers); --socket, --control, --ns, --stats and --metrics are refused
    /// then, the other flags apply to every controller. `vnvme ctl upgrade` on any of their control
    /// sockets (or SIGUSR2) hands every controller to one new process, started with the same file,
    /// which refuses if a controller was added to it or removed since.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Write the controller's counters as JSON to FILE every second and at
    /// exit (replaced atomically: write a temporary file, then rename). With several --socket:
    /// {"controllers": [...]}, each controller's counters with its cntlid.
    #[arg(long, value_name = "FILE")]
    pub stats: Option<PathBuf>,
    /// Serve the counters as Prometheus metrics (text format 0.0.4) on
    /// http://ADDR:PORT/metrics, e.g. 127.0.0.1:9375 (port 0: any free port, logged). With
    /// several --socket each controller's samples carry cntlid="N".
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<std::net::SocketAddr>,
    /// DMA maps a client may have at once (advertised in VERSION as max_dma_maps). Default: 4096,
    /// or a quarter of vm.max_map_count if that is smaller.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=MAX_FD_DMA_MAPS as u64))]
    pub max_dma_maps: Option<u64>,
    /// Total bytes a client may map with DMA_MAP (e.g. 64G, 4T). Default 4T.
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_size)]
    pub max_dma_size: Option<u64>,
    /// How long a new connection has to send VERSION before it is dropped. Default 5s.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse_duration)]
    pub handshake_timeout: Option<Duration>,
    /// How long one message may take to arrive whole once it has started (and a client that does
    /// not read its socket may block a reply). Default 5s.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse_duration)]
    pub message_timeout: Option<Duration>,
    /// How long the server has to stop once asked (SIGTERM, SIGINT, the control socket's
    /// `shutdown`) before it exits anyway, with status 1: a worker stuck in storage that does not
    /// answer (a hung filesystem) would otherwise keep it running. A second signal exits at once.
    /// Default 30s.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse_duration)]
    pub stop_timeout: Option<Duration>,
    /// Serve JSON-RPC 2.0 on this UNIX socket, one request per line, to change and break the
    /// device while it serves (`vnvme ctl --control PATH METHOD`: namespaces, faults, stats,
    /// controller_fatal, shutdown).
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// The control socket's permissions, in octal. Default 600: its owner only (anyone who can
    /// connect can break the device and stop the server).
    #[arg(long, value_name = "MODE", default_value = "600", value_parser = parse_mode)]
    pub control_mode: u32,
    /// Run the server as the child of a small supervisor that keeps the sockets and the client's
    /// fds (forwarded as the client sends them) and starts a new server when it dies (SIGKILL, a
    /// panic, an abort). The new server restores the client connected at the crash from a shared
    /// crash area and serves it on the same connection; the commands in flight at the crash
    /// complete with Command Interrupted, which the host retries (a crash while a vfio-user message
    /// was being handled closes the connection instead, with the reason logged, and the next
    /// client is served). A `ram` namespace's data is kept (the supervisor holds its memfd and
    /// the new server maps it). Costs a process, an fd per file the client shares, a pause of the workers
    /// and a state write per state change (admin command, register write, DMA map), two stores per
    /// queue per worker round, two per command that goes in flight (on the `file` backend, or held),
    /// one per doorbell trap and one or two per zone a command changes. Live upgrade (`vnvme ctl
    /// upgrade`, or SIGUSR2 to the supervisor) replaces the server, which the supervisor then
    /// watches. Refused under it, as a crash would not keep them: zoned namespaces with more than
    /// 2^20 zones in all, room for Namespace Management (`--nvm-capacity`) and the control socket's
    /// `namespace_add` and `namespace_resize`. See docs/crash-recovery.md.
    #[arg(long)]
    pub supervise: bool,
    #[command(flatten)]
    pub device: DeviceOptions,
    /// Internal: set by a running `vnvme serve` on the new process of a live upgrade (`vnvme ctl
    /// upgrade`, SIGUSR2), which takes over the client from the handover in this fd.
    #[arg(long, value_name = "FD", hide = true)]
    pub handover_fd: Option<i32>,
}

impl ServeOptions {
    /// What the vfio-user server allows a client.
    pub fn server_options(&self) -> Result<ServerOptions> {
        let handshake_timeout = self.handshake_timeout.unwrap_or(HANDSHAKE_TIMEOUT);
        let message_timeout = self.message_timeout.unwrap_or(MESSAGE_TIMEOUT);
        if handshake_timeout.is_zero() || message_timeout.is_zero() {
            bail!("--handshake-timeout and --message-timeout must be more than 0");
        }
        let mut dma_limits = DmaLimits::default();
        if let Some(n) = self.max_dma_maps {
            dma_limits.max_maps = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(bytes) = self.max_dma_size {
            if bytes == 0 {
                bail!("--max-dma-size must be more than 0");
            }
            dma_limits.max_bytes = bytes;
        }
        Ok(ServerOptions {
            handshake_timeout,
            message_timeout,
            dma_limits,
            // Set where the server's stop is made.
            stop_wake: None,
        })
    }
}

pub fn run(opts: ServeOptions) -> Result<()> {
    // First of all, before this process opens anything: a live upgrade's
    // new process claims the fds the old one left it.
    let Some(fd) = opts.handover_fd else {
        if opts.supervise {
            return supervise::run(opts);
        }
        return serve(opts, None);
    };
    let (taken, mut reporter) = crate::upgrade::take(fd)?;
    let result = serve(opts, Some((taken, &mut reporter)));
    if let Err(e) = &result {
        reporter.fail(e);
    }
    result
}

fn serve(mut opts: ServeOptions, mut handover: Option<(Taken, &mut Reporter)>) -> Result<()> {
    // First, while the process has one thread: taking the passed socket
    // removes LISTEN_* from the environment.
    let inherited = vnvme_vfio_user::activation::take_listener()
        .context("taking the socket passed by the launcher (socket activation)")?;
    let mut faults = Vec::new();
    let mut qos = crate::qos::QosSpec::default();
    let mut qos_groups = std::collections::BTreeMap::new();
    if let Some(path) = &opts.config {
        let file = match crate::config::ServeFile::load(path)? {
            crate::config::ServeFile::One(file) => *file,
            crate::config::ServeFile::Many {
                workers,
                controllers,
            } => {
                return many::run(&opts, inherited, workers, controllers, handover);
            }
        };
        faults = file.faults.clone();
        qos = file.qos.clone();
        qos_groups = file.qos_groups.clone();
        opts.device = file.apply(&opts.device);
        opts.max_dma_maps = opts.max_dma_maps.or(file.max_dma_maps);
        opts.max_dma_size = opts.max_dma_size.or(file.max_dma_size);
        opts.handshake_timeout = opts.handshake_timeout.or(file.handshake_timeout);
        opts.message_timeout = opts.message_timeout.or(file.message_timeout);
        opts.stop_timeout = opts.stop_timeout.or(file.stop_timeout);
        opts.socket_mode = opts.socket_mode.or(file.socket_mode);
        opts.socket_group = opts.socket_group.take().or(file.socket_group.clone());
        if opts.socket.is_empty() {
            opts.socket = file.sockets.clone();
        }
        if opts.namespaces.is_empty() {
            opts.namespaces = file.namespaces;
        }
    } else if opts.namespaces.is_empty() {
        opts.namespaces = vec!["1G:ram".parse().map_err(anyhow::Error::msg)?];
    }
    if opts.socket.len() > 1 {
        let config = subsystem::FileParts {
            faults,
            qos,
            qos_groups,
        };
        return subsystem::run(&opts, inherited, config, handover);
    }
    let server_options = opts.server_options()?;
    // Before the device: a group that does not exist fails the start at once.
    let plan = Plan::new(
        inherited,
        opts.socket.first().map(PathBuf::as_path),
        Path::new(DEFAULT_SOCKET),
        opts.socket_mode,
        opts.socket_group.as_deref(),
    )?;
    let stop_timeout = opts.stop_timeout.unwrap_or(STOP_TIMEOUT);
    if stop_timeout.is_zero() {
        bail!("--stop-timeout must be more than 0");
    }
    let origin = match plan.path() {
        Some(path) => Origin::socket(path),
        None => {
            tracing::warn!(
                "the socket passed has no path: the default serial number is this host's \
                 embedded one, which every such server shares (give --serial)"
            );
            Origin::embedded()
        }
    };
    let mut namespaces = opts.device.namespace_configs(&opts.namespaces, &origin)?;
    // The ram namespaces' data, as the process before this one left it.
    if let Some((t, _)) = handover.as_mut() {
        crate::upgrade::ram::adopt(&mut namespaces, std::mem::take(&mut t.ram))?;
    }
    let backends: Vec<_> = namespaces.iter().map(|n| Arc::clone(&n.backend)).collect();
    let supervised = handover.as_ref().is_some_and(|(t, _)| t.crash.is_some());
    // Where a supervised server keeps its zones' words in the crash area.
    let zone_room = match supervised {
        true => supervise::zone_room::ZoneRoom::plan(&namespaces)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .context("--supervise")?,
        false => supervise::zone_room::ZoneRoom::default(),
    };
    let configured: u64 = namespaces.iter().map(|n| n.backend.size()).sum();
    if supervised && opts.device.nvm_capacity.is_some_and(|c| c > configured) {
        // Namespace Management would create ram namespaces whose memory is
        // not passed to the supervisor: a new server after a crash would
        // bring them back empty, every completed write lost.
        bail!(
            "--nvm-capacity leaves room for Namespace Management to create namespaces, which \
             --supervise does not keep across a crash yet (a new server would bring them back \
             empty; issue 35): leave --nvm-capacity out, or serve without --supervise"
        );
    }
    let config = opts.device.device_config(namespaces, &origin, None);
    // A supervisor's crash area, and the client of a dead child to serve
    // again from it.
    let crash = handover.as_mut().and_then(|(t, _)| t.crash.take());
    let (crash_area, crashed, replies, handed_serial) = match crash {
        Some(c) => (Some(c.area), c.client, c.replies, c.serial),
        None => (None, None, None, None),
    };
    // The serial of the client adopted, which the slots already carry.
    let adopted_serial = crashed.as_ref().map(|c| c.serial).or(handed_serial);
    if let Some((t, _)) = &handover {
        if !t.controllers.is_empty() {
            // Its clients would be dropped unserved.
            bail!(
                "the handover has {} controllers and this server one --socket: not this \
                 server's handover",
                t.controllers.len()
            );
        }
    }
    let mut client = handover.as_mut().and_then(|(t, _)| t.client.take());
    let mut recorded = None;
    if let (Some(fds), Some(area)) = (crashed, &crash_area) {
        let area = supervise::crash_area::CrashArea::open(area.as_fd())
            .context("the supervisor's crash area")?;
        let (c, words) = supervise::restore::client(&area, fds, &zone_room)
            .context("restoring the client of the server that died")?;
        client = Some(c);
        recorded = Some(words);
    }
    let (device, adopted) = match client {
        None => (vnvme_device::NvmeDevice::new(config)?, None),
        Some(mut c) => {
            let mut adopted = Adopted::new(
                c.conn,
                c.max_xfer,
                server_options.message_timeout,
                server_options.dma_limits,
                &c.maps,
                c.files,
            )
            .context("serving the handed-over client's guest memory")?;
            if let Some(words) = &mut recorded {
                words
                    .apply(&mut c.state, &adopted.dma())
                    .context("restoring the client of the server that died")?;
                if let Some((bytes, fds)) = words.take_redo() {
                    adopted
                        .redo(&bytes, fds)
                        .context("restoring the client of the server that died")?;
                }
            }
            let device = vnvme_device::NvmeDevice::restored(
                config,
                &c.function,
                c.irqs,
                c.doorbells,
                &c.state,
                adopted.dma(),
            )
            .context("restoring the handed-over controller")?;
            (device, Some(adopted))
        }
    };
    let identity = opts.device.controller_config(&origin);
    for (i, f) in faults.into_iter().enumerate() {
        let what = || format!("[[fault]] number {} of the configuration", i + 1);
        crate::config::only_controller(&f, device.controller()).with_context(what)?;
        device.controller().fault_add(f.spec).with_context(what)?;
    }
    let groups = crate::qos::groups(&qos_groups)?;
    let one = device.controller().cntlid();
    crate::qos::check_controllers(&qos, opts.namespaces.iter().map(|ns| &ns.qos), one..=one)?;
    crate::qos::apply_all(
        device.controller(),
        &qos,
        opts.namespaces.iter().map(|ns| &ns.qos),
        &groups,
    )?;
    // Limits changed at run time in the process this one took over from.
    if let Some(qos) = handover.as_mut().and_then(|(t, _)| t.qos.take()) {
        qos.apply(device.controller())?;
    }
    // Before the socket: a --metrics address in use fails the start
    // without leaving a socket file behind.
    let mut handed_on = OtherSockets::default();
    let handed_metrics = handover.as_mut().and_then(|(t, _)| t.metrics.take());
    let metrics = match (opts.metrics, handed_metrics) {
        (None, None) => None,
        (Some(addr), handed) => {
            let listener = match handed {
                Some(l) => l,
                None => crate::metrics::http::MetricsServer::bind(addr)?,
            };
            handed_on.metrics = Some(listener.try_clone().context("copying the metrics socket")?);
            let ctrl = Arc::clone(device.controller());
            let m = crate::metrics::http::MetricsServer::serve(listener, ctrl)?;
            tracing::info!("metrics on http://{}/metrics", m.addr());
            Some(m)
        }
        (None, Some(_)) => bail!(
            "the handover has a metrics socket and this process no --metrics: not this server's handover"
        ),
    };
    // Before the socket: a stop asked for as soon as the socket appears is
    // a clean one, which removes it.
    let stop = Stop::new()?;
    stop.on_signals()?;
    // Dropped (its file removed, if this process made it) on every return.
    let (listening, control_listener) = match handover.as_mut() {
        None => (plan.listen()?, None),
        Some((t, _)) => handed_sockets(t, plan.path(), opts.control.as_deref())?,
    };
    let socket_shown = listening
        .path()
        .map_or("(unnamed)".into(), |p| p.display().to_string());
    let requests = crate::upgrade::Requests::new(server_options.message_timeout)?;
    let hooks = Hooks {
        stop: stop.clone(),
        upgrade: Some(Arc::clone(&requests)),
        peers: Vec::new(),
        supervised,
    };
    let control = match &opts.control {
        Some(path) => {
            let (listener, file) = match control_listener {
                Some(l) => (
                    l,
                    SocketFile::existing(path).with_context(|| {
                        format!("the handed-over control socket {}", path.display())
                    })?,
                ),
                None => crate::control::bind(path, opts.control_mode)?,
            };
            handed_on.control = Some(listener.try_clone().context("copying the control socket")?);
            Some(ControlServer::serve(
                listener,
                file,
                Arc::clone(device.controller()),
                hooks,
            )?)
        }
        None => None,
    };
    let keeper = match crash_area {
        Some(fd) => {
            let k = Arc::new(
                supervise::Keeper::new(fd.as_fd(), requests.waker()?, replies, zone_room)
                    .context("the supervisor's crash area")?,
            );
            device.controller().record_crash_state(
                Arc::clone(&k) as Arc<dyn vnvme_controller::crash_record::CrashRecord>
            );
            Some((k, fd))
        }
        None => None,
    };
    let forwarder = match handover.as_mut() {
        Some((t, _)) => match t.supervisor.take() {
            // A supervisor killed outright cannot pass its stop on: stop then.
            Some(fd) => Some(supervise::Forwarder::new(
                fd,
                keeper,
                supervise::parent::die_with_supervisor(t.supervisor_pid)?,
                adopted_serial,
            )),
            None => None,
        },
        None => None,
    };
    if let Some(f) = &forwarder {
        // Before this server is ready, so before any write: the next one
        // after a crash serves the same data.
        f.memories(&device.controller().namespace_backends())
            .context("passing the ram namespaces' memory to the supervisor")?;
    }
    let unsupported = cannot_upgrade(&backends);
    let upgrader = Upgrader::new(
        requests,
        listening
            .listener()
            .try_clone()
            .context("copying the listening socket")?,
        listening.own_file().is_some(),
        handed_on,
        backends.clone(),
        device.controller().namespace_backends(),
        unsupported,
    )
    .supervised_by(forwarder.map(|f| Box::new(f) as Box<dyn crate::upgrade::ClientWatch>));
    let own = listening.own_file().into_iter().collect();
    watch_stop(stop.clone(), stop_timeout, own)?;
    tracing::info!(
        socket = %socket_shown,
        serial = %identity.serial,
        nqn = %identity.nqn(),
        namespaces = opts.namespaces.len(),
        "serving NVMe controller over vfio-user; attach with -device '{{\"driver\":\"vfio-user-pci\",\"socket\":{{\"path\":\"{socket_shown}\",\"type\":\"unix\"}}}}'",
    );
    let stats = (opts.stats.clone()).map(|path| StatsWriter::start(device.controller(), path));
    let ctrl = Arc::clone(device.controller());
    let server_options = ServerOptions {
        stop_wake: Some(stop.wake().clone()),
        ..server_options
    };
    let mut server = vnvme_vfio_user::Server::with_options(device, server_options);
    match handover.as_mut() {
        Some((_, reporter)) => reporter.ready(),
        // A successor is not the main process yet: its old one says so
        // (`MAINPID=`), and the service was ready long before.
        None => crate::notify::ready(),
    }
    let result =
        server.serve_listener_with(listening.listener(), stop.flag(), Some(&upgrader), adopted);
    drop(listening);
    drop(control);
    if let Some(m) = metrics {
        m.stop();
    }
    if let Some(stats) = stats {
        stats.finish(&ctrl);
    }
    match result {
        Ok(()) => {
            tracing::info!("stopped");
            Ok(())
        }
        Err(e) => Err(e).context("serving vfio-user"),
    }
}

/// The listening socket and control socket a live upgrade's old process
/// handed over, checked against this process's `socket` and `control`
/// (the same arguments, so they agree unless the handover is not ours).
fn handed_sockets(
    t: &mut Taken,
    socket: Option<&Path>,
    control: Option<&Path>,
) -> Result<(Listening, Option<std::os::unix::net::UnixListener>)> {
    let listener = t
        .listener
        .take()
        .context("the handover's listening socket was taken already")?;
    let listening = match (t.socket_owned, socket) {
        (true, Some(path)) => Listening::Bound {
            listener,
            file: SocketFile::existing(path)
                .with_context(|| format!("the handed-over socket {}", path.display()))?,
        },
        (true, None) => bail!("the handover says the socket file is ours, and it has no path"),
        (false, path) => Listening::Inherited {
            listener,
            path: path.map(Path::to_path_buf),
        },
    };
    let control_listener = t.control.take();
    if control_listener.is_some() != control.is_some() {
        bail!("the handover's control socket does not match --control: not this server's handover");
    }
    Ok((listening, control_listener))
}

/// Why this server cannot be upgraded at all, if so.
pub(crate) fn cannot_upgrade(backends: &[Arc<dyn vnvme_blockdev::BlockDevice>]) -> Option<String> {
    if let Some(i) = backends.iter().position(|b| !b.outlives_process()) {
        return Some(format!(
            "namespace {} keeps its data in this process's memory (ram): an upgrade would lose \
             it; serve it from a file (PATH:file) to upgrade",
            i + 1
        ));
    }
    None
}

/// How long a stop may take before the server exits anyway: longer than any
/// wait that ends on its own (an NBD request's, 2 × its 10 s I/O timeout).
pub(crate) const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// Exits the process (status 1, the socket file removed if it made it) if
/// it still runs `timeout` after `stop` was set. A clean stop joins every queue worker,
/// and one blocked in a read of storage that never answers (a FUSE or NFS
/// mount whose server hangs: the kernel waits without end) would hold it
/// forever.
fn watch_stop(stop: Stop, timeout: Duration, sockets: Vec<SocketFile>) -> Result<()> {
    std::thread::Builder::new()
        .name("vnvme-stop-watch".into())
        .spawn(move || {
            stop.wait();
            std::thread::sleep(timeout);
            tracing::error!(
                "the server did not stop within {timeout:?} (--stop-timeout): a queue worker is \
                 blocked, most likely in a namespace's storage that does not answer; exiting \
                 without a clean stop (commands in flight are lost; data already written stays)"
            );
            for file in &sockets {
                file.remove();
            }
            std::process::exit(1);
        })
        .context("starting the stop watch thread")?;
    Ok(())
}

/// `--stats FILE`: the thread that rewrites it every second.
struct StatsWriter {
    path: PathBuf,
    done: Arc<AtomicBool>,
    thread: std::io::Result<std::thread::JoinHandle<()>>,
}

impl StatsWriter {
    /// Writes the counters of `ctrl`'s subsystem to `path` every second.
    fn start(ctrl: &Arc<Controller>, path: PathBuf) -> Self {
        let ctrl = Arc::clone(ctrl);
        let done = Arc::new(AtomicBool::new(false));
        let (d, p) = (Arc::clone(&done), path.clone());
        let thread = std::thread::Builder::new()
            .name("vnvme-stats".into())
            .spawn(move || stats_loop(&ctrl, &p, &d));
        Self { path, done, thread }
    }

    /// Stops the thread and writes the file a last time, from `ctrl`.
    fn finish(self, ctrl: &Controller) {
        self.done.store(true, Ordering::Release);
        match self.thread {
            Ok(t) => {
                let _ = t.join();
            }
            Err(e) => tracing::warn!("stats thread did not start: {e}"),
        }
        if let Err(e) = write_stats(ctrl, &self.path) {
            tracing::warn!("writing stats to {}: {e:#}", self.path.display());
        }
    }
}

/// Rewrites the stats file every second until `done`.
fn stats_loop(ctrl: &Controller, path: &Path, done: &AtomicBool) {
    let mut last_error: Option<String> = None;
    let mut next = Instant::now();
    while !done.load(Ordering::Acquire) {
        if Instant::now() >= next {
            next += Duration::from_secs(1);
            match write_stats(ctrl, path) {
                Ok(()) => last_error = None,
                Err(e) => {
                    // Warn once per distinct failure, not every second.
                    let msg = format!("{e:#}");
                    if last_error.as_deref() != Some(msg.as_str()) {
                        tracing::warn!("writing stats to {}: {msg}", path.display());
                        last_error = Some(msg);
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Writes the counters as JSON to a temporary file next to `path`, then
/// renames it over `path`, so a reader never sees half a file.
pub fn write_stats(ctrl: &Controller, path: &Path) -> Result<()> {
    let value = crate::metrics::stats_json(ctrl).context("serialising counters")?;
    let json = serde_json::to_vec_pretty(&value).context("serialising counters")?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, json).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace::NamespaceSpec;

    #[test]
    fn stats_file_is_complete_json() {
        let dir = std::env::temp_dir().join(format!("vnvme-stats-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stats.json");
        let ns: NamespaceSpec = "1M:null".parse().unwrap();
        let device = DeviceOptions::default()
            .build(&[ns], &Origin::embedded())
            .unwrap();
        write_stats(device.controller(), &path).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(v["sq_doorbell_traps"], 0);
        assert!(v.get("worker_wakeups").is_some());
        assert!(v.get("shadow_errors").is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
