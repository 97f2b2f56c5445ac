//! Controller initialisation (NVMe 2.0 §3.5.1), reset and shutdown, and the
//! admin command path.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use vnvme_spec::command::Command;
use vnvme_spec::feature::{AsyncEventConfig, FeatureId, NumberOfQueues};
use vnvme_spec::identify::{oacs, oaes, Cns, IdentifyController, IDENTIFY_SIZE};
use vnvme_spec::regs::{self, offset, shutdown, Aqa, Cap, Cc, Crto, Csts, Doorbell};
use vnvme_spec::{AdminOpcode, Completion, Status};
use zerocopy::FromBytes;

use crate::access::{DeviceAccess, DmaBuffer, PAGE_SIZE};
use crate::admin::{self, AdminQueue};
use crate::doorbell::{DoorbellKind, NeedEvent, ShadowBuffers};
use crate::error::Error;
use crate::init::{InitMode, QueueSetup};
use crate::io::{IoQueue, IoQueueParts};
use crate::irq;
use crate::namespace::{self, Namespace, NamespaceSet, NamespaceState, Probe, ProbeCtx};
use crate::queue::{Backoff, QueueCounters, QueuePair};

mod events;

pub use events::AsyncEvent;

/// How to bring the controller up.
#[derive(Debug, Clone)]
pub struct InitOptions {
    /// I/O queue pairs to create (one per thread). The controller may grant fewer.
    pub io_queues: u16,
    /// Entries per I/O queue (capped by CAP.MQES).
    pub queue_depth: u16,
    /// Entries of the admin queues (capped by CAP.MQES and 4096).
    pub admin_depth: u16,
    /// Use MSI-X interrupts if the device offers them; else poll.
    pub interrupts: bool,
    /// Overrides the ready timeout derived from CAP.TO and CRTO.
    pub ready_timeout: Option<Duration>,
    /// Enable in Controller Ready Independent of Media mode (CC.CRIME) when
    /// CAP.CRMS.CRIMS offers it, as Linux does: CSTS.RDY comes at once and
    /// namespaces not ready yet are asked again (NSTAT) until the ready
    /// timeout, then left to their Namespace Attribute Changed event. Off
    /// (the default): ready with media, RDY waits for the namespaces and
    /// the scan sends a fixed number of commands.
    pub independent_of_media: bool,
    /// Time an admin command may take.
    pub admin_timeout: Duration,
    /// Time a synchronous I/O command may take.
    pub io_timeout: Duration,
    /// The driver's own transfer limit per command, further bounded by MDTS.
    pub max_transfer: usize,
    /// Send Doorbell Buffer Config (§5.8) when Identify Controller OACS bit 8
    /// offers it, and use shadow doorbells with EventIdx. If the command
    /// fails, the driver falls back to register writes.
    pub shadow_doorbells: bool,
    /// Shadow the admin queue's doorbells too, as the spec allows. Linux
    /// does not (false reproduces it).
    pub shadow_admin: bool,
    /// The need-event test deciding, per shadow update, whether the register
    /// must be written as well.
    pub need_event: NeedEvent,
    /// Map BAR0 areas the device offers as memory (the doorbell page, as
    /// vfio-user sparse mmap): doorbell writes become plain stores the device
    /// polls. When every doorbell in use is mapped, Doorbell Buffer Config is
    /// not sent: shadow updates would only add work.
    pub map_doorbells: bool,
    /// Fast (each queue created once) or the old learning dance, kept only
    /// to measure what it cost.
    pub init_mode: InitMode,
    /// Enable Namespace Attribute Notices (Set Features 0Bh) when Identify
    /// Controller OAES bit 8 offers them, and keep one Asynchronous Event
    /// Request outstanding: [`Controller::poll_events`] then picks up
    /// namespaces attached or made ready later.
    pub async_events: bool,
}

impl Default for InitOptions {
    fn default() -> Self {
        Self {
            io_queues: 1,
            queue_depth: 256,
            admin_depth: 32,
            interrupts: true,
            ready_timeout: None,
            independent_of_media: false,
            admin_timeout: Duration::from_secs(10),
            io_timeout: Duration::from_secs(30),
            max_transfer: 1 << 20,
            shadow_doorbells: true,
            shadow_admin: true,
            need_event: NeedEvent::Linux,
            map_doorbells: true,
            init_mode: InitMode::Fast,
            async_events: true,
        }
    }
}

/// An initialised NVMe controller.
#[derive(Debug)]
pub struct Controller {
    access: Arc<dyn DeviceAccess>,
    opts: InitOptions,
    cap: Cap,
    version: u32,
    ready_timeout: Duration,
    admin: Mutex<AdminQueue>,
    identify: Arc<IdentifyController>,
    namespaces: Arc<NamespaceSet>,
    /// Every NSID of the active list and what became of it, by NSID.
    ns_report: Mutex<BTreeMap<u32, NamespaceState>>,
    /// Identify CNS 08h (NSTAT) is used: an NVMe 2.0 controller.
    nstat: bool,
    io_queues: Mutex<Vec<Option<IoQueue>>>,
    io_queue_count: u16,
    max_transfer: usize,
    interrupts: bool,
    vectors: u16,
    doorbell_kind: DoorbellKind,
    generation: Arc<AtomicU64>,
    init: InitStats,
}

/// What initialisation cost.
#[derive(Debug, Clone, Default)]
struct InitStats {
    admin_commands: u64,
    by_opcode: BTreeMap<AdminOpcode, u64>,
    io_commands: u64,
    duration: Duration,
}

/// Everything `bring_up` produces; the part of a controller a reset replaces.
struct Live {
    cap: Cap,
    version: u32,
    ready_timeout: Duration,
    admin: AdminQueue,
    identify: Arc<IdentifyController>,
    namespaces: Arc<NamespaceSet>,
    ns_report: BTreeMap<u32, NamespaceState>,
    nstat: bool,
    io_queues: Vec<Option<IoQueue>>,
    max_transfer: usize,
    interrupts: bool,
    vectors: u16,
    doorbell_kind: DoorbellKind,
    init: InitStats,
}

impl Controller {
    /// Resets and initialises the controller behind `access`: admin queue,
    /// Identify, Number of Queues, one I/O queue pair per requested thread,
    /// and the active namespaces.
    pub fn init(access: Arc<dyn DeviceAccess>, opts: InitOptions) -> Result<Self, Error> {
        let generation = Arc::new(AtomicU64::new(0));
        let live = bring_up(&access, &opts, &generation)?;
        Ok(Self::from_live(access, opts, generation, live))
    }

    fn from_live(
        access: Arc<dyn DeviceAccess>,
        opts: InitOptions,
        generation: Arc<AtomicU64>,
        live: Live,
    ) -> Self {
        let io_queue_count = u16::try_from(live.io_queues.len()).unwrap_or(u16::MAX);
        Self {
            access,
            opts,
            cap: live.cap,
            version: live.version,
            ready_timeout: live.ready_timeout,
            admin: Mutex::new(live.admin),
            identify: live.identify,
            namespaces: live.namespaces,
            ns_report: Mutex::new(live.ns_report),
            nstat: live.nstat,
            io_queues: Mutex::new(live.io_queues),
            io_queue_count,
            max_transfer: live.max_transfer,
            interrupts: live.interrupts,
            vectors: live.vectors,
            doorbell_kind: live.doorbell_kind,
            generation,
            init: live.init,
        }
    }

    /// Sends any admin command and waits for it. With `data`, PRP1/PRP2 are
    /// set to cover the whole buffer. An error status is [`Error::AdminCommand`].
    pub fn admin(&self, cmd: Command, data: Option<&mut DmaBuffer>) -> Result<Completion, Error> {
        self.admin
            .lock()
            .execute(cmd, data.map(|d| &*d), self.opts.admin_timeout)
    }

    /// Sends `cmd` on the admin queue with PRPs for `len` bytes at `iova`
    /// when `data` is `Some((iova, len))`, and waits; the completion is
    /// returned whatever its status (the passthrough path).
    pub(crate) fn admin_raw(
        &self,
        cmd: Command,
        data: Option<(u64, usize)>,
    ) -> Result<Completion, Error> {
        self.admin
            .lock()
            .submit_wait(cmd, data, self.opts.admin_timeout)
    }

    /// Takes I/O queue pair `index` (0-based; its qid is `index + 1`) for
    /// exclusive use by one thread.
    pub fn take_io_queue(&self, index: usize) -> Result<IoQueue, Error> {
        let qid = u16::try_from(index + 1).unwrap_or(u16::MAX);
        let mut queues = self.io_queues.lock();
        let slot = queues.get_mut(index).ok_or(Error::NoSuchQueue(qid))?;
        slot.take().ok_or(Error::QueueTaken(qid))
    }

    /// I/O queue pairs created (what the controller granted, up to what was asked).
    pub fn io_queue_count(&self) -> u16 {
        self.io_queue_count
    }

    /// The Identify Controller data read at initialisation.
    pub fn identify(&self) -> &IdentifyController {
        &self.identify
    }

    /// Namespaces the driver can use now, in NSID order.
    pub fn namespaces(&self) -> Vec<Namespace> {
        self.namespaces.snapshot().1.to_vec()
    }

    /// Every namespace of the active list and its state: ready, not ready
    /// yet, or skipped, with the reason.
    pub fn namespace_report(&self) -> Vec<NamespaceState> {
        self.ns_report.lock().values().cloned().collect()
    }

    pub fn cap(&self) -> Cap {
        self.cap
    }

    /// The VS register.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Largest transfer of one command: the driver limit bounded by MDTS.
    pub fn max_transfer(&self) -> usize {
        self.max_transfer
    }

    /// How long the controller may take to become ready (CAP.TO, CRTO or the override).
    pub fn ready_timeout(&self) -> Duration {
        self.ready_timeout
    }

    /// Whether I/O queues were given interrupt vectors.
    pub fn interrupts_enabled(&self) -> bool {
        self.interrupts
    }

    /// MSI-X vectors in use (0 when polling). Fewer than queues + 1 means
    /// some are shared (see [`crate::irq`]).
    pub fn interrupt_vectors(&self) -> u16 {
        self.vectors
    }

    /// How the I/O queues' doorbells reach the device: register writes,
    /// shadow doorbells, or a mapped doorbell page.
    pub fn doorbell_kind(&self) -> DoorbellKind {
        self.doorbell_kind
    }

    /// Counters of the admin queue (doorbell writes and shadow updates).
    pub fn admin_counters(&self) -> QueueCounters {
        self.admin.lock().qp.counters
    }

    /// Admin commands sent during initialisation (see [`crate::init`] for
    /// the list), the Asynchronous Event Request left outstanding included.
    pub fn init_admin_commands(&self) -> u64 {
        self.init.admin_commands
    }

    /// [`init_admin_commands`](Self::init_admin_commands) by opcode name
    /// ([`AdminOpcode`]'s, e.g. `"create-io-cq"`).
    pub fn init_admin_by_opcode(&self) -> BTreeMap<String, u64> {
        admin::named(&self.init.by_opcode)
    }

    /// I/O commands sent during initialisation: the reads of
    /// [`InitMode::Learning`], 0 otherwise.
    pub fn init_io_commands(&self) -> u64 {
        self.init.io_commands
    }

    /// How long [`init`](Self::init) (or the last reset) took, namespace
    /// readiness waits included.
    pub fn init_duration(&self) -> Duration {
        self.init.duration
    }

    /// Admin commands sent since initialisation began, by opcode name.
    pub fn admin_by_opcode(&self) -> BTreeMap<String, u64> {
        self.admin.lock().by_opcode_names()
    }

    /// Admin commands sent since initialisation began.
    pub fn admin_commands(&self) -> u64 {
        self.admin.lock().commands
    }

    /// The device access the controller was built on.
    pub fn access(&self) -> &Arc<dyn DeviceAccess> {
        &self.access
    }

    /// Resets the controller (CC.EN = 0) and initialises it again with the
    /// same options. I/O queues taken before become stale: their next
    /// submission fails with [`Error::StaleQueue`].
    pub fn reset(&mut self) -> Result<(), Error> {
        self.generation.fetch_add(1, Ordering::Relaxed);
        self.access.disable_interrupts()?;
        let live = bring_up(&self.access, &self.opts, &self.generation)?;
        let access = Arc::clone(&self.access);
        let generation = Arc::clone(&self.generation);
        *self = Self::from_live(access, self.opts.clone(), generation, live);
        Ok(())
    }

    /// Normal shutdown (CC.SHN = 01b), waiting for CSTS.SHST = complete.
    /// I/O queues become stale.
    pub fn shutdown(&self) -> Result<(), Error> {
        self.generation.fetch_add(1, Ordering::Relaxed);
        let cc = Cc::from(self.access.read32(offset::CC)?).with_shn(shutdown::NORMAL);
        self.access.write32(offset::CC, cc.into())?;
        // RTD3E (µs) is the device's own estimate; never wait less than 5 s.
        let rtd3e = Duration::from_micros(u64::from(self.identify.rtd3e.get()));
        let timeout = rtd3e.clamp(Duration::from_secs(5), Duration::from_secs(60));
        wait_csts(&self.access, timeout, "complete shutdown", false, |c| {
            c.shst() == shutdown::COMPLETE
        })?;
        self.access.disable_interrupts()?;
        Ok(())
    }
}

/// Polls CSTS until `done`, failing on timeout, or on CFS when `fatal_is_error`.
fn wait_csts(
    access: &Arc<dyn DeviceAccess>,
    timeout: Duration,
    what: &'static str,
    fatal_is_error: bool,
    done: impl Fn(Csts) -> bool,
) -> Result<Csts, Error> {
    let deadline = Instant::now() + timeout;
    let mut backoff = Backoff::default();
    loop {
        let raw = access.read32(offset::CSTS)?;
        // All ones is what a vanished PCI device reads as: never "ready".
        if raw == u32::MAX {
            return Err(Error::ControllerFatal(what));
        }
        let csts = Csts::from(raw);
        if done(csts) {
            return Ok(csts);
        }
        if fatal_is_error && csts.cfs() {
            return Err(Error::ControllerFatal(what));
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::ReadyTimeout { what, timeout });
        }
        backoff.pause(deadline - now);
    }
}

fn bring_up(
    access: &Arc<dyn DeviceAccess>,
    opts: &InitOptions,
    generation: &Arc<AtomicU64>,
) -> Result<Live, Error> {
    let started = Instant::now();
    let cap = Cap::from(access.read64(offset::CAP)?);
    let version = access.read32(offset::VS)?;
    if cap.css() & 1 == 0 {
        return Err(Error::Unsupported(
            "CAP.CSS lacks the NVM command set".into(),
        ));
    }
    if cap.mpsmin() != 0 {
        return Err(Error::Unsupported(format!(
            "CAP.MPSMIN {} (4 KiB pages required)",
            cap.mpsmin()
        )));
    }
    // Linux waits max(CRTO.CRWMT, CAP.TO): some devices report CRTO = 0.
    let crto = Crto::from(access.read32(offset::CRTO)?);
    let units = u64::from(cap.to()).max(u64::from(crto.crwmt())).max(1);
    let ready_timeout = opts
        .ready_timeout
        .unwrap_or(Duration::from_millis(500 * units));
    let dstrd = cap.dstrd();
    let mqes = u32::from(cap.mqes_z()) + 1;
    // Before the first doorbell write: from here on, doorbells inside a
    // mapped area are stores, not traps.
    if opts.map_doorbells {
        if let Err(e) = access.map_registers() {
            tracing::warn!(error = %e, "mapping BAR0 areas failed, doorbells will trap");
        }
    }

    // §3.5.1: disable first; the controller may be enabled from before.
    let cc = Cc::from(access.read32(offset::CC)?);
    if cc.en() {
        access.write32(offset::CC, cc.with_en(false).into())?;
    }
    wait_csts(access, ready_timeout, "clear CSTS.RDY", false, |c| !c.rdy())?;

    let mut vectors = Vec::new();
    if opts.interrupts {
        match access.enable_interrupts(opts.io_queues.saturating_add(1)) {
            Ok(v) => vectors = v,
            Err(e) => tracing::warn!(error = %e, "interrupts unavailable, polling"),
        }
    }

    let admin_size = clamp_depth(opts.admin_depth, mqes.min(4096));
    let admin_qp = QueuePair::new(
        access,
        0,
        admin_size,
        dstrd,
        opts.max_transfer.max(IDENTIFY_SIZE),
    )?;
    let aqa = Aqa::new()
        .with_asqs_z(admin_size - 1)
        .with_acqs_z(admin_size - 1);
    access.write32(offset::AQA, aqa.into())?;
    access.write64(offset::ASQ, admin_qp.sq_iova())?;
    access.write64(offset::ACQ, admin_qp.cq_iova())?;
    let cc = Cc::new()
        .with_en(true)
        .with_css(0)
        .with_mps(0)
        .with_ams(0)
        .with_iosqes(6)
        .with_iocqes(4)
        .with_crime(opts.independent_of_media && cap.crims());
    // CRIME clear: Controller Ready With Media, so RDY means every namespace
    // that will become ready is (NVMe 2.0 §3.5.4), and the scan below finds
    // them ready with no polling. CRWMT counts from here.
    let enabled = Instant::now();
    access.write32(offset::CC, cc.into())?;
    wait_csts(access, ready_timeout, "set CSTS.RDY", true, |c| c.rdy())?;
    // Polled until the number of queues, hence the vector sharing, is known.
    let mut admin = AdminQueue::new(admin_qp, None);
    let timeout = opts.admin_timeout;

    let buf = access.dma_alloc(IDENTIFY_SIZE)?;
    admin.execute(admin::identify(Cns::CONTROLLER, 0), Some(&buf), timeout)?;
    let identify = IdentifyController::read_from_bytes(&buf.to_vec())
        // A size mismatch, all the error can say.
        .map_err(|_| Error::Unsupported("short identify data".into()))?;
    let max_transfer = max_transfer(opts.max_transfer, identify.mdts, cap.mpsmin());

    let count = if opts.io_queues > 0 {
        let want = NumberOfQueues::new()
            .with_nsqr_z(opts.io_queues - 1)
            .with_ncqr_z(opts.io_queues - 1);
        let cqe = admin.execute(
            admin::set_features(FeatureId::NUMBER_OF_QUEUES, want.into()),
            None,
            timeout,
        )?;
        // The answer holds NSQA/NCQA (0's based): what was allocated, which
        // may be fewer, or more, than asked for.
        let got = NumberOfQueues::from(cqe.dw0);
        u32::from(opts.io_queues)
            .min(u32::from(got.nsqr_z()) + 1)
            .min(u32::from(got.ncqr_z()) + 1) as u16
    } else {
        0
    };
    // Vectors are mapped from what is known now (granted queues and
    // vectors), never learnt: see `crate::irq`.
    let n_vectors = u16::try_from(vectors.len()).unwrap_or(u16::MAX);
    let (admin_irq, mut io_irqs) = irq::assign(vectors, count);
    admin.interrupt = admin_irq;

    let all_mapped = (0..=count).all(|qid| {
        [Doorbell::SqTail(qid), Doorbell::CqHead(qid)]
            .into_iter()
            .all(|db| access.is_mapped(db.offset(dstrd)))
    });
    let (doorbell_kind, shadow) = if all_mapped {
        (DoorbellKind::Mapped, None)
    } else if opts.shadow_doorbells && identify.oacs.get() & oacs::DOORBELL_BUFFER_CONFIG != 0 {
        match enable_shadow(access, &mut admin, dstrd, count, opts.need_event, timeout)? {
            Some(bufs) => (DoorbellKind::Shadow, Some(bufs)),
            None => (DoorbellKind::Mmio, None),
        }
    } else {
        (DoorbellKind::Mmio, None)
    };
    if let (Some(bufs), true) = (&shadow, opts.shadow_admin) {
        admin.qp.attach_shadow(bufs)?;
    }

    let setup = QueueSetup {
        access,
        count,
        depth: clamp_depth(opts.queue_depth, mqes),
        dstrd,
        max_transfer,
        shadow: shadow.as_ref(),
        vectors: n_vectors,
        timeout,
    };
    let mut pairs = setup.create(&mut admin)?;

    // Before the namespace scan, so that a namespace turning ready or
    // attached after it was looked at is still reported.
    let events = opts.async_events && identify.oaes.get() & oaes::NAMESPACE_ATTRIBUTE != 0;
    if events {
        let aec = AsyncEventConfig::new().with_nan(true);
        if let Err(e) = admin.execute(
            admin::set_features(FeatureId::ASYNC_EVENT_CONFIG, aec.into()),
            None,
            timeout,
        ) {
            tracing::info!(error = %e, "namespace attribute notices unavailable");
        }
    }
    let nstat = version >= regs::version(2, 0, 0);
    // Only a device whose RDY does not wait for its media needs the retries.
    let deadline = enabled + ready_timeout;
    let (found, ns_report) = scan_namespaces(
        &mut ProbeCtx {
            admin: &mut admin,
            buf: &buf,
            timeout,
            deadline: Some(deadline),
            nstat,
        },
        &identify,
    )?;

    let mut io_commands = 0;
    if opts.init_mode == InitMode::Learning && count > 0 {
        let (again, reads) = setup.relearn(&mut admin, pairs, &io_irqs, found.first())?;
        pairs = again;
        io_commands = reads;
    }
    if events {
        admin.arm_async_event()?;
    }

    let namespaces = Arc::new(NamespaceSet::new(found));
    let interrupts = io_irqs.iter().any(Option::is_some);
    let io_queues = pairs
        .into_iter()
        .zip(io_irqs.iter_mut())
        .map(|(qp, irq)| {
            Some(IoQueue::new(
                qp,
                IoQueueParts {
                    interrupt: irq.take(),
                    ns_set: Arc::clone(&namespaces),
                    generation: Arc::clone(generation),
                    timeout: opts.io_timeout,
                    access: Arc::clone(access),
                    sgls: identify.sgls.get(),
                },
            ))
        })
        .collect();
    let init = InitStats {
        admin_commands: admin.commands,
        by_opcode: admin.by_opcode.clone(),
        io_commands,
        duration: started.elapsed(),
    };
    Ok(Live {
        cap,
        version,
        ready_timeout,
        admin,
        identify: Arc::new(identify),
        namespaces,
        ns_report,
        nstat,
        io_queues,
        max_transfer,
        interrupts,
        vectors: if interrupts { n_vectors } else { 0 },
        doorbell_kind,
        init,
    })
}

/// Sends Doorbell Buffer Config (§5.8) with two fresh zeroed pages. Called
/// after Number of Queues and before any I/O queue exists: every I/O queue
/// then lives its whole life with shadow doorbells (Linux moved its enable
/// before I/O starts in 2024, after I/O timed out when it came later).
/// Returns `None`, logging why, when the slots of `max_qid` would not fit a
/// page or the device fails the command: the driver then keeps register
/// doorbells, as Linux does.
fn enable_shadow(
    access: &Arc<dyn DeviceAccess>,
    admin: &mut AdminQueue,
    dstrd: u8,
    max_qid: u16,
    need_event: NeedEvent,
    timeout: Duration,
) -> Result<Option<ShadowBuffers>, Error> {
    if !ShadowBuffers::fits(dstrd, max_qid) {
        tracing::info!(
            dstrd,
            max_qid,
            "shadow doorbells do not fit a page, using registers"
        );
        return Ok(None);
    }
    let bufs = ShadowBuffers::new(
        access.dma_alloc(PAGE_SIZE)?,
        access.dma_alloc(PAGE_SIZE)?,
        dstrd,
        need_event,
    );
    let cmd = admin::doorbell_buffer_config(bufs.shadow_iova(), bufs.event_idx_iova());
    match admin.execute(cmd, None, timeout) {
        Ok(_) => Ok(Some(bufs)),
        Err(Error::AdminCommand { status, .. }) => {
            tracing::info!(%status, "Doorbell Buffer Config failed, using registers");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn clamp_depth(want: u16, mqes: u32) -> u16 {
    u32::from(want)
        .clamp(2, mqes.max(2))
        .min(u32::from(u16::MAX)) as u16
}

/// The transfer limit: the driver's own, bounded by MDTS (units of
/// CAP.MPSMIN pages, a power of two; 0 = no limit), never below one page.
pub fn max_transfer(driver_limit: usize, mdts: u8, mpsmin: u8) -> usize {
    let page = PAGE_SIZE << mpsmin;
    let device = match mdts {
        0 => usize::MAX,
        m => 1usize
            .checked_shl(u32::from(m))
            .and_then(|p| p.checked_mul(page))
            .unwrap_or(usize::MAX),
    };
    driver_limit.min(device).max(PAGE_SIZE)
}

/// The Active Namespace ID list (CNS 02h). Before
/// NVMe 1.1 CNS 02h did not exist: then every NSID up to NN (at most 1024).
pub(crate) fn active_nsids(
    cx: &mut ProbeCtx<'_>,
    identify: &IdentifyController,
) -> Result<Vec<u32>, Error> {
    cx.buf.fill(0, IDENTIFY_SIZE, 0)?;
    match cx.admin.execute(
        admin::identify(Cns::ACTIVE_NAMESPACES, 0),
        Some(cx.buf),
        cx.timeout,
    ) {
        Ok(_) => {
            let mut list = Vec::new();
            for chunk in cx.buf.to_vec().chunks_exact(4) {
                let nsid = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
                // Zero ends the list; the list is increasing, so anything
                // else is a device bug and is dropped.
                if nsid == 0 {
                    break;
                }
                if list.last().is_none_or(|&l| nsid > l) {
                    list.push(nsid);
                }
            }
            Ok(list)
        }
        Err(Error::AdminCommand { status, .. }) if status.same_code(Status::INVALID_FIELD) => {
            Ok((1..=identify.nn.get().min(1024)).collect())
        }
        Err(e) => Err(e),
    }
}

/// The active namespace list, then [`namespace::probe`] for each (retrying
/// Namespace Not Ready until the context's deadline). With no namespace
/// this is one command and no wait.
fn scan_namespaces(
    cx: &mut ProbeCtx<'_>,
    identify: &IdentifyController,
) -> Result<(Vec<Namespace>, BTreeMap<u32, NamespaceState>), Error> {
    let mut found = Vec::new();
    let mut report = BTreeMap::new();
    for nsid in active_nsids(cx, identify)? {
        let probe = namespace::probe(cx, nsid)?;
        let state = probe.state(nsid);
        if let Some(reason) = &state.reason {
            tracing::info!(nsid, state = %state.state, reason, "namespace not used");
        }
        report.insert(nsid, state);
        if let Probe::Ready(ns) = probe {
            found.push(ns);
        }
    }
    Ok((found, report))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_transfer_is_bounded_by_mdts_and_driver_limit() {
        assert_eq!(max_transfer(1 << 20, 0, 0), 1 << 20);
        assert_eq!(max_transfer(1 << 20, 5, 0), 128 << 10);
        assert_eq!(max_transfer(1 << 20, 255, 0), 1 << 20);
        assert_eq!(max_transfer(0, 5, 0), PAGE_SIZE);
    }
}
