//! `vnvme serve --socket A --socket B ...` (or `sockets = [...]` in the
//! configuration): one NVM subsystem with a controller per socket. The
//! controllers have one serial number and subsystem NQN (derived from the
//! first socket unless given), CNTLID 1, 2, ... in the order of the
//! sockets, and share the namespaces: Linux joins them into one
//! nvme-subsystem whose namespaces have a path per controller (native
//! multipath), or VMs on different controllers share the disks.
//!
//! Each controller has its own thread for its client's messages, and its
//! own queues, features, events and resets; their queues run on one set of
//! poll-group threads (`--workers`), as `[[controllers]]` do (see
//! `many.rs`). A controller's client resetting or dying touches only it.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use vnvme_controller::{FaultKind, PollGroups};
use vnvme_vfio_user::activation::Activated;

use vnvme_device::NvmeDevice;
use vnvme_vfio_user::handover::{Adopted, Handover};
use vnvme_vfio_user::ServerOptions;

use super::many::Serving;
use super::{watch_stop, ServeOptions, StatsWriter, DEFAULT_SOCKET, STOP_TIMEOUT};
use crate::config::ConfiguredFault;
use crate::control::{ControlServer, Hooks};
use crate::identity::Origin;
use crate::qos::QosSpec;
use crate::socket::{Listening, Plan, SocketFile};
use crate::stopping::Stop;
use crate::upgrade::{
    Door as UpgradeDoor, OtherSockets, Reporter, Several, Taken, TakenController,
};

/// What the one-subsystem configuration file adds to the command line.
pub(super) struct FileParts {
    pub faults: Vec<ConfiguredFault>,
    pub qos: QosSpec,
    pub qos_groups: BTreeMap<String, vnvme_controller::QosLimits>,
}

/// Serves the subsystem until stopped; with `handover`, the one a live
/// upgrade's old process handed over (every controller's client, state and
/// socket).
pub(super) fn run(
    opts: &ServeOptions,
    inherited: Option<Activated>,
    file: FileParts,
    mut handover: Option<(Taken, &mut Reporter)>,
) -> Result<()> {
    if inherited.is_some() {
        bail!(
            "a launcher passed one socket (LISTEN_FDS, socket activation), but several --socket \
             name a controller each: serve the subsystem without socket activation"
        );
    }
    let count = u16::try_from(opts.socket.len())
        .ok()
        .filter(|&n| n < 0xFFF0)
        .context("too many --socket: a subsystem has at most 65519 controllers (CNTLID)")?;
    let stop_timeout = opts.stop_timeout.unwrap_or(STOP_TIMEOUT);
    if stop_timeout.is_zero() {
        bail!("--stop-timeout must be more than 0");
    }
    let server = opts.server_options()?;
    // Every socket's plan first: a group that does not exist, or one path
    // given twice, fails the start before any device exists.
    let mut plans = Vec::new();
    let handed = match handover.as_mut() {
        Some((t, _)) => Some(handed_controllers(t, opts)?),
        None => None,
    };
    for (i, socket) in opts.socket.iter().enumerate().filter(|_| handed.is_none()) {
        let absolute = std::path::absolute(socket).unwrap_or_else(|_| socket.clone());
        if opts.socket[..i]
            .iter()
            .any(|s| std::path::absolute(s).unwrap_or_else(|_| s.clone()) == absolute)
        {
            bail!(
                "--socket {} is given twice: each controller needs its own socket",
                socket.display()
            );
        }
        let plan = Plan::new(
            None,
            Some(socket),
            Path::new(DEFAULT_SOCKET),
            opts.socket_mode,
            opts.socket_group.as_deref(),
        )
        .with_context(|| format!("--socket {}", socket.display()))?;
        plans.push(plan);
    }
    let groups = PollGroups::new(usize::try_from(opts.device.workers).unwrap_or(usize::MAX))
        .context("starting the poll-group threads (--workers)")?;
    // The subsystem's identity is the first socket's: its serial and NQN.
    let origin = Origin::socket(&opts.socket[0]);
    let mut namespaces = opts.device.namespace_configs(&opts.namespaces, &origin)?;
    // The ram namespaces' data, as the process before this one left it.
    if let Some((t, _)) = handover.as_mut() {
        crate::upgrade::ram::adopt(&mut namespaces, std::mem::take(&mut t.ram))?;
    }
    let backends: Vec<_> = namespaces.iter().map(|n| Arc::clone(&n.backend)).collect();
    let (devices, mut adopted, listeners) = match handed {
        None => {
            let first = opts
                .device
                .build_from(namespaces, &origin, Some(groups.clone()))
                .context("controller 1")?;
            let mut devices = vec![first];
            for cntlid in 2..=count {
                let device = opts
                    .device
                    .build_joining(&devices[0], cntlid, &origin, Some(groups.clone()))
                    .with_context(|| format!("controller {cntlid}"))?;
                devices.push(device);
            }
            (devices, Vec::new(), None)
        }
        Some(handed) => {
            let (devices, adopted, listeners) =
                restore_all(opts, &server, &origin, namespaces, &groups, handed)?;
            (devices, adopted, Some(listeners))
        }
    };
    let qos_groups = crate::qos::groups(&file.qos_groups)?;
    let ns_qos = || opts.namespaces.iter().map(|ns| &ns.qos);
    crate::qos::check_controllers(&file.qos, ns_qos(), 1..=count)?;
    // Every controller its limits (those without `controller = N`), each
    // its own budget; a group is one budget for all who join it.
    for (i, device) in devices.iter().enumerate() {
        crate::qos::apply_all(device.controller(), &file.qos, ns_qos(), &qos_groups)
            .with_context(|| format!("controller {}", i + 1))?;
    }
    // Armed once every controller has joined: an `ana` fault names one
    // (and is armed once, through controller 1, which reaches every
    // path); another kind is armed on the controller it names, or on
    // every one (each its own copy with one id: a count is per controller).
    for (i, f) in file.faults.into_iter().enumerate() {
        let what = || format!("[[fault]] number {} of the configuration", i + 1);
        let on: Vec<_> = match f.controller {
            _ if matches!(f.spec.kind, FaultKind::Ana(_)) => vec![&devices[0]],
            None => devices.iter().collect(),
            Some(n) => match devices.get(usize::from(n).wrapping_sub(1)) {
                Some(d) => vec![d],
                None => bail!(
                    "{}: controller = {n}: the subsystem has controllers 1 to {count} (CNTLID, \
                     in --socket order)",
                    what()
                ),
            },
        };
        let on: Vec<_> = on.into_iter().map(|d| d.controller()).collect();
        crate::control::faults::arm(&on, f.spec).with_context(what)?;
    }
    let identity = opts.device.controller_config(&origin);
    // Every controller's counters, through controller 1 (which reaches
    // the subsystem's): held here, so the last --stats write at exit still
    // has every controller.
    let controllers: Vec<_> = devices.iter().map(|d| Arc::clone(d.controller())).collect();
    // Before the sockets: a --metrics address in use fails the start
    // without leaving socket files behind.
    let mut handed_on = OtherSockets::default();
    let handed_metrics = handover.as_mut().and_then(|(t, _)| t.metrics.take());
    let metrics = match (opts.metrics, handed_metrics) {
        (Some(addr), handed) => {
            let listener = match handed {
                Some(l) => l,
                None => crate::metrics::http::MetricsServer::bind(addr)?,
            };
            handed_on.metrics = Some(listener.try_clone().context("copying the metrics socket")?);
            let m =
                crate::metrics::http::MetricsServer::serve(listener, Arc::clone(&controllers[0]))?;
            tracing::info!("metrics on http://{}/metrics", m.addr());
            Some(m)
        }
        (None, None) => None,
        (None, Some(_)) => bail!(
            "the handover has a metrics socket and this process no --metrics: not this server's handover"
        ),
    };
    let stop = Stop::new()?;
    stop.on_signals()?;
    // Dropped (their files removed) on every return.
    let listening = match listeners {
        Some(l) => l,
        None => {
            let mut listening = Vec::new();
            for (plan, socket) in plans.into_iter().zip(&opts.socket) {
                listening.push(
                    plan.listen()
                        .with_context(|| format!("--socket {}", socket.display()))?,
                );
            }
            listening
        }
    };
    let requests = crate::upgrade::Requests::new(server.message_timeout)?;
    // One control socket: controller 1's, which reaches the subsystem's
    // ANA states on every controller (ana_set controller=N) and, through
    // the others, their faults (fault_add controller=N).
    let handed_control = handover.as_mut().and_then(|(t, _)| t.control.take());
    if handover.is_some() && handed_control.is_some() != opts.control.is_some() {
        bail!("the handover's control socket does not match --control: not this server's handover");
    }
    let control = match &opts.control {
        Some(path) => {
            let (listener, file) = match handed_control {
                Some(l) => (
                    l,
                    SocketFile::existing(path).with_context(|| {
                        format!("the handed-over control socket {}", path.display())
                    })?,
                ),
                None => crate::control::bind(path, opts.control_mode)?,
            };
            handed_on.control = Some(listener.try_clone().context("copying the control socket")?);
            let hooks = Hooks {
                stop: stop.clone(),
                upgrade: Some(Arc::clone(&requests)),
                peers: controllers[1..].to_vec(),
                // Several controllers are refused under --supervise.
                supervised: false,
            };
            Some(ControlServer::serve(
                listener,
                file,
                Arc::clone(devices[0].controller()),
                hooks,
            )?)
        }
        None => None,
    };
    let mut doors = Vec::new();
    for l in &listening {
        doors.push(UpgradeDoor {
            listener: (l.listener().try_clone()).context("copying a listening socket")?,
            owned: l.own_file().is_some(),
        });
    }
    let several = Several::new(
        requests,
        doors,
        controllers.clone(),
        handed_on,
        backends.clone(),
        devices[0].controller().namespace_backends(),
        super::cannot_upgrade(&backends),
        server.message_timeout,
    )?;
    let members: Vec<_> = (0..devices.len()).map(|i| several.member(i)).collect();
    let own = listening.iter().filter_map(|l| l.own_file()).collect();
    watch_stop(stop.clone(), stop_timeout, own)?;
    for (i, socket) in opts.socket.iter().enumerate() {
        tracing::info!(
            cntlid = i + 1,
            socket = %socket.display(),
            "serving controller {} of the subsystem over vfio-user",
            i + 1
        );
    }
    tracing::info!(
        controllers = devices.len(),
        serial = %identity.serial,
        nqn = %identity.nqn(),
        namespaces = opts.namespaces.len(),
        workers = groups.len(),
        "serving one NVM subsystem; attach each socket with -device \
         '{{\"driver\":\"vfio-user-pci\",\"socket\":{{\"path\":\"SOCKET\",\"type\":\"unix\"}}}}'"
    );
    let stats = (opts.stats.clone()).map(|path| StatsWriter::start(&controllers[0], path));
    adopted.resize_with(devices.len(), || None);
    let reporter = handover.map(|(_, r)| r);
    let failed = super::many::serve_each_handing(
        (listening.iter().zip(devices).zip(&members).zip(adopted))
            .enumerate()
            .map(|(i, (((l, device), member), adopted))| Serving {
                name: format!("controller {}", i + 1),
                listener: l.listener(),
                server: server.clone(),
                device,
                handover: Some(member as &dyn Handover<NvmeDevice>),
                adopted,
            }),
        &stop,
        || match reporter {
            Some(r) => r.ready(),
            // A successor is not the main process yet (see serve.rs).
            None => crate::notify::ready(),
        },
    );
    drop(listening);
    drop(control);
    if let Some(m) = metrics {
        m.stop();
    }
    if let Some(stats) = stats {
        stats.finish(&controllers[0]);
    }
    drop(controllers);
    if failed > 0 {
        bail!("{failed} controller(s) stopped serving with an error (logged above)");
    }
    tracing::info!("stopped");
    Ok(())
}

/// The controllers a live upgrade's old process handed over, checked
/// against this process's `--socket`s (the same arguments, so they agree
/// unless the handover is not ours).
fn handed_controllers(t: &mut Taken, opts: &ServeOptions) -> Result<Vec<TakenController>> {
    let handed = std::mem::take(&mut t.controllers);
    if handed.len() != opts.socket.len() || t.client.is_some() {
        bail!(
            "the handover has {} controllers and this server {} --socket: not this server's \
             handover",
            handed.len(),
            opts.socket.len()
        );
    }
    if handed.iter().any(|c| c.socket.is_some()) {
        bail!("the handover is a [[controllers]] server's: not this subsystem's handover");
    }
    // The first's socket again, where a one-controller handover has it.
    drop(t.listener.take());
    Ok(handed)
}

/// Each controller's device, its adopted client (if it had one) and its
/// listening socket.
type Restored = (Vec<NvmeDevice>, Vec<Option<Adopted>>, Vec<Listening>);

/// The subsystem restored from `handed`: the first controller whole (the
/// subsystem's shared parts with it), the others joining it; each with its
/// client's guest memory, or without a client. With every controller's
/// listening socket.
fn restore_all(
    opts: &ServeOptions,
    server: &ServerOptions,
    origin: &Origin,
    namespaces: Vec<vnvme_controller::NamespaceConfig>,
    groups: &PollGroups,
    handed: Vec<TakenController>,
) -> Result<Restored> {
    let mut namespaces = Some(namespaces);
    let mut devices: Vec<NvmeDevice> = Vec::new();
    let mut adopted = Vec::new();
    let mut listening = Vec::new();
    for (i, (c, socket)) in handed.into_iter().zip(&opts.socket).enumerate() {
        let what = || format!("restoring controller {}", i + 1);
        let cntlid = u16::try_from(i + 1).context("too many controllers")?;
        let config = match devices.first() {
            None => opts.device.device_config(
                namespaces.take().unwrap_or_default(),
                origin,
                Some(groups.clone()),
            ),
            Some(first) => opts
                .device
                .joining_config(first, cntlid, origin, Some(groups.clone())),
        };
        let (device, client) = match c.client {
            Some(client) => {
                let a = Adopted::new(
                    client.conn,
                    client.max_xfer,
                    server.message_timeout,
                    server.dma_limits,
                    &client.maps,
                    client.files,
                )
                .with_context(what)?;
                let device = NvmeDevice::restored(
                    config,
                    &client.function,
                    client.irqs,
                    client.doorbells,
                    &c.state,
                    a.dma(),
                )
                .with_context(what)?;
                (device, Some(a))
            }
            None if devices.is_empty() => {
                let device = NvmeDevice::new(config).with_context(what)?;
                device
                    .controller()
                    .restore_subsystem(&c.state)
                    .with_context(what)?;
                (device, None)
            }
            None => (
                NvmeDevice::joining_as_saved(config).with_context(what)?,
                None,
            ),
        };
        devices.push(device);
        adopted.push(client);
        listening.push(match c.socket_owned {
            true => Listening::Bound {
                listener: c.listener,
                file: SocketFile::existing(socket)
                    .with_context(|| format!("the handed-over socket {}", socket.display()))?,
            },
            false => Listening::Inherited {
                listener: c.listener,
                path: Some(socket.clone()),
            },
        });
    }
    Ok((devices, adopted, listening))
}
