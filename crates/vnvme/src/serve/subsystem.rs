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

use super::{watch_stop, ServeOptions, StatsWriter, DEFAULT_SOCKET, STOP_TIMEOUT};
use crate::config::ConfiguredFault;
use crate::control::ControlServer;
use crate::identity::Origin;
use crate::qos::QosSpec;
use crate::socket::Plan;
use crate::stopping::Stop;

/// What the one-subsystem configuration file adds to the command line.
pub(super) struct FileParts {
    pub faults: Vec<ConfiguredFault>,
    pub qos: QosSpec,
    pub qos_groups: BTreeMap<String, vnvme_controller::QosLimits>,
}

/// Serves the subsystem until stopped.
pub(super) fn run(
    opts: &ServeOptions,
    inherited: Option<Activated>,
    file: FileParts,
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
    for (i, socket) in opts.socket.iter().enumerate() {
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
    let first = opts
        .device
        .build_from(
            opts.device.namespace_configs(&opts.namespaces, &origin)?,
            &origin,
            Some(groups.clone()),
        )
        .context("controller 1")?;
    let qos_groups = crate::qos::groups(&file.qos_groups)?;
    let ns_qos = || opts.namespaces.iter().map(|ns| &ns.qos);
    crate::qos::check_controllers(&file.qos, ns_qos(), 1..=count)?;
    let mut devices = vec![first];
    for cntlid in 2..=count {
        let device = opts
            .device
            .build_joining(&devices[0], cntlid, &origin, Some(groups.clone()))
            .with_context(|| format!("controller {cntlid}"))?;
        devices.push(device);
    }
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
    let metrics = match opts.metrics {
        Some(addr) => {
            let listener = crate::metrics::http::MetricsServer::bind(addr)?;
            let m =
                crate::metrics::http::MetricsServer::serve(listener, Arc::clone(&controllers[0]))?;
            tracing::info!("metrics on http://{}/metrics", m.addr());
            Some(m)
        }
        None => None,
    };
    let stop = Stop::new()?;
    stop.on_signals()?;
    // Dropped (their files removed) on every return.
    let mut listening = Vec::new();
    for (plan, socket) in plans.into_iter().zip(&opts.socket) {
        listening.push(
            plan.listen()
                .with_context(|| format!("--socket {}", socket.display()))?,
        );
    }
    // One control socket: controller 1's, which reaches the subsystem's
    // ANA states on every controller (ana_set controller=N) and, through
    // the others, their faults (fault_add controller=N).
    let control = match &opts.control {
        Some(path) => Some(ControlServer::start(
            path,
            opts.control_mode,
            Arc::clone(&controllers[0]),
            controllers[1..].to_vec(),
            stop.clone(),
        )?),
        None => None,
    };
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
    let failed = super::many::serve_each(
        listening
            .iter()
            .zip(devices)
            .enumerate()
            .map(|(i, (l, device))| {
                (
                    format!("controller {}", i + 1),
                    l.listener(),
                    server.clone(),
                    device,
                )
            }),
        &stop,
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
