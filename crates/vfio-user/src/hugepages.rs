//! Huge pages reserved for a test: hugetlbfs memory is how vfio-user
//! devices are deployed (QEMU's `memory-backend-file` on hugetlbfs, SPDK's
//! memory), so the tests of this crate and of the server map it for real.
//! The kernel allocates 2 MiB pages at run time; a test reserves what it
//! needs and gives it back.

use std::path::PathBuf;

use parking_lot::{Mutex, MutexGuard};

/// One reservation at a time in this process: tests run in parallel, and
/// each restores the count it found.
static RESERVING: Mutex<()> = Mutex::new(());

/// `count` more huge pages of `kib` KiB in the kernel's pool while this
/// lives (as root: `/sys/kernel/mm/hugepages/hugepages-<kib>kB`); the pool
/// goes back to its size when dropped.
#[derive(Debug)]
pub struct HugePages {
    nr: PathBuf,
    before: u64,
    _one_at_a_time: MutexGuard<'static, ()>,
}

impl HugePages {
    /// Reserves `count` pages of `kib` KiB, or says why it cannot (not
    /// root, no such page size, the kernel found no free memory for them).
    pub fn reserve(count: u64, kib: u64) -> Result<Self, String> {
        if !rustix::process::geteuid().is_root() {
            return Err("huge pages are reserved as root".into());
        }
        let guard = RESERVING.lock();
        let dir = PathBuf::from(format!("/sys/kernel/mm/hugepages/hugepages-{kib}kB"));
        let read = |name: &str| -> Result<u64, String> {
            let path = dir.join(name);
            std::fs::read_to_string(&path)
                .map_err(|e| format!("{}: {e}", path.display()))?
                .trim()
                .parse()
                .map_err(|e| format!("{}: {e}", path.display()))
        };
        let nr = dir.join("nr_hugepages");
        let before = read("nr_hugepages")?;
        let free_before = read("free_hugepages")?;
        std::fs::write(&nr, (before + count).to_string())
            .map_err(|e| format!("{}: {e}", nr.display()))?;
        let pages = Self {
            nr,
            before,
            _one_at_a_time: guard,
        };
        let free = read("free_hugepages")?;
        if free < free_before + count {
            return Err(format!(
                "the kernel found memory for {} of {count} {kib} KiB huge pages",
                free.saturating_sub(free_before)
            ));
        }
        Ok(pages)
    }
}

impl Drop for HugePages {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(&self.nr, self.before.to_string()) {
            eprintln!(
                "could not give huge pages back ({}): {e}",
                self.nr.display()
            );
        }
    }
}
