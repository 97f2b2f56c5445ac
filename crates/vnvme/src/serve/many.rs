//! `vnvme serve --config FILE` with `[[controllers]]`: several controllers
//! in one process, each on its own vfio-user socket, their listening
//! sockets kept by one thread, their clients' messages by another (one
//! epoll for every connection), their queues served by one set of poll
//! group threads (`workers`).
//!
//! A controller's client connecting, resetting or dying touches only that
//! controller: its messages are read piece by piece and its replies
//! queued, so it never holds the connection thread, and a reset stops only
//! its workers (see `vnvme_controller::PollGroups`).
//!
//! A live upgrade hands every controller to one new process at once
//! (`crate::upgrade::Many`, asked on any controller's control socket or
//! by SIGUSR2); that process, started with the same file, matches each
//! controller it is handed to its table by socket path (`run`'s
//! `handed_controllers`) and refuses if a table was added or removed.

use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use vnvme_blockdev::BlockDevice;
use vnvme_controller::{NamespaceConfig, NamespaceIds, PollGroups};
use vnvme_vfio_user::activation::Activated;
use vnvme_vfio_user::handover::{Adopted, Handover, HandoverAll};
use vnvme_vfio_user::{Door, ServerOptions};

use super::{watch_stop, ServeOptions, DEFAULT_SOCKET, STOP_TIMEOUT};
use crate::config::ControllerEntry;
use crate::control::{ControlServer, Hooks};
use crate::device::NvmeDevice;
use crate::identity::Origin;
use crate::socket::{Listening, Plan, SocketFile};
use crate::stopping::Stop;
use crate::upgrade::{Many, ManyMember, Reporter, Taken, TakenController};

/// Poll-group threads when neither `--workers` nor the file says: what one
/// controller has for its I/O queues today (`--workers`' default).
const DEFAULT_POLL_GROUPS: u64 = 1;

/// One controller, ready to serve.
struct Ready {
    name: String,
    socket: std::path::PathBuf,
    device: NvmeDevice,
    /// Its socket to make, or the one the previous process handed over.
    listen: Socket,
    server: vnvme_vfio_user::ServerOptions,
    control: Option<std::path::PathBuf>,
    /// Its control socket, handed over by the previous process.
    control_listener: Option<UnixListener>,
    /// Its client, handed over by the previous process.
    adopted: Option<Adopted>,
    backends: Vec<Arc<dyn BlockDevice>>,
}

/// A controller's listening socket, before it listens.
enum Socket {
    Plan(Plan),
    Handed(Listening),
}

/// Serves `controllers` until stopped. `workers` is the file's top-level
/// value; a `--workers` other than its default wins over it.
pub(super) fn run(
    opts: &ServeOptions,
    inherited: Option<Activated>,
    workers: Option<u64>,
    controllers: Vec<ControllerEntry>,
    mut handover: Option<(Taken, &mut Reporter)>,
) -> Result<()> {
    if inherited.is_some() {
        bail!(
            "a launcher passed one socket (LISTEN_FDS, socket activation), but the \
             [[controllers]] file names a socket per controller: serve it without socket \
             activation"
        );
    }
    for (given, flag) in [
        (!opts.socket.is_empty(), "--socket"),
        (opts.control.is_some(), "--control"),
        (!opts.namespaces.is_empty(), "--ns"),
        (opts.stats.is_some(), "--stats"),
        (opts.metrics.is_some(), "--metrics"),
    ] {
        if given {
            bail!(
                "{flag} describes one controller, and the configuration has [[controllers]]: set \
                 socket, control and namespaces in each [[controllers]] table (a controller's \
                 counters: vnvme ctl --control ITS_CONTROL stats)"
            );
        }
    }
    let threads = match (opts.device.workers, workers) {
        (cli, _) if cli != DEFAULT_POLL_GROUPS => cli,
        (_, Some(file)) => file,
        _ => DEFAULT_POLL_GROUPS,
    };
    let groups = PollGroups::new(usize::try_from(threads).unwrap_or(usize::MAX))
        .context("starting the poll-group threads (--workers)")?;
    let mut stop_timeout = opts.stop_timeout.unwrap_or(STOP_TIMEOUT);
    // What a live upgrade's old process handed over, in table order.
    let mut handed = match handover.as_mut() {
        Some((t, _)) => handed_controllers(t, &controllers)?,
        None => controllers.iter().map(|_| None).collect(),
    };
    // Identities first, over every controller, before any device starts.
    let mut built = Vec::new();
    let mut identities = Vec::new();
    for ((i, entry), handed) in controllers.into_iter().enumerate().zip(&mut handed) {
        let name = format!("controllers[{i}] ({})", entry.socket.display());
        let file = &entry.config;
        let device = file.apply(&opts.device);
        let origin = Origin::socket(&entry.socket);
        let namespaces = if file.namespaces.is_empty() {
            vec!["1G:ram".parse().map_err(anyhow::Error::msg)?]
        } else {
            file.namespaces.clone()
        };
        let mut configs = device
            .namespace_configs(&namespaces, &origin)
            .with_context(|| name.clone())?;
        // The ram namespaces' data, as the process before this one left it.
        if let Some(h) = handed.as_mut() {
            crate::upgrade::ram::adopt(&mut configs, std::mem::take(&mut h.ram))
                .with_context(|| name.clone())?;
        }
        let identity = device.controller_config(&origin);
        identities.push(Identity::new(
            &name,
            &identity.serial,
            &identity.nqn(),
            &configs,
        ));
        if let Some(t) = file.stop_timeout {
            stop_timeout = stop_timeout.max(t);
        }
        built.push((name, entry, device, origin, configs, namespaces));
    }
    check_unique(&identities)?;
    let mut ready = Vec::new();
    let mut message_timeout = std::time::Duration::ZERO;
    for ((name, entry, device, origin, configs, namespaces), handed) in
        built.into_iter().zip(handed)
    {
        let file = &entry.config;
        let mut o = opts.clone();
        o.max_dma_maps = o.max_dma_maps.or(file.max_dma_maps);
        o.max_dma_size = o.max_dma_size.or(file.max_dma_size);
        o.handshake_timeout = o.handshake_timeout.or(file.handshake_timeout);
        o.message_timeout = o.message_timeout.or(file.message_timeout);
        let server = o.server_options().with_context(|| name.clone())?;
        message_timeout = message_timeout.max(server.message_timeout);
        let backends: Vec<_> = configs.iter().map(|n| Arc::clone(&n.backend)).collect();
        let (nvme, listen, control_listener, adopted, qos) = match handed {
            None => {
                let plan = Plan::new(
                    None,
                    Some(&entry.socket),
                    Path::new(DEFAULT_SOCKET),
                    o.socket_mode.or(file.socket_mode),
                    o.socket_group.as_deref().or(file.socket_group.as_deref()),
                )
                .with_context(|| name.clone())?;
                let nvme = device
                    .build_from(configs, &origin, Some(groups.clone()))
                    .with_context(|| name.clone())?;
                (nvme, Socket::Plan(plan), None, None, None)
            }
            Some(h) => {
                if h.control.is_some() != entry.control.is_some() {
                    bail!(
                        "{name}: the running server's control socket and the configuration's \
                         control do not agree (one has it, the other not): restart the server \
                         to change control sockets"
                    );
                }
                let config = device.device_config(configs, &origin, Some(groups.clone()));
                let (nvme, adopted) = restore(config, &server, h.client, &h.state)
                    .with_context(|| format!("{name}: restoring the handed-over controller"))?;
                let listening = match h.socket_owned {
                    true => Listening::Bound {
                        listener: h.listener,
                        file: SocketFile::existing(&entry.socket).with_context(|| {
                            format!("{name}: the handed-over socket {}", entry.socket.display())
                        })?,
                    },
                    false => Listening::Inherited {
                        listener: h.listener,
                        path: Some(entry.socket.clone()),
                    },
                };
                (nvme, Socket::Handed(listening), h.control, adopted, h.qos)
            }
        };
        for (k, f) in file.faults.iter().enumerate() {
            let what = || format!("{name}: [[controllers.fault]] number {}", k + 1);
            crate::config::only_controller(f, nvme.controller()).with_context(what)?;
            nvme.controller()
                .fault_add(f.spec.clone())
                .with_context(what)?;
        }
        // A controller's QoS groups are its own: one budget for some of its
        // namespaces (and itself).
        let qos_groups = crate::qos::groups(&file.qos_groups).with_context(|| name.clone())?;
        let one = nvme.controller().cntlid();
        let ns_qos = namespaces.iter().map(|ns| &ns.qos);
        crate::qos::check_controllers(&file.qos, ns_qos, one..=one)
            .with_context(|| name.clone())?;
        crate::qos::apply_all(
            nvme.controller(),
            &file.qos,
            namespaces.iter().map(|ns| &ns.qos),
            &qos_groups,
        )
        .with_context(|| name.clone())?;
        // Limits changed at run time in the process this one took over from.
        if let Some(qos) = qos {
            qos.apply(nvme.controller()).with_context(|| name.clone())?;
        }
        ready.push(Ready {
            name,
            socket: entry.socket,
            device: nvme,
            listen,
            server,
            control: entry.control,
            control_listener,
            adopted,
            backends,
        });
    }
    let stop = Stop::new()?;
    stop.on_signals()?;
    let requests = crate::upgrade::Requests::new(message_timeout)?;
    // Dropped (their files removed) on every return.
    let mut serving = Vec::new();
    let mut devices = Vec::new();
    let mut members = Vec::new();
    for r in ready {
        let listening = match r.listen {
            Socket::Plan(plan) => plan.listen().with_context(|| r.name.clone())?,
            Socket::Handed(l) => l,
        };
        let ctrl = Arc::clone(r.device.controller());
        let (control, control_copy) = match &r.control {
            Some(path) => {
                let (listener, file) = match r.control_listener {
                    Some(l) => (
                        l,
                        SocketFile::existing(path).with_context(|| {
                            format!("the handed-over control socket {}", path.display())
                        })?,
                    ),
                    None => crate::control::bind(path, opts.control_mode)?,
                };
                let copy = listener.try_clone().context("copying a control socket")?;
                let hooks = Hooks {
                    stop: stop.clone(),
                    // Any controller's control socket upgrades the process.
                    upgrade: Some(Arc::clone(&requests)),
                    peers: Vec::new(),
                    supervised: false,
                };
                let server = ControlServer::serve(listener, file, Arc::clone(&ctrl), hooks)?;
                (Some(server), Some(copy))
            }
            None => (None, None),
        };
        members.push(ManyMember {
            name: r.name.clone(),
            socket: r.socket,
            listener: (listening.listener().try_clone()).context("copying a listening socket")?,
            owned: listening.own_file().is_some(),
            control: control_copy,
            configured: ctrl.namespace_backends(),
            controller: ctrl,
            unsupported: super::cannot_upgrade(&r.backends),
            backends: r.backends,
        });
        tracing::info!(controller = %r.name, "serving NVMe controller over vfio-user");
        devices.push((r.device, r.adopted));
        serving.push((r.name, r.server, listening, control));
    }
    let upgrade = Many::new(requests, members, message_timeout);
    let own = serving
        .iter()
        .filter_map(|(_, _, l, _)| l.own_file())
        .collect();
    watch_stop(stop.clone(), stop_timeout, own)?;
    tracing::info!(
        controllers = serving.len(),
        workers = groups.len(),
        "serving every controller; the poll-group threads are vnvme-pg0.."
    );
    let reporter = handover.map(|(_, r)| r);
    let failed = serve_each(
        serving
            .iter()
            .zip(devices)
            .map(|((name, server, listening, _), (device, adopted))| {
                (
                    name.clone(),
                    listening.listener(),
                    server.clone(),
                    device,
                    adopted,
                )
            }),
        &stop,
        Some(&upgrade),
        || match reporter {
            Some(r) => r.ready(),
            // A successor is not the main process yet (see serve.rs).
            None => crate::notify::ready(),
        },
    );
    drop(serving);
    if failed > 0 {
        bail!("{failed} controller(s) stopped serving with an error (logged above)");
    }
    tracing::info!("stopped");
    Ok(())
}

/// One controller for [`serve_each`]: its name for the log, listening
/// socket, options, device, and the client the previous process handed
/// over.
pub(super) type Handing<'a> = (
    String,
    &'a UnixListener,
    ServerOptions,
    NvmeDevice,
    Option<Adopted>,
);

/// The controllers a live upgrade's old process handed over, one per
/// `[[controllers]]` table in table order, matched by socket path: the
/// new process runs with the same file, and if a table was added or
/// removed since, it refuses (the old process serves on, and says why).
fn handed_controllers(
    t: &mut Taken,
    entries: &[ControllerEntry],
) -> Result<Vec<Option<TakenController>>> {
    if t.client.is_some() || t.crash.is_some() || t.supervisor.is_some() {
        bail!(
            "the handover is a one-controller server's, and the configuration has \
             [[controllers]]: not this server's handover"
        );
    }
    // The first's socket again, where a one-controller handover has it.
    drop(t.listener.take());
    let mut handed: Vec<TakenController> = std::mem::take(&mut t.controllers);
    if handed.iter().any(|c| c.socket.is_none()) {
        bail!(
            "the handover is a subsystem's (several --socket; {} controllers), and the \
             configuration has [[controllers]]: not this server's handover",
            handed.len()
        );
    }
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let mut out = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let at = handed
            .iter()
            .position(|c| c.socket.as_deref().map(absolute) == Some(absolute(&e.socket)));
        match at {
            Some(at) => out.push(Some(handed.swap_remove(at))),
            None => bail!(
                "controllers[{i}] (socket {}) is new in the configuration: the running server \
                 does not serve it, and an upgrade cannot add a controller; restart the server \
                 to serve it, or take its table out to upgrade",
                e.socket.display()
            ),
        }
    }
    if let Some(gone) = handed.first() {
        let socket = gone.socket.as_deref().unwrap_or(Path::new(""));
        bail!(
            "the running server serves a controller on {}, which the configuration no longer \
             has: an upgrade cannot remove a controller (its client would be dropped); put its \
             table back to upgrade, or restart the server",
            socket.display()
        );
    }
    Ok(out)
}

/// A handed-over controller's device from `config`: restored onto its
/// `client`'s guest memory, or, without one, its subsystem's parts
/// (namespaces, reservations, ...) from `state`.
fn restore(
    config: vnvme_device::DeviceConfig,
    server: &ServerOptions,
    client: Option<crate::upgrade::TakenClient>,
    state: &vnvme_controller::SavedState,
) -> Result<(NvmeDevice, Option<Adopted>)> {
    match client {
        Some(c) => {
            let a = Adopted::new(
                c.conn,
                c.max_xfer,
                server.message_timeout,
                server.dma_limits,
                &c.maps,
                c.files,
            )?;
            let device =
                NvmeDevice::restored(config, &c.function, c.irqs, c.doorbells, &c.state, a.dma())?;
            Ok((device, Some(a)))
        }
        None => {
            let device = NvmeDevice::new(config)?;
            device.controller().restore_subsystem(state)?;
            Ok((device, None))
        }
    }
}

/// What hosts tell one controller and its namespaces apart by.
struct Identity {
    name: String,
    serial: String,
    nqn: String,
    /// Each namespace's NSID and identifiers.
    namespaces: Vec<(u32, NamespaceIds)>,
}

impl Identity {
    fn new(name: &str, serial: &str, nqn: &str, namespaces: &[NamespaceConfig]) -> Self {
        Self {
            name: name.to_string(),
            serial: serial.to_string(),
            nqn: nqn.to_string(),
            // As the controller derives what the configuration leaves out.
            namespaces: namespaces
                .iter()
                .map(|ns| {
                    let ids = ns
                        .ids
                        .unwrap_or_else(|| NamespaceIds::for_controller(serial, ns.nsid));
                    (ns.nsid, ids)
                })
                .collect(),
        }
    }
}

/// Refuses two controllers of one process with the same serial number,
/// subsystem NQN or namespace identifier (NGUID, EUI-64, UUID): Linux
/// rejects the second controller ("Duplicate cntlid") or clears the
/// namespaces' identifiers, after which /dev/disk/by-id may name the wrong
/// disk. (Within one controller the controller itself refuses them.)
fn check_unique(all: &[Identity]) -> Result<()> {
    for (j, b) in all.iter().enumerate() {
        for a in &all[..j] {
            if a.serial == b.serial {
                bail!(
                    "{} and {} have the same serial number {}: give each its own serial",
                    a.name,
                    b.name,
                    a.serial
                );
            }
            if a.nqn == b.nqn {
                bail!(
                    "{} and {} have the same subsystem NQN {}: give each its own nqn",
                    a.name,
                    b.name,
                    a.nqn
                );
            }
            for (na, ia) in &a.namespaces {
                for (nb, ib) in &b.namespaces {
                    if let Some(id) = ia.shared_with(ib) {
                        bail!(
                            "{} namespace {na} and {} namespace {nb} have the same {id}: give \
                             each its own (nguid, eui64, uuid), or leave them out to have them \
                             derived",
                            a.name,
                            b.name
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

/// Serves every controller's client on one thread until `stop` (the
/// clients' connections: one epoll for all, each message read piece by
/// piece, so one client's connection, reset, stall or end holds up no
/// other's; see `vnvme_vfio_user::serve_many`), and keeps every
/// controller's listening socket on another (the doors: accepting and
/// refusing never wait on a client):
/// `(name for the log, listener, options, device, client handed over)`
/// per controller; `handover`: every controller's live upgrade, `ready`
/// once the threads run. Returns how many stopped with an error (logged);
/// a thread that cannot start sets `stop` and counts as one.
pub(super) fn serve_each<'a>(
    controllers: impl Iterator<Item = Handing<'a>>,
    stop: &Stop,
    handover: Option<&dyn HandoverAll<NvmeDevice>>,
    ready: impl FnOnce(),
) -> usize {
    let controllers: Vec<_> = controllers.collect();
    let count = controllers.len();
    let doors: Vec<Door> = controllers.iter().map(|_| Door::default()).collect();
    let watched: Vec<(&Door, &UnixListener)> = doors
        .iter()
        .zip(&controllers)
        .map(|(door, (_, listener, _, _, _))| (door, *listener))
        .collect();
    let servers: Vec<_> = controllers
        .into_iter()
        .zip(&doors)
        .map(|((name, _, server, device, adopted), door)| {
            let server = ServerOptions {
                stop_wake: Some(stop.wake().clone()),
                ..server
            };
            (
                name,
                vnvme_vfio_user::Server::with_options(device, server),
                door,
                adopted,
            )
        })
        .collect();
    // The doors' and the connections' waits that found nothing (none:
    // they wait on the stop, and on a client's deadline only while one
    // has one).
    let idle = AtomicU64::new(0);
    std::thread::scope(|scope| {
        let keeper = std::thread::Builder::new()
            .name("vfio-user-doors".into())
            .spawn_scoped(scope, || {
                Door::watch_all(&watched, stop.flag(), Some(stop.wake()), &idle)
            });
        if let Err(e) = keeper {
            tracing::error!("starting the thread of the controllers' sockets: {e}");
            stop.ask();
            return count;
        }
        let conns = std::thread::Builder::new()
            .name("vnvme-conns".into())
            .spawn_scoped(scope, || {
                let r = vnvme_vfio_user::serve_many_with(
                    servers,
                    stop.flag(),
                    stop.wake(),
                    &idle,
                    handover,
                );
                if let Err(e) = &r {
                    tracing::error!("serving the controllers' vfio-user clients: {e}");
                    // The doors' thread ends too.
                    stop.ask();
                }
                r.is_err()
            });
        // Every listener listens already: the clients may come.
        ready();
        match conns {
            Ok(h) => usize::from(h.join().unwrap_or(true)) * count,
            Err(e) => {
                tracing::error!("starting the controllers' connection thread: {e}");
                stop.ask();
                count
            }
        }
    })
}

/// One controller for [`serve_each_handing`].
pub(super) struct Serving<'a> {
    /// For the log.
    pub name: String,
    pub listener: &'a UnixListener,
    pub server: ServerOptions,
    pub device: NvmeDevice,
    /// Its part in a live upgrade of every controller.
    pub handover: Option<&'a dyn Handover<NvmeDevice>>,
    /// Its client, handed over by the previous process.
    pub adopted: Option<Adopted>,
}

/// As [`serve_each`], but each controller's client on a thread of its
/// own, which hands it over when `handover` asks (a subsystem's live
/// upgrade: each thread waits between two of its client's messages for
/// the others, which one shared thread could not); `ready` once every
/// thread runs.
pub(super) fn serve_each_handing<'a>(
    controllers: impl Iterator<Item = Serving<'a>>,
    stop: &Stop,
    ready: impl FnOnce(),
) -> usize {
    let controllers: Vec<_> = controllers.collect();
    let doors: Vec<Door> = controllers.iter().map(|_| Door::default()).collect();
    let watched: Vec<(&Door, &UnixListener)> = doors
        .iter()
        .zip(&controllers)
        .map(|(door, c)| (door, c.listener))
        .collect();
    // The doors' waits that found nothing (none: they wait on the stop).
    let idle = AtomicU64::new(0);
    std::thread::scope(|scope| {
        let keeper = std::thread::Builder::new()
            .name("vfio-user-doors".into())
            .spawn_scoped(scope, || {
                Door::watch_all(&watched, stop.flag(), Some(stop.wake()), &idle)
            });
        if let Err(e) = keeper {
            tracing::error!("starting the thread of the controllers' sockets: {e}");
            stop.ask();
            return controllers.len();
        }
        let handles: Vec<_> = controllers
            .into_iter()
            .zip(&doors)
            .map(|(c, door)| {
                std::thread::Builder::new()
                    .name("vnvme-conn".into())
                    .spawn_scoped(scope, move || {
                        let server = ServerOptions {
                            stop_wake: Some(stop.wake().clone()),
                            ..c.server
                        };
                        let mut s = vnvme_vfio_user::Server::with_options(c.device, server);
                        let r = s.serve_door_with(door, stop.flag(), c.handover, c.adopted);
                        if let Err(e) = &r {
                            tracing::error!("{}: serving vfio-user: {e}", c.name);
                        }
                        r.is_err()
                    })
            })
            .collect();
        // Every listener listens already: the clients may come.
        ready();
        let mut failed = 0;
        for h in handles {
            match h {
                Ok(h) => failed += usize::from(h.join().unwrap_or(true)),
                Err(e) => {
                    tracing::error!("starting a controller's connection thread: {e}");
                    stop.ask();
                    failed += 1;
                }
            }
        }
        failed
    })
}
