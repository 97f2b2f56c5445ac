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
/// names, the rest) and of `server`, now.
pub(super) fn sample(qemu: Option<u32>, server: Option<u32>) -> Sample {
    let mut ns = BTreeMap::new();
    for (pid, is_qemu) in [(qemu, true), (server, false)] {
        let Some(pid) = pid else { continue };
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

/// What each group used between `a` and `b`.
pub(super) fn between(a: &Sample, b: &Sample) -> HostCores {
    let wall = b.at.saturating_duration_since(a.at).as_nanos().max(1) as f64;
    let cores = |g: &str| -> Option<GroupCores> {
        let (r0, w0) = a.ns.get(g)?;
        let (r1, w1) = b.ns.get(g)?;
        Some(GroupCores {
            ran: r1.saturating_sub(*r0) as f64 / wall,
            waited: w1.saturating_sub(*w0) as f64 / wall,
        })
    };
    HostCores {
        vcpus: cores(GROUPS[0]).unwrap_or_default(),
        qemu_other: cores(GROUPS[1]).unwrap_or_default(),
        server: cores(GROUPS[2]),
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
        let a = sample(None, Some(me));
        let until = Instant::now() + std::time::Duration::from_millis(30);
        let mut x = 0u64;
        while Instant::now() < until {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let b = sample(None, Some(me));
        let cores = between(&a, &b);
        let server = cores.server.expect("this process has threads");
        assert!(server.ran > 0.0, "{cores:?}");
        assert_eq!(cores.vcpus, GroupCores::default());
    }
}
