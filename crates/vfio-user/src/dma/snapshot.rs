//! The map table as per-thread snapshots: an access takes no lock and
//! writes no shared memory.
//!
//! The current table is an immutable `Arc<MapTable>` behind a mutex that
//! only writers (DMA_MAP, DMA_UNMAP) and threads with a stale snapshot take.
//! Every table has a generation, unique in the process, and the space keeps
//! the current table's in an atomic that only writers store to. A thread
//! keeps the table it used last in a thread-local (one entry: the threads of
//! a controller all use one space); an access loads the space's generation,
//! a plain load of a line that stays in every reader's cache, and uses its
//! snapshot if the generations match, else swaps it for the current table
//! first. vm-memory's `GuestMemoryAtomic` loads an `ArcSwap` per access
//! instead; measured here (commit 85efc3b), that load cost more than the
//! uncontended read lock it replaced.
//!
//! So a thread holds a table between its accesses, not only during them.
//! An unmap publishes a table without the map and then waits until no
//! table holding it is left (the map's count drops to the unmapper's own)
//! before the map is munmapped. A thread lets go of its old table at its
//! next access, or when it quiesces ([`quiesce`]) before it blocks, as the
//! controller's workers do; the unmapping thread lets go of its own first,
//! or it would wait for itself.
//!
//! The wait is bounded by [`UNMAP_WAIT`]: a thread that neither accesses
//! nor quiesces (a worker inside a slow backend call, a wedged thread) must
//! not hang the server. Past the bound the unmap returns without unmapping:
//! the map's memory stays mapped until the last table holding it is
//! dropped, by the thread holding it, so no access ever touches memory that
//! is not mapped. What the bound gives up is only the promise that no
//! access touches the range once DMA_UNMAP is answered, and only for an
//! access that was in progress (inside its copy, or its DMA_READ/DMA_WRITE
//! round trip) for the whole bound: a thread merely holding the old table
//! sees the new generation at its next access and never reaches the range.
//!
//! Writers reuse allocations ([`Writer`]): a table that was current is
//! written over by a later change once no thread holds it, and a retired
//! map's allocation takes a later map, so the stream of small maps and
//! unmaps a guest behind a vIOMMU sends allocates nothing once warm. A
//! spare table no thread holds is emptied before an unmap waits, so it
//! never keeps a map alive.
//!
//! A pin (`pin.rs`) holds the maps under a transfer the kernel is doing in
//! them, and counts exactly like a table holding them: the unmap waits for
//! the transfer (microseconds to milliseconds of storage latency), and past
//! the bound the memory stays mapped until the pin is dropped, after the
//! kernel's completion.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};

use super::{Backing, MapTable, Mapping};

/// Longest an unmap waits for threads to let go of the map: longer than
/// any copy (a 2 MiB transfer takes well under a millisecond) and than a
/// poller's spin without accesses, shorter than a client's patience.
pub(crate) const UNMAP_WAIT: Duration = Duration::from_secs(1);

/// Source of table generations; 0 is never handed out, so it matches no
/// table.
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

/// This thread's snapshot as the access fast path reads it: the table's
/// generation and address. Plain cells with no destructor, so reaching them
/// costs no liveness check and works while the thread is exiting; [`HELD`]
/// keeps the table alive.
struct Cached {
    /// The table's generation; 0 while there is none, and while an access
    /// uses it (so an access nested in it takes the slow path and leaves
    /// the table alone).
    generation: Cell<u64>,
    table: Cell<*const MapTable>,
}

impl Cached {
    /// Whether an access on this thread is using the table.
    fn in_use(&self) -> bool {
        self.generation.get() == 0 && !self.table.get().is_null()
    }

    fn clear(&self) {
        self.generation.set(0);
        self.table.set(std::ptr::null());
    }
}

/// The table [`Cached`] points at: owning it here, not in `Cached`, keeps
/// the destructor off the fast path. Its drop (at thread exit) clears
/// `Cached` before the table goes.
struct Held(Cell<Option<Arc<MapTable>>>);

impl Drop for Held {
    fn drop(&mut self) {
        // `Cached` has no destructor: it is always reachable.
        CACHED.with(Cached::clear);
    }
}

thread_local! {
    /// The table this thread used last, of whichever space: generations are
    /// unique across spaces, so a match also says it is the same space's.
    static CACHED: Cached = const {
        Cached {
            generation: Cell::new(0),
            table: Cell::new(std::ptr::null()),
        }
    };
    static HELD: Held = const { Held(Cell::new(None)) };
}

/// A space's map tables: the current one and its generation.
#[derive(Debug)]
pub(super) struct Tables {
    current: Mutex<Writer>,
    /// The current table's generation, for accesses to check their
    /// snapshot against without the lock.
    generation: AtomicU64,
    /// Unmaps that stopped waiting at [`UNMAP_WAIT`].
    pub(super) late_unmaps: AtomicU64,
    /// Whether a late unmap was logged (later ones log at debug).
    warned: AtomicBool,
}

/// What the writers (DMA_MAP, DMA_UNMAP) hold under the lock: the current
/// table, and what earlier changes left whose allocations the next ones
/// reuse, so that a guest behind a vIOMMU (a DMA_MAP and a DMA_UNMAP per
/// I/O buffer) costs no allocation per message once the first few have
/// filled the pools.
#[derive(Debug)]
pub(super) struct Writer {
    table: Arc<MapTable>,
    /// Tables that were current, written over by a later publish once no
    /// thread holds them (their maps are let go as soon as that is so, see
    /// [`Tables::retire`]).
    spare_tables: Vec<Arc<MapTable>>,
    /// Maps an unmap retired, for later maps to be written into.
    pub(super) spare_maps: Vec<Arc<Mapping>>,
    /// The list an unmap gathers its maps in, lent out while it waits.
    pub(super) removed: Vec<Arc<Mapping>>,
}

/// Tables and maps kept for reuse: enough for a burst of changes while
/// threads still hold the tables before it.
const SPARE_TABLES: usize = 4;
const SPARE_MAPS: usize = 64;

impl std::ops::Deref for Writer {
    type Target = MapTable;

    fn deref(&self) -> &MapTable {
        &self.table
    }
}

impl Writer {
    /// A spare map to write `m` into, or a new one.
    pub(super) fn new_map(&mut self, m: Mapping) -> Arc<Mapping> {
        while let Some(mut spare) = self.spare_maps.pop() {
            if let Some(slot) = Arc::get_mut(&mut spare) {
                *slot = m;
                return spare;
            }
        }
        Arc::new(m)
    }
}

impl Default for Tables {
    fn default() -> Self {
        let table = MapTable {
            generation: next_generation(),
            ..MapTable::default()
        };
        Self {
            generation: AtomicU64::new(table.generation),
            current: Mutex::new(Writer {
                table: Arc::new(table),
                spare_tables: Vec::new(),
                spare_maps: Vec::new(),
                removed: Vec::new(),
            }),
            late_unmaps: AtomicU64::new(0),
            warned: AtomicBool::new(false),
        }
    }
}

impl Drop for Tables {
    /// The dropping thread lets go of its snapshot of these tables, or the
    /// maps would stay mapped until its next access to another space.
    fn drop(&mut self) {
        quiesce_if(*self.generation.get_mut());
    }
}

impl Tables {
    /// The current table, for what is not on the I/O path (a lock and a
    /// reference count).
    pub fn current(&self) -> Arc<MapTable> {
        Arc::clone(&self.current.lock().table)
    }

    /// The current table, locked against other writers until
    /// [`Tables::publish`].
    pub fn lock(&self) -> MutexGuard<'_, Writer> {
        self.current.lock()
    }

    /// Makes a copy of the current table, changed by `edit`, the current
    /// table: written into a spare table no thread holds any more where
    /// there is one (no allocation), else a new one. Accesses pick it up at
    /// their next generation check.
    pub fn publish(&self, w: &mut MutexGuard<'_, Writer>, edit: impl FnOnce(&mut MapTable)) {
        let mut next = match w
            .spare_tables
            .iter()
            .position(|t| Arc::strong_count(t) == 1)
        {
            Some(i) => w.spare_tables.swap_remove(i),
            None => Arc::new(MapTable::default()),
        };
        let generation = next_generation();
        let Some(t) = Arc::get_mut(&mut next) else {
            // Unreachable (the count was one, under the lock, and nothing
            // hands out weak references); a fresh table then.
            return self.publish_new(w, edit);
        };
        t.maps.clear();
        t.maps.extend(w.table.maps.iter().cloned());
        t.bytes = w.table.bytes;
        edit(t);
        t.generation = generation;
        let old = std::mem::replace(&mut w.table, next);
        if w.spare_tables.len() >= SPARE_TABLES {
            w.spare_tables.remove(0);
        }
        w.spare_tables.push(old);
        // Release: a thread that sees the generation and takes the lock
        // finds this table (the lock orders the rest).
        self.generation.store(generation, Ordering::Release);
    }

    #[cold]
    fn publish_new(&self, w: &mut MutexGuard<'_, Writer>, edit: impl FnOnce(&mut MapTable)) {
        let mut t = MapTable::clone(&w.table);
        edit(&mut t);
        t.generation = next_generation();
        let generation = t.generation;
        w.table = Arc::new(t);
        self.generation.store(generation, Ordering::Release);
    }

    /// Empties the spare tables no thread holds any more, so the maps in
    /// them are held only by the tables threads use.
    fn release_spares(&self) {
        for t in &mut self.current.lock().spare_tables {
            if let Some(t) = Arc::get_mut(t) {
                t.maps.clear();
            }
        }
    }

    /// Runs `f` on this thread's snapshot of the table, swapped for the
    /// current one first if a writer published since. `f` runs with the
    /// snapshot marked in use.
    #[inline]
    pub fn with<R>(&self, f: impl FnOnce(&MapTable) -> R) -> R {
        let now = self.generation.load(Ordering::Acquire);
        CACHED.with(|c| {
            if c.generation.get() == now {
                run_cached(c, now, f)
            } else {
                self.refresh_then(c, f)
            }
        })
    }

    #[cold]
    fn refresh_then<R>(&self, c: &Cached, f: impl FnOnce(&MapTable) -> R) -> R {
        if c.in_use() {
            // In use by the access this one is nested in: swapping it would
            // free the table under that access.
            return f(&self.current());
        }
        let table = self.current();
        let generation = table.generation;
        let swapped = HELD.try_with(|held| {
            // Let go of the old table first: an unmap may be waiting for
            // it, and if an unmap gave up, dropping it here munmaps.
            c.clear();
            let old = held.0.take();
            drop(old);
            c.table.set(Arc::as_ptr(&table));
            c.generation.set(generation);
            held.0.set(Some(table));
        });
        match swapped {
            Ok(()) => run_cached(c, generation, f),
            // The thread is exiting (its `HELD` is gone).
            Err(_) => f(&self.current()),
        }
    }

    /// Drops maps that are out of the table once no table holds them,
    /// waiting at most [`UNMAP_WAIT`] for threads to let go (see the module
    /// docs for what happens past it), and keeps them for later maps to be
    /// written into. Empties `removed`.
    pub fn retire(&self, removed: &mut Vec<Arc<Mapping>>) {
        quiesce();
        let deadline = Instant::now() + UNMAP_WAIT;
        let mut tries = 0u32;
        for mut m in removed.drain(..) {
            loop {
                self.release_spares();
                // Acquire (in `get_mut`): the accesses of threads that let
                // go happen before the munmap in the mapping's drop.
                if let Some(unique) = Arc::get_mut(&mut m) {
                    // Its mapping goes now (munmapped if it was the last
                    // map in it); the allocation stays for a later map.
                    unique.backing = Backing::Remote;
                    let mut w = self.current.lock();
                    if w.spare_maps.len() < SPARE_MAPS {
                        w.spare_maps.push(m);
                    }
                    break;
                }
                if Instant::now() >= deadline {
                    self.gave_up(&m);
                    // The last table holding it munmaps it: a thread's, not
                    // a spare kept here.
                    self.current
                        .lock()
                        .spare_tables
                        .retain(|t| !t.maps.iter().any(|x| Arc::ptr_eq(x, &m)));
                    drop(m);
                    break;
                }
                // Busy threads let go within microseconds: yield first, then
                // sleep, so a wedged one costs no core.
                tries += 1;
                if tries < 64 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
        }
    }

    #[cold]
    fn gave_up(&self, m: &Mapping) {
        self.late_unmaps.fetch_add(1, Ordering::Relaxed);
        let what = format_args!(
            "DMA_UNMAP of {:#x}+{:#x}: a thread still held the map after {UNMAP_WAIT:?}; it \
             stays mapped until that thread lets go",
            m.iova, m.size
        );
        if self.warned.swap(true, Ordering::Relaxed) {
            tracing::debug!("{what}");
        } else {
            tracing::warn!("{what} (further ones for this client are logged at debug level)");
        }
    }
}

/// Runs `f` on the table `c` points at, marked in use meanwhile.
#[inline]
fn run_cached<R>(c: &Cached, generation: u64, f: impl FnOnce(&MapTable) -> R) -> R {
    /// Puts the generation back, also if `f` unwinds.
    struct InUse<'a>(&'a Cached, u64);
    impl Drop for InUse<'_> {
        fn drop(&mut self) {
            self.0.generation.set(self.1);
        }
    }
    c.generation.set(0);
    let _in_use = InUse(c, generation);
    // SAFETY: `c.table` points at the table `HELD` owns on this thread; only
    // this thread changes `HELD`, in `refresh_then` (not while the
    // generation is 0, as it is until `f` returns) and in `quiesce` and the
    // thread-exit drop (which clear `c` first, and which `f`, a copy, does
    // not reach).
    f(unsafe { &*c.table.get() })
}

/// Lets go of this thread's snapshot, so an unmap need not wait for this
/// thread. For threads about to block; their next access takes the current
/// table.
pub(super) fn quiesce() {
    CACHED.with(|c| {
        if c.in_use() {
            // Called from inside an access.
            return;
        }
        c.clear();
        // Dropped outside the borrow: dropping the last holder of a map an
        // unmap gave up on munmaps it.
        let old = HELD.try_with(|held| held.0.take()).ok().flatten();
        drop(old);
    });
}

/// [`quiesce`] if this thread's snapshot is of `generation`.
fn quiesce_if(generation: u64) {
    if CACHED.with(|c| c.generation.get()) == generation {
        quiesce();
    }
}

fn next_generation() -> u64 {
    NEXT_GENERATION.fetch_add(1, Ordering::Relaxed)
}
