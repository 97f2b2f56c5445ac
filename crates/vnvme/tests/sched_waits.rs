//! `bench/sched-waits.sh` on a recording small enough to count by hand:
//! the slices come from a kept bench folder's `markers.txt`, the waits from
//! `perf sched timehist` text, whose thread names hold spaces.

mod common;

use std::process::Command;

const MARKERS: &str = "\
100.000000 VNVME-BENCH-BEGIN io_uring-qd1
100.500000 VNVME-BENCH-SLICE io_uring-qd1@qemu-dbcs-on
102.500000 VNVME-BENCH-SLICE -
102.600000 VNVME-BENCH-SLICE io_uring-qd1@vnvme-adaptive
103.600000 VNVME-BENCH-SLICE -
104.000000 VNVME-BENCH-END io_uring-qd1
";

/// time [cpu] name[tid/pid] wait sch-delay run (ms)
const TIMEHIST: &str = "\
           time    cpu  task name                       wait time  sch delay   run time
                        [tid/pid]                          (msec)     (msec)     (msec)
--------------- ------  ------------------------------  ---------  ---------  ---------
   100.100000 [0000]  CPU 0/TCG[11/10]                    0.000      0.900      1.000
   100.600000 [0000]  CPU 0/TCG[11/10]                    0.000      0.500      2.000
   100.700000 [0001]  CPU 1/TCG[12/10]                    0.000      0.100      2.000
   100.800000 [0001]  qemu-system-x86[10]                 0.000      0.400      1.000
   101.000000 [0001]  vnvme-io1[20/19]                    0.000      0.900      1.000
   101.100000 [0000]  bash[30]                            0.000      5.000      1.000
   102.700000 [0000]  CPU 1/TCG[12/10]                    0.000      0.200      4.000
   102.800000 [0001]  vnvme-io1[20/19]                    0.000      0.350      1.000
   102.900000 [0001]  vnvme-io1[20/19]                    0.000      0.010      1.000
   103.700000 [0000]  CPU 0/TCG[11/10]                    0.000      2.000      1.000
";

/// `bench/sched-waits.sh ARGS...`.
fn sched_waits(args: &[&std::ffi::OsStr]) -> std::process::Output {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/sched-waits.sh");
    Command::new(script).args(args).output().unwrap()
}

/// The row of `device` and thread `kind`, split on blanks: device, secs,
/// thread, runnable, waits over the threshold, per s, wait cores, ran
/// cores.
fn row<'a>(text: &'a str, device: &str, kind: &str) -> Vec<&'a str> {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|r| r.len() == 8 && r[0] == device && r[2] == kind)
        .unwrap_or_else(|| panic!("no {device} {kind} row in\n{text}"))
}

#[test]
fn counts_each_devices_long_waits_per_thread_kind_within_its_slices() {
    let dir = common::temp_dir("sched-waits");
    std::fs::write(dir.join("markers.txt"), MARKERS).unwrap();
    let timehist = dir.join("timehist.txt");
    std::fs::write(&timehist, TIMEHIST).unwrap();
    let (dir, timehist) = (dir.as_os_str(), timehist.as_os_str());
    let out = sched_waits(&[dir, timehist]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    // Before the first slice and the other kinds (bash) do not count; an
    // idle server's worker does not count beside QEMU's device.
    assert_eq!(
        row(&text, "qemu-dbcs-on", "vCPU")[1..6],
        ["2.0", "vCPU", "2", "1", "0.5"]
    );
    assert_eq!(row(&text, "qemu-dbcs-on", "QEMU")[3..5], ["1", "1"]);
    assert!(!text
        .lines()
        .any(|l| l.starts_with("qemu-dbcs-on") && l.contains("worker")));
    // In the vnvme slice: 0.35 ms counts, 0.2 and 0.01 do not; after the
    // last slice nothing counts.
    assert_eq!(
        row(&text, "vnvme-adaptive", "vCPU")[1..5],
        ["1.0", "vCPU", "1", "0"]
    );
    assert_eq!(row(&text, "vnvme-adaptive", "worker")[3..5], ["2", "1"]);
    // 4 ms run in the 1 s slice: 0.004 of a core.
    assert_eq!(row(&text, "vnvme-adaptive", "vCPU")[7], "0.004");
    assert_eq!(text.lines().count(), 5, "{text}");

    let out = sched_waits(&["--over".as_ref(), "0.45".as_ref(), dir, timehist]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(row(&text, "qemu-dbcs-on", "vCPU")[4], "1");
    assert_eq!(row(&text, "qemu-dbcs-on", "QEMU")[4], "0");

    let bad = sched_waits(&["--over".as_ref(), "0.3ms".as_ref(), dir, timehist]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--over takes milliseconds"));

    let missing = sched_waits(&["/nonexistent".as_ref(), timehist]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("VNVME_BENCH_KEEP=1"));
}
