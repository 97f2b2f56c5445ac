//! The device as the command line and configuration file describe it:
//! [`DeviceOptions`] become the `vnvme-device` library's plain
//! [`DeviceConfig`], and with the namespaces' backends opened, an
//! [`NvmeDevice`].

use anyhow::{bail, Context, Result};
use clap::Args;
use vnvme_controller::{
    ControllerConfig, DoorbellMode, NamespaceConfig, PollGroups, DEFAULT_DOZE, DEFAULT_IDLE_POLL,
    DEFAULT_READY_TIMEOUT, DEFAULT_SANITIZE_RATE, DEFAULT_SELF_TEST_RATE, MAX_NAMESPACES,
};
use vnvme_device::{DeviceConfig, Interrupts, MAX_MSIX_VECTORS};

pub use vnvme_device::NvmeDevice;

use crate::identity::Origin;
use crate::namespace::NamespaceSpec;

/// Most I/O queue pairs `--max-io-queues` accepts: the default vectors, one
/// per I/O queue plus the admin queue's, then fit the MSI-X table.
pub const MAX_IO_QUEUES: u16 = MAX_MSIX_VECTORS - 1;
/// Most queue worker threads `--workers` accepts.
pub const MAX_WORKERS: u64 = 64;

/// Controller options shared by `vnvme serve` and `vnvme bench`.
#[derive(Args, Debug, Clone)]
pub struct DeviceOptions {
    /// Serial number reported by Identify Controller (1 to 20 ASCII
    /// characters). Default: `VNVME-` and 14 hex digits derived from the
    /// host's machine-id and the socket path, the same at every start, so
    /// that disks of several servers never look alike to a guest.
    #[arg(long, value_parser = crate::identity::parse_serial)]
    pub serial: Option<String>,
    /// NVM Subsystem NQN reported by Identify Controller. Default
    /// nqn.2024-01.io.vnvme:SERIAL.
    #[arg(long, value_parser = crate::identity::parse_nqn)]
    pub nqn: Option<String>,
    /// I/O queue pairs the controller grants at most.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..=i64::from(MAX_IO_QUEUES)))]
    pub max_io_queues: u16,
    /// MSI-X vectors (default: one per I/O queue plus the admin queue); fewer than queues means vectors are shared.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=i64::from(MAX_MSIX_VECTORS)))]
    pub msix_vectors: Option<u16>,
    /// Message-signalled interrupts the PCI function offers: msix (a
    /// vector per queue) or msi (no MSI-X capability; an x86 guest without
    /// interrupt remapping gets one vector, so Linux uses one I/O queue).
    /// Use msi for VMs whose disks are detached at run time: QEMU 11.1
    /// aborts the VM on `device_del` of a vfio-user-pci device with MSI-X
    /// (see docs/hotplug.md, "Attaching and detaching at run time"). With msi,
    /// `--msix-vectors` is rounded down to a power of two, at most 32.
    #[arg(long, value_name = "KIND", default_value_t = Interrupts::Msix)]
    pub interrupts: Interrupts,
    /// Queue worker threads in the controller (its I/O queues spread over them; the admin queue has
    /// a thread of its own besides). With a --config file of `[[controllers]]`: the poll-group
    /// threads that serve every controller's queues, admin queues included.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=MAX_WORKERS))]
    pub workers: u64,
    /// How guest doorbell writes reach the controller: trap (every write is
    /// a vfio-user message), shadow (Doorbell Buffer Config, QEMU's
    /// algorithm), adaptive (shadow doorbells and the mappable doorbell page,
    /// polled while busy, armed when idle; what QEMU and SPDK's host both
    /// use well) or mmap-poll (only the doorbell page, polled). SPDK's host
    /// needs the page: adaptive or mmap-poll.
    #[arg(long, value_name = "MODE", default_value_t = DoorbellMode::Adaptive)]
    pub doorbells: DoorbellMode,
    /// How the queue workers poll.
    #[command(flatten)]
    pub polling: PollingOptions,
    /// Model number reported by Identify Controller.
    #[arg(long, default_value = "vnvme")]
    pub model: String,
    /// How long hosts should wait for namespaces to become ready (CRTO,
    /// CAP.TO; raised to cover the slowest `ready=`), and after which a
    /// never-ready namespace answers with DNR set. Default 5s.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse_duration)]
    pub ready_timeout: Option<std::time::Duration>,
    /// Namespaces the subsystem supports (Identify Controller NN, at most
    /// 1024; default: as many as configured): Namespace Management creates
    /// namespaces with free NSIDs up to it.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=i64::from(MAX_NAMESPACES)))]
    pub max_namespaces: u32,
    /// Total NVM capacity (TNVMCAP) namespaces are allocated from; what the
    /// configured namespaces leave is where Namespace Management creates
    /// RAM namespaces. Default: no room beyond the configured namespaces.
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_size)]
    pub nvm_capacity: Option<u64>,
    /// How long Format NVM keeps a namespace busy (I/O gets Format In
    /// Progress meanwhile). Default 0.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse_duration)]
    pub format_duration: Option<std::time::Duration>,
    /// How much medium a sanitize goes over per second (e.g. 64M; an
    /// Overwrite takes this per pass, a Crypto Erase goes 16 times
    /// faster): the Sanitize Status log's progress and estimates follow.
    /// 0: as fast as the backends go. Default 1G.
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_size)]
    pub sanitize_rate: Option<u64>,
    /// How much medium a device self-test reads per second (a short test
    /// reads 1/16 of it; Identify Controller EDSTT follows). 0: as fast as
    /// the backends go. Default 32M.
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_size)]
    pub self_test_rate: Option<u64>,
    /// Offer NVM Subsystem Reset (CAP.NSSRS; `nvme subsystem-reset`). Off
    /// by default, as in QEMU: Linux recovers from it only when a command
    /// times out (about 30 s), as a vfio-user device has no PCIe link to drop.
    #[arg(long)]
    pub nssr: bool,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        Self {
            serial: None,
            nqn: None,
            max_io_queues: 64,
            msix_vectors: None,
            interrupts: Interrupts::Msix,
            workers: 1,
            doorbells: DoorbellMode::default(),
            polling: PollingOptions::default(),
            model: "vnvme".into(),
            ready_timeout: None,
            max_namespaces: 0,
            nvm_capacity: None,
            format_duration: None,
            sanitize_rate: None,
            self_test_rate: None,
            nssr: false,
        }
    }
}

/// The queue workers' polling (`vnvme serve`, and `vnvme bench` to compare
/// settings in one binary).
#[derive(Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct PollingOptions {
    /// Adaptive: microseconds of polling without work before a worker arms
    /// EventIdx and sleeps. Mmap-poll: spin time before backing off.
    #[arg(long, value_name = "US", value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub idle_poll_us: Option<u64>,
    /// Adaptive: let each worker shrink its poll window (down to 0) when polling
    /// finds nothing or loses the core, and grow it when it pays.
    #[arg(long)]
    pub adaptive_window: bool,
    /// Adaptive: microseconds after the poll window during which a worker
    /// still looks at the shadow doorbells every 25 µs, sleeping in between,
    /// before it arms EventIdx (0: arm at once). Default 1000.
    #[arg(long, value_name = "US", value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub doze_us: Option<u64>,
    /// Keep the I/O queue workers in the usual scheduling class. By default a
    /// worker that has to fight for a core (waiting over 8% of the time for
    /// 200 ms) moves to the idle class (SCHED_IDLE: a core only when no
    /// other thread wants one, so its polling does not delay a guest's
    /// vCPUs), and back when it has a core again or starves.
    #[arg(long)]
    pub no_idle_class: bool,
    /// Raise each I/O completion's interrupt at once. By default, for a slow host (commands more
    /// than 25 µs apart, as from a TCG guest), an interrupt waits (at most 2 ms) while the host is
    /// still submitting below the queue depth it has shown, so a host that fills its queue gets
    /// one interrupt when it is full; a host at QD 1 is never held.
    #[arg(long)]
    pub no_irq_batching: bool,
}

impl PollingOptions {
    /// The same settings as `vnvme serve` arguments.
    pub fn serve_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(us) = self.idle_poll_us {
            args.extend(["--idle-poll-us".to_string(), us.to_string()]);
        }
        if self.adaptive_window {
            args.push("--adaptive-window".to_string());
        }
        if let Some(us) = self.doze_us {
            args.extend(["--doze-us".to_string(), us.to_string()]);
        }
        if self.no_idle_class {
            args.push("--no-idle-class".to_string());
        }
        if self.no_irq_batching {
            args.push("--no-irq-batching".to_string());
        }
        args
    }
}

impl DeviceOptions {
    /// The serial number: the one given, else the one derived for a
    /// controller served at `origin`.
    pub fn serial(&self, origin: &Origin) -> String {
        self.serial.clone().unwrap_or_else(|| origin.serial())
    }

    /// The controller these options describe, served at `origin`.
    pub fn controller_config(&self, origin: &Origin) -> ControllerConfig {
        ControllerConfig {
            serial: self.serial(origin),
            subnqn: self.nqn.clone(),
            max_io_queues: self.max_io_queues,
            workers: usize::try_from(self.workers).unwrap_or(1),
            doorbells: self.doorbells,
            idle_poll: self
                .polling
                .idle_poll_us
                .map_or(DEFAULT_IDLE_POLL, std::time::Duration::from_micros),
            adaptive_window: self.polling.adaptive_window,
            doze: self
                .polling
                .doze_us
                .map_or(DEFAULT_DOZE, std::time::Duration::from_micros),
            idle_class: !self.polling.no_idle_class,
            batch_interrupts: !self.polling.no_irq_batching,
            model: self.model.clone(),
            ready_timeout: self.ready_timeout.unwrap_or(DEFAULT_READY_TIMEOUT),
            max_namespaces: self.max_namespaces,
            nvm_capacity: self.nvm_capacity.unwrap_or(0),
            format_duration: self.format_duration.unwrap_or_default(),
            sanitize_rate: self.sanitize_rate.unwrap_or(DEFAULT_SANITIZE_RATE),
            self_test_rate: self.self_test_rate.unwrap_or(DEFAULT_SELF_TEST_RATE),
            nssr: self.nssr,
            ..ControllerConfig::default()
        }
    }

    /// The device these options describe, served at `origin` (which gives
    /// its default identity), with `namespaces` as NSIDs 1, 2, ... in order
    /// (their backends opened here).
    pub fn build(&self, namespaces: &[NamespaceSpec], origin: &Origin) -> Result<NvmeDevice> {
        let namespaces = self.namespace_configs(namespaces, origin)?;
        self.build_from(namespaces, origin, None)
    }

    /// The namespaces' configurations (their backends opened here), NSIDs
    /// 1, 2, ... in order.
    pub fn namespace_configs(
        &self,
        namespaces: &[NamespaceSpec],
        origin: &Origin,
    ) -> Result<Vec<NamespaceConfig>> {
        // Before any backend is opened.
        if namespaces.len() > MAX_NAMESPACES as usize {
            bail!(
                "at most {MAX_NAMESPACES} namespaces are supported ({} given)",
                namespaces.len()
            );
        }
        let serial = self.serial(origin);
        namespaces
            .iter()
            .zip(1u32..)
            .map(|(spec, nsid)| {
                spec.config(nsid, &serial)
                    .with_context(|| format!("namespace {nsid}"))
            })
            .collect()
    }

    /// The device with `namespaces` ([`namespace_configs`](Self::namespace_configs)),
    /// its queues served by `groups` if given (else by threads of its own).
    pub fn build_from(
        &self,
        namespaces: Vec<NamespaceConfig>,
        origin: &Origin,
        groups: Option<PollGroups>,
    ) -> Result<NvmeDevice> {
        Ok(NvmeDevice::new(
            self.device_config(namespaces, origin, groups),
        )?)
    }

    /// What [`build_from`](Self::build_from) builds the device from (a
    /// live upgrade's next process restores one from it).
    pub fn device_config(
        &self,
        namespaces: Vec<NamespaceConfig>,
        origin: &Origin,
        groups: Option<PollGroups>,
    ) -> DeviceConfig {
        DeviceConfig {
            msix_vectors: self.msix_vectors,
            interrupts: self.interrupts,
            poll_groups: groups,
            ..DeviceConfig::new(self.controller_config(origin), namespaces)
        }
    }

    /// Another controller, CNTLID `cntlid`, of `first`'s NVM subsystem
    /// (the same serial and NQN, the namespaces shared), its queues served
    /// by `groups`.
    pub fn build_joining(
        &self,
        first: &NvmeDevice,
        cntlid: u16,
        origin: &Origin,
        groups: Option<PollGroups>,
    ) -> Result<NvmeDevice> {
        Ok(NvmeDevice::new(
            self.joining_config(first, cntlid, origin, groups),
        )?)
    }

    /// What [`build_joining`](Self::build_joining) builds the device from
    /// (a live upgrade's next process restores one from it).
    pub fn joining_config(
        &self,
        first: &NvmeDevice,
        cntlid: u16,
        origin: &Origin,
        groups: Option<PollGroups>,
    ) -> DeviceConfig {
        let controller = ControllerConfig {
            cntlid,
            ..self.controller_config(origin)
        };
        DeviceConfig {
            msix_vectors: self.msix_vectors,
            interrupts: self.interrupts,
            poll_groups: groups,
            subsystem_of: Some(std::sync::Arc::clone(first.controller())),
            ..DeviceConfig::new(controller, Vec::new())
        }
    }
}
