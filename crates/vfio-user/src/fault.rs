//! Surviving a client that shrinks the file behind a DMA map.
//!
//! A DMA map with an fd is mmapped MAP_SHARED from the client's file (a
//! memfd, a file on /dev/shm or hugetlbfs). Nothing stops the client from
//! ftruncating that file afterwards: QEMU and SPDK do not seal their memory,
//! and a regular file cannot be sealed at all. The next access of ours to a
//! page past the new end of the file raises SIGBUS, whose default action
//! kills the whole server. Refusing such files is not an option (they are
//! how QEMU's `memory-backend-file,share=on` and SPDK share guest memory),
//! so the fault itself is made survivable:
//!
//! * Every fd-backed mapping is registered here: a fixed array of [`CAPACITY`]
//!   slots (start, end, broken flag) made of atomics, so the signal handler
//!   can read it without locks or allocation. Registering claims a free slot
//!   with a CAS; a full registry fails the DMA_MAP with ENOSPC.
//! * A process-wide SIGBUS handler (`SA_SIGINFO | SA_ONSTACK`), installed
//!   once with the first registration, looks the faulting address up. If it
//!   lies in a registered mapping, the handler sets the slot's broken flag
//!   and replaces the *whole* mapping with anonymous zero memory
//!   (`MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS` over the same range), then
//!   returns: the faulting copy re-executes on zero pages and completes. The
//!   accessor ([`DmaSpace`](crate::DmaSpace)) checks the flag before and
//!   after every copy, so the data of a broken map is never used: the access
//!   fails with [`DmaError::Broken`](crate::DmaError::Broken), and the map
//!   stays broken until the client unmaps it.
//! * A fault anywhere else is not ours: the handler chains to the action that
//!   was installed before it (Rust's stack-overflow guard, a sanitizer's or
//!   libFuzzer's handler). An old `SA_SIGINFO` or plain handler is called;
//!   an old `SIG_DFL`/`SIG_IGN` is put back with `sigaction` and the handler
//!   returns, so the access faults again and the process dies as it would
//!   have without us (a SIGBUS sent with kill(2), which no access repeats,
//!   is raised again).
//!
//! The handler only uses async-signal-safe operations: atomic loads and
//! stores on static memory, `mmap`, `sigaction` and `raise` (system calls),
//! and it saves and restores `errno`. It logs nothing; the accessor warns.
//!
//! Races: a mapping is registered before any access can reach it and
//! unregistered, once it is out of the map table and no access can be in
//! flight, before it is unmapped; so a registered range is always ours.
//! Each slot is a seqlock: the handler only trusts a start/end pair read
//! between two equal, "live" values of the slot's state word, so a slot
//! being recycled by another thread can never be mistaken for a range it
//! does not describe. Two threads faulting on one mapping both replace it;
//! the second replacement is a no-op in effect (zero pages for zero pages).
//! The flag is set before the replacement, so a thread whose copy read the
//! replacement's zero pages without faulting sees it set after its copy.
//! A hugetlbfs mapping is made of whole huge pages (see `dma/mmap.rs`),
//! as the kernel can only replace it whole.

use std::io;
use std::sync::atomic::{fence, AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

use crate::Errno;

/// Fd-backed DMA maps registered at once in the whole process (all clients
/// of all servers). A registration beyond it fails with ENOSPC.
pub const CAPACITY: usize = 16384;

/// Slot state, in the low bits of [`Slot::state`]; the rest is a generation
/// bumped on every release, so a recycled slot never shows the same word.
const FREE: usize = 0;
/// Being filled in or emptied: the range is not to be trusted.
const BUSY: usize = 1;
/// `start..end` is a registered mapping.
const LIVE: usize = 2;
const STATE_MASK: usize = 3;
const GENERATION: usize = 4;

#[derive(Debug)]
struct Slot {
    state: AtomicUsize,
    start: AtomicUsize,
    end: AtomicUsize,
    broken: AtomicBool,
}

impl Slot {
    const fn new() -> Self {
        Self {
            state: AtomicUsize::new(FREE),
            start: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
            broken: AtomicBool::new(false),
        }
    }
}

static SLOTS: [Slot; CAPACITY] = [const { Slot::new() }; CAPACITY];
/// One past the highest slot ever claimed: the handler scans no further.
static HIGH: AtomicUsize = AtomicUsize::new(0);

static INSTALL: Once = Once::new();
/// 0 once the handler is installed, else the errno `sigaction` failed with.
static INSTALL_ERROR: AtomicI32 = AtomicI32::new(libc::EAGAIN);
/// The SIGBUS action in place before ours, to chain to for faults that are
/// not in a DMA map. Set before our handler is installed.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// A mapping's slot in the registry; unregisters on drop, which must happen
/// before the mapping is unmapped.
#[derive(Debug)]
pub(crate) struct Registration {
    slot: &'static Slot,
}

impl Registration {
    /// Whether a SIGBUS in the mapping has replaced it with zero pages. One
    /// atomic load; the hot path calls it around every copy.
    #[inline]
    pub(crate) fn is_broken(&self) -> bool {
        self.slot.broken.load(Ordering::Acquire)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let s = self.slot;
        let word = s.state.load(Ordering::Relaxed);
        let generation = word & !STATE_MASK;
        // Seqlock writer: BUSY before the range changes, so the handler
        // discards whatever it read meanwhile.
        s.state.store(generation | BUSY, Ordering::Relaxed);
        fence(Ordering::Release);
        s.start.store(0, Ordering::Relaxed);
        s.end.store(0, Ordering::Relaxed);
        s.broken.store(false, Ordering::Relaxed);
        s.state.store(
            generation.wrapping_add(GENERATION) | FREE,
            Ordering::Release,
        );
    }
}

/// Registers the mapping `[start, start + len)` (`len` is rounded up to whole
/// pages, as the kernel maps them), installing the SIGBUS handler first if
/// this is the first registration. ENOSPC when the registry is full.
pub(crate) fn register(start: *mut u8, len: usize) -> Result<Registration, Errno> {
    install()?;
    let page = rustix::param::page_size();
    let start = start as usize;
    let end = len
        .checked_add(page - 1)
        .map(|l| l & !(page - 1))
        .and_then(|l| start.checked_add(l))
        .ok_or(libc::EINVAL)?;
    for (i, slot) in SLOTS.iter().enumerate() {
        let word = slot.state.load(Ordering::Relaxed);
        if word & STATE_MASK != FREE {
            continue;
        }
        let generation = word & !STATE_MASK;
        if slot
            .state
            .compare_exchange(
                word,
                generation | BUSY,
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_err()
        {
            continue;
        }
        fence(Ordering::Release);
        slot.start.store(start, Ordering::Relaxed);
        slot.end.store(end, Ordering::Relaxed);
        slot.broken.store(false, Ordering::Relaxed);
        HIGH.fetch_max(i + 1, Ordering::Release);
        slot.state.store(generation | LIVE, Ordering::Release);
        return Ok(Registration { slot });
    }
    Err(libc::ENOSPC)
}

/// The registered mapping containing `addr`: its slot and `start..end`.
/// Async-signal-safe: atomics on static memory only.
fn find(addr: usize) -> Option<(&'static Slot, usize, usize)> {
    let high = HIGH.load(Ordering::Acquire);
    for slot in SLOTS.iter().take(high) {
        let before = slot.state.load(Ordering::Acquire);
        if before & STATE_MASK != LIVE {
            continue;
        }
        let start = slot.start.load(Ordering::Relaxed);
        let end = slot.end.load(Ordering::Relaxed);
        // Seqlock reader: the range counts only if the state word did not
        // change while it was read.
        fence(Ordering::Acquire);
        if slot.state.load(Ordering::Relaxed) != before {
            continue;
        }
        if (start..end).contains(&addr) {
            return Some((slot, start, end));
        }
    }
    None
}

/// The registered mapping containing `addr`, as `start..end`.
#[cfg(test)]
pub(crate) fn lookup(addr: usize) -> Option<std::ops::Range<usize>> {
    find(addr).map(|(_, start, end)| start..end)
}

fn install() -> Result<(), Errno> {
    INSTALL.call_once(|| {
        let error = match install_handler() {
            Ok(()) => 0,
            Err(e) => e.raw_os_error().unwrap_or(libc::EINVAL),
        };
        INSTALL_ERROR.store(error, Ordering::Release);
    });
    match INSTALL_ERROR.load(Ordering::Acquire) {
        0 => Ok(()),
        e => Err(e),
    }
}

fn install_handler() -> io::Result<()> {
    // SAFETY: an all-zero `sigaction` is a valid value (SIG_DFL, empty mask,
    // no flags); it is only an output buffer here.
    let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: queries the current action into a valid, writable struct.
    if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // Saved before ours is in place, so the handler always has it.
    let _ = PREVIOUS.set(previous);
    // SAFETY: as above, all-zero is a valid `sigaction` to fill in.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_sigbus as SigInfoHandler as usize;
    action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
    // SAFETY: `sa_mask` is a valid sigset_t owned by `action`.
    unsafe { libc::sigemptyset(&mut action.sa_mask) };
    // SAFETY: installs a handler that is async-signal-safe (see module docs)
    // and has the SA_SIGINFO signature; `action` is fully initialised.
    if unsafe { libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The signature of an `SA_SIGINFO` handler.
type SigInfoHandler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);
/// The signature of a plain handler.
type SigHandler = extern "C" fn(libc::c_int);

/// The SIGBUS handler. Runs on the faulting thread, which is inside a copy
/// from or to the faulting mapping (holding a snapshot of its map table, so
/// the mapping stays registered for the whole handler).
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: errno is this thread's; it is restored before returning so the
    // interrupted code's view is unchanged.
    let errno = unsafe { *libc::__errno_location() };
    if let Some((slot, start, end)) = fault_address(info).and_then(find) {
        slot.broken.store(true, Ordering::SeqCst);
        // SAFETY: `start..end` is a live DMA mapping owned by a `Mmap` that
        // cannot be unmapped meanwhile (its user is this very thread, in a
        // copy on a snapshot of the map table); replacing it in place with
        // private zero pages changes no other memory, and nothing uses its
        // contents once the broken flag is set.
        let p = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                end - start,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            // SAFETY: as above.
            unsafe { *libc::__errno_location() = errno };
            return;
        }
        // No memory for the replacement: the access would fault forever.
        // Fall through to the previous action, which normally kills.
    }
    chain(sig, info, ctx);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// The faulting address, for a fault the kernel raised (`si_code > 0`): a
/// SIGBUS sent with kill(2) or sigqueue(3) carries no address and is never
/// ours.
fn fault_address(info: *mut libc::siginfo_t) -> Option<usize> {
    if info.is_null() {
        return None;
    }
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler;
    // for a kernel-raised SIGBUS, `si_addr` is the union member it filled.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    (code > 0).then_some(addr)
}

/// Hands a fault that is not ours to the action installed before ours.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let Some(previous) = PREVIOUS.get() else {
        restore_default(sig);
        return;
    };
    let handler = previous.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // Put it back and return: the access faults again and the kernel
        // applies it (an ignored synchronous SIGBUS still kills).
        // SAFETY: `previous` is a valid action obtained from sigaction(2).
        if unsafe { libc::sigaction(sig, previous, std::ptr::null_mut()) } != 0 {
            restore_default(sig);
        }
        if fault_address(info).is_none() {
            // Sent, not a fault: nothing re-raises it on return, so raise it
            // again; it is blocked until this handler returns, then gets the
            // action just restored.
            // SAFETY: raise(3) is async-signal-safe.
            unsafe { libc::raise(sig) };
        }
    } else if previous.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: with SA_SIGINFO the saved handler has exactly this
        // signature; it gets the arguments the kernel gave us.
        let f = unsafe { std::mem::transmute::<usize, SigInfoHandler>(handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: without SA_SIGINFO the saved handler takes the signal
        // number only.
        let f = unsafe { std::mem::transmute::<usize, SigHandler>(handler) };
        f(sig);
    }
}

fn restore_default(sig: libc::c_int) {
    // SAFETY: all-zero is SIG_DFL with an empty mask and no flags.
    let dfl: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: installs the default action; nothing else is touched.
    unsafe { libc::sigaction(sig, &dfl, std::ptr::null_mut()) };
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use rustix::fs::{ftruncate, memfd_create, MemfdFlags};

    use super::*;
    use crate::{DmaError, DmaSpace, GuestAddress, GuestMemory};

    const IOVA: u64 = 0x10_0000;
    const SIZE: u64 = 0x4000;

    fn memfd() -> std::os::fd::OwnedFd {
        let fd = memfd_create("vnvme-fault-test", MemfdFlags::CLOEXEC).unwrap();
        ftruncate(&fd, SIZE).unwrap();
        fd
    }

    fn is_broken<T: std::fmt::Debug>(r: Result<T, DmaError>) -> bool {
        matches!(r, Err(DmaError::Broken { .. }))
    }

    /// Each access kind, as the first access after the truncation (so it is
    /// the one that takes the fault) and again on the broken map.
    fn every_access_fails_after_truncation(fd: impl Fn() -> std::os::fd::OwnedFd) {
        type Access = fn(&DmaSpace) -> bool;
        let accesses: [(&str, Access); 5] = [
            ("read", |d| {
                is_broken(d.read(GuestAddress(IOVA + 0x1ffe), &mut [0u8; 8]))
            }),
            ("write", |d| {
                is_broken(d.write(GuestAddress(IOVA + 0x1ffe), &[1u8; 8]))
            }),
            ("zero", |d| is_broken(d.zero(GuestAddress(IOVA), SIZE))),
            ("load_u32", |d| {
                is_broken(d.load_u32(GuestAddress(IOVA + 0x3000)))
            }),
            ("store_u32", |d| {
                is_broken(d.store_u32(GuestAddress(IOVA + 0x3000), 7))
            }),
        ];
        for (first, access) in accesses {
            let dma = DmaSpace::new_local();
            let fd = fd();
            dma.map_fd(IOVA, SIZE, fd.as_fd(), 0, true, true).unwrap();
            dma.write(GuestAddress(IOVA), &[0xAB; 64]).unwrap();
            ftruncate(&fd, 0).unwrap();
            assert!(access(&dma), "{first}: the faulting access");
            for (name, again) in accesses {
                assert!(again(&dma), "{name} after {first} broke the map");
            }
            // Unmapping frees the iova and the slot: a good map works again.
            dma.unmap(IOVA, SIZE).unwrap();
            ftruncate(&fd, SIZE).unwrap();
            dma.map_fd(IOVA, SIZE, fd.as_fd(), 0, true, true).unwrap();
            assert_eq!(
                dma.load_u32(GuestAddress(IOVA)).unwrap(),
                0,
                "{first}: remapped"
            );
        }
    }

    #[test]
    fn truncated_memfd_map_fails_every_access_with_broken_and_the_process_lives() {
        every_access_fails_after_truncation(memfd);
    }

    #[test]
    fn truncated_regular_file_map_fails_every_access_with_broken_and_the_process_lives() {
        let dir = if std::path::Path::new("/dev/shm").is_dir() {
            std::path::PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let path = dir.join(format!("vnvme-fault-test-{}", std::process::id()));
        every_access_fails_after_truncation(|| {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .unwrap();
            f.set_len(SIZE).unwrap();
            f.into()
        });
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn shrinking_half_the_file_breaks_the_whole_map() {
        let dma = DmaSpace::new_local();
        let fd = memfd();
        dma.map_fd(IOVA, SIZE, fd.as_fd(), 0, true, true).unwrap();
        ftruncate(&fd, SIZE / 2).unwrap();
        // The first half is still backed by the file, but not to be trusted
        // once the second half faulted.
        assert_eq!(dma.load_u32(GuestAddress(IOVA)).unwrap(), 0);
        assert!(is_broken(dma.load_u32(GuestAddress(IOVA + SIZE - 4))));
        assert!(is_broken(dma.load_u32(GuestAddress(IOVA))));
    }

    #[test]
    fn lookup_finds_registered_maps_only() {
        let dma = DmaSpace::new_local();
        let fd = memfd();
        dma.map_fd(IOVA, SIZE, fd.as_fd(), 0, true, true).unwrap();
        let ptr = dma.host_address(IOVA).unwrap();
        let found = lookup(ptr as usize).expect("a registered map");
        assert_eq!(found, ptr as usize..ptr as usize + SIZE as usize);
        assert!(lookup(ptr as usize + SIZE as usize - 1).is_some());
        // A fault anywhere else is not ours: the handler chains it on.
        let local = 0u64;
        assert_eq!(lookup(&local as *const u64 as usize), None, "the stack");
        assert_eq!(lookup(0), None, "null");
        // Anonymous maps cannot be truncated and are not registered.
        dma.map_anonymous(2 * IOVA, SIZE).unwrap();
        let anon = dma.host_address(2 * IOVA).unwrap();
        assert_eq!(lookup(anon as usize), None, "anonymous map");
        dma.unmap(IOVA, SIZE).unwrap();
        assert_eq!(lookup(ptr as usize), None, "after unmap");
    }

    #[test]
    fn the_handler_is_ours_once_a_map_is_registered() {
        let dma = DmaSpace::new_local();
        dma.map_fd(IOVA, SIZE, memfd().as_fd(), 0, true, false)
            .unwrap();
        // SAFETY: all-zero is a valid output buffer for sigaction(2).
        let mut now: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: a query only, into a valid output buffer.
        let r = unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut now) };
        assert_eq!(r, 0);
        assert_eq!(now.sa_sigaction, on_sigbus as SigInfoHandler as usize);
        assert_ne!(now.sa_flags & libc::SA_ONSTACK, 0);
        assert!(PREVIOUS.get().is_some(), "the previous action is kept");
    }
}
