//! Where the host's cores go during a guest benchmark point: QEMU's vCPU
//! threads, QEMU's other threads (its main loop delivers vnvme's interrupt
//! eventfds and runs its own nvme device) and `vnvme serve`'s threads. On a
//! small host these compete for the same cores, so a device model that
//! takes a core away from the vCPUs slows the guest down however fast it
//! answers.
//!
//! Read from `/proc/PID/task/TID/schedstat`: the nanoseconds each thread
//! ran and waited runnable for a core. A thread that exits between two
//! samples takes its time with it (none does while fio runs).

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;

/// The thread groups one point's figures are split into.
const GROUPS: [&str; 3] = ["vcpus", "qemu_other", "server"];

/// Cumulative run and wait nanoseconds per group at one instant.
#[derive(Debug, Clone)]
pub(super) struct Sample {
    at: Instant,
    /// (ran, waited) per group of [`GROUPS`].
    ns: BTreeMap<&'static str, (u64, u64)>,
}

/// Cores a group used over a window, and cores' worth of time its
/// threads spent runnable but waiting for one.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct GroupCores {
    pub ran: f64,
    pub waited: f64,
}

/// One window's figures per group (absent for a process not running).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct HostCores {
    pub vcpus: GroupCores,
    pub qemu_other: GroupCores,
    pub server: Option<GroupCores>,
}

/// The threads of `qemu` (its vCPUs by their "CPU n/TCG" or "CPU n/KVM"
/// names, the rest) and of the `servers`, now.
pub(super) fn sample(qemu: Option<u32>, servers: &[u32]) -> Sample {
    let mut ns = BTreeMap::new();
    let pids = qemu.map(|q| (q, true)).into_iter();
    for (pid, is_qemu) in pids.chain(servers.iter().map(|&s| (s, false))) {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let path = task.path();
            let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
            let Some((ran, waited)) = std::fs::read_to_string(path.join("schedstat"))
                .ok()
                .and_then(|s| parse_schedstat(&s))
            else {
                continue;
            };
            let group = match (is_qemu, comm.starts_with("CPU ")) {
                (true, true) => GROUPS[0],
                (true, false) => GROUPS[1],
                (false, _) => GROUPS[2],
            };
            let e = ns.entry(group).or_insert((0, 0));
            e.0 += ran;
            e.1 += waited;
        }
    }
    Sample {
        at: Instant::now(),
        ns,
    }
}

/// "RAN WAITED SLICES" -> (RAN, WAITED).
fn parse_schedstat(text: &str) -> Option<(u64, u64)> {
    let mut f = text.split_whitespace().map(|v| v.parse::<u64>().ok());
    Some((f.next()??, f.next()??))
}

/// Run and wait nanoseconds per group, summed over windows (a device's
/// slices), and their wall time.
#[derive(Debug, Clone, Default)]
pub(super) struct Window {
    wall_ns: u64,
    ns: BTreeMap<&'static str, (u64, u64)>,
}

impl Window {
    /// Adds what each group used between `a` and `b`.
    pub(super) fn add(&mut self, a: &Sample, b: &Sample) {
        let wall = b.at.saturating_duration_since(a.at).as_nanos();
        self.wall_ns += u64::try_from(wall).unwrap_or(u64::MAX);
        for (group, (r1, w1)) in &b.ns {
            let Some((r0, w0)) = a.ns.get(group) else {
                continue;
            };
            let e = self.ns.entry(group).or_default();
            e.0 += r1.saturating_sub(*r0);
            e.1 += w1.saturating_sub(*w0);
        }
    }

    /// Cores per group over the summed wall time; `None` before any window.
    pub(super) fn cores(&self) -> Option<HostCores> {
        if self.wall_ns == 0 {
            return None;
        }
        let wall = self.wall_ns as f64;
        let cores = |g: &str| {
            self.ns.get(g).map(|(r, w)| GroupCores {
                ran: *r as f64 / wall,
                waited: *w as f64 / wall,
            })
        };
        Some(HostCores {
            vcpus: cores(GROUPS[0]).unwrap_or_default(),
            qemu_other: cores(GROUPS[1]).unwrap_or_default(),
            server: cores(GROUPS[2]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_gives_run_and_wait_nanoseconds() {
        assert_eq!(
            parse_schedstat("1593046 5336580 2\n"),
            Some((1593046, 5336580))
        );
        assert_eq!(parse_schedstat("12"), None);
        assert_eq!(parse_schedstat(""), None);
    }

    #[test]
    fn a_busy_thread_of_this_process_shows_as_server_time() {
        let me = std::process::id();
        let a = sample(None, &[me]);
        let until = Instant::now() + std::time::Duration::from_millis(30);
        let mut x = 0u64;
        while Instant::now() < until {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let b = sample(None, &[me]);
        let mut window = Window::default();
        window.add(&a, &b);
        let cores = window.cores().expect("one window");
        let server = cores.server.expect("this process has threads");
        assert!(server.ran > 0.0, "{cores:?}");
        assert_eq!(cores.vcpus, GroupCores::default());
    }
}
