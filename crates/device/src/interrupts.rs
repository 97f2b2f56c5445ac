//! Interrupts to the client: MSI-X vectors and INTx as eventfds handed over
//! by SET_IRQS.

use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::RwLock;
use vnvme_controller::InterruptSink;

/// The interrupt eventfds the client gave: per MSI-X (or MSI) vector, and
/// INTx; what a live upgrade passes on ([`EventfdInterrupts::export`]).
#[derive(Debug, Default)]
pub struct IrqFds {
    pub vectors: Vec<Option<OwnedFd>>,
    pub intx: Option<OwnedFd>,
}

/// The eventfds a client gave for each vector. A vector with an MSI-X
/// eventfd (or an MSI one: a function offers one kind, and both fill the
/// same table) is signalled there; otherwise INTx is used if the client gave
/// one; otherwise the interrupt is dropped and counted (a driver that polls
/// needs none).
///
/// INTx is a level the controller computes
/// ([`Controller::intx_asserted`](vnvme_controller::Controller::intx_asserted)),
/// automasked as VFIO does: a signal masks the line, further interrupts are
/// not signalled while it is masked, and the client's UNMASK (QEMU sends it
/// at the first BAR access after the interrupt, when it deasserts) signals
/// again if the level still holds. An extra edge would be worse than
/// useless: QEMU would assert a line the guest finds nothing behind, and
/// the guest's interrupt controller would redeliver it until the next BAR
/// access.
#[derive(Debug, Default)]
pub struct EventfdInterrupts {
    msix: RwLock<Vec<Option<File>>>,
    intx: RwLock<Option<File>>,
    /// An INTx eventfd is set and no MSI-X one: the guest uses the pin.
    intx_mode: AtomicBool,
    /// INTx signalled and not yet unmasked by the client.
    intx_masked: AtomicBool,
    /// The client unmasks with a resample eventfd we do not watch (KVM
    /// irqfd): signal every interrupt, as edges.
    intx_no_automask: AtomicBool,
    dropped: AtomicU64,
    /// Signals that found the eventfd at its maximum count: it is signalled
    /// already, so nothing is lost (see [`kick`](Self::kick)).
    saturated: AtomicU64,
}

impl EventfdInterrupts {
    /// Sets MSI-X eventfds for vectors `start..start + fds.len()`, growing the
    /// table up to `max_vectors` (the caller has checked the range).
    pub fn set_msix(&self, start: usize, fds: Vec<OwnedFd>) {
        let mut table = self.msix.write();
        for (i, fd) in fds.into_iter().enumerate() {
            let v = start + i;
            if table.len() <= v {
                table.resize_with(v + 1, || None);
            }
            table[v] = Some(File::from(fd));
        }
        drop(table);
        self.update_mode();
    }

    /// Removes MSI-X eventfds for `start..start + count` (count 0: all).
    pub fn clear_msix(&self, start: usize, count: usize) {
        let mut table = self.msix.write();
        if count == 0 {
            table.clear();
        } else {
            for slot in table.iter_mut().skip(start).take(count) {
                *slot = None;
            }
        }
        drop(table);
        self.update_mode();
    }

    pub fn set_intx(&self, fd: Option<OwnedFd>) {
        *self.intx.write() = fd.map(File::from);
        self.intx_masked.store(false, Ordering::SeqCst);
        self.update_mode();
    }

    /// SET_IRQS INTx MASK.
    pub fn mask_intx(&self) {
        self.intx_masked.store(true, Ordering::SeqCst);
    }

    /// SET_IRQS INTx UNMASK with an eventfd: the client would tell us of
    /// unmasks through it; we do not watch it, so never automask.
    pub fn intx_without_automask(&self) {
        self.intx_no_automask.store(true, Ordering::SeqCst);
        self.intx_masked.store(false, Ordering::SeqCst);
    }

    /// Forgets every eventfd (the client went away).
    pub fn clear(&self) {
        self.msix.write().clear();
        *self.intx.write() = None;
        self.intx_masked.store(false, Ordering::SeqCst);
        self.intx_no_automask.store(false, Ordering::SeqCst);
        self.update_mode();
    }

    fn update_mode(&self) {
        let pin = self.intx.read().is_some() && self.msix.read().iter().all(Option::is_none);
        self.intx_mode.store(pin, Ordering::Release);
    }

    /// SET_IRQS INTx UNMASK: unmasks, then signals again if `level()` (the
    /// controller's INTx level) holds. Returns whether it signalled.
    ///
    /// No interrupt is lost to a worker signalling meanwhile: it posts its
    /// completion before it tries to signal, so either its attempt sees the
    /// line unmasked and signals, or `level()` (which runs after the unmask)
    /// sees the completion.
    pub fn unmask_intx(&self, level: impl FnOnce() -> bool) -> bool {
        self.intx_masked.store(false, Ordering::SeqCst);
        if !level() {
            return false;
        }
        self.signal_intx()
    }

    /// The pin: an edge unless the line is (auto)masked.
    fn signal_intx(&self) -> bool {
        let intx = self.intx.read();
        let Some(file) = intx.as_ref() else {
            return false;
        };
        if !self.intx_no_automask.load(Ordering::SeqCst)
            && self.intx_masked.swap(true, Ordering::SeqCst)
        {
            // Already asserted: UNMASK re-checks the level.
            return true;
        }
        self.kick(file)
    }

    /// Copies of the eventfds, for a live upgrade's next process.
    pub fn export(&self) -> std::io::Result<IrqFds> {
        let copy = |f: &Option<File>| -> std::io::Result<Option<OwnedFd>> {
            f.as_ref()
                .map(|f| f.try_clone().map(OwnedFd::from))
                .transpose()
        };
        Ok(IrqFds {
            vectors: self
                .msix
                .read()
                .iter()
                .map(copy)
                .collect::<std::io::Result<_>>()?,
            intx: copy(&self.intx.read())?,
        })
    }

    /// Takes the eventfds a previous process [`export`](Self::export)ed.
    /// The INTx line starts unmasked: a level still high is signalled
    /// again when the client unmasks, and a spurious edge is harmless.
    pub fn import(&self, fds: IrqFds, no_automask: bool) {
        *self.msix.write() = fds.vectors.into_iter().map(|f| f.map(File::from)).collect();
        *self.intx.write() = fds.intx.map(File::from);
        self.intx_no_automask.store(no_automask, Ordering::SeqCst);
        self.update_mode();
    }

    /// Whether INTx is signalled without automask (see
    /// [`intx_without_automask`](Self::intx_without_automask)).
    pub fn no_automask(&self) -> bool {
        self.intx_no_automask.load(Ordering::SeqCst)
    }

    /// Interrupts that had nowhere to go.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Signals with saturated eventfds (counter at its maximum).
    pub fn saturated(&self) -> u64 {
        self.saturated.load(Ordering::Relaxed)
    }

    /// Adds 1 to an eventfd. The server made it non-blocking when the
    /// client passed it (and refused anything but an eventfd), so this
    /// never waits on the client: EAGAIN means the counter is at its
    /// maximum (a client can preload 2^64 - 2), i.e. signalled already.
    fn kick(&self, file: &File) -> bool {
        match (&*file).write(&1u64.to_ne_bytes()) {
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                self.saturated.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(_) => false,
        }
    }
}

impl InterruptSink for EventfdInterrupts {
    fn signal(&self, vector: u16) {
        if let Some(Some(file)) = self.msix.read().get(usize::from(vector)) {
            if self.kick(file) {
                return;
            }
        }
        if self.signal_intx() {
            return;
        }
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// `false` while the guest uses the INTx pin (an INTx eventfd and no
    /// MSI-X one): the controller then honours INTMS/INTMC and has the host
    /// trap on CQ head updates, the BAR access on which QEMU deasserts the
    /// line and unmasks.
    fn msix_enabled(&self) -> bool {
        !self.intx_mode.load(Ordering::Acquire)
    }
}
