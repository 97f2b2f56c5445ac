//! IOPS and bandwidth limits on a real `vnvme serve`, driven by our driver
//! over its vfio-user socket and changed through `vnvme ctl`: throttled
//! commands wait and complete with their data, the counters count them, a
//! change reaches the commands already waiting, groups share a budget, and
//! hostile limits get clear errors. Counts, not timings: how exactly a
//! limit is held is `vnvme bench --qos`'s job (docs/qos.md).

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::pattern::pattern;
use common::{ctl_err, ctl_ok, serve, temp_dir, Served, TempDir, BIN};
use serde_json::Value;
use vnvme_driver::{Controller, DeviceAccess, DmaBuffer, InitOptions, IoQueue, VfioUserAccess};
use vnvme_spec::NvmOpcode;

const BLOCK: usize = 4096;

struct Rig {
    _dir: TempDir,
    control: PathBuf,
    server: Served,
    access: Arc<VfioUserAccess>,
    ctrl: Controller,
}

fn rig(name: &str, args: &[&str], config: Option<&str>) -> Rig {
    let dir = temp_dir(name);
    let socket = dir.join("vnvme.sock");
    let control = dir.join("control.sock");
    let mut all = vec!["--control", control.to_str().unwrap()];
    let cfg = dir.join("vnvme.toml");
    if let Some(text) = config {
        std::fs::write(&cfg, text).unwrap();
        all.extend(["--config", cfg.to_str().unwrap()]);
    }
    all.extend_from_slice(args);
    let server = serve(&socket, &all);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !control.exists() {
        assert!(Instant::now() < deadline, "no control socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    let access = Arc::new(VfioUserAccess::connect(&socket).unwrap());
    let opts = InitOptions {
        queue_depth: 128,
        ..InitOptions::default()
    };
    let ctrl = Controller::init(access.clone(), opts).unwrap();
    Rig {
        _dir: dir,
        control,
        server,
        access,
        ctrl,
    }
}

fn block(nsid: u32, lba: u64, seed: u32) -> Vec<u8> {
    pattern(BLOCK, seed ^ (nsid << 24) ^ lba as u32)
}

impl Rig {
    /// Submits one command per LBA in `lbas` on `nsid` (writes carry
    /// [`block`]'s pattern), all before reaping any; returns the buffers.
    fn submit(
        &self,
        q: &mut IoQueue,
        op: NvmOpcode,
        nsid: u32,
        lbas: &[u64],
        seed: u32,
    ) -> Vec<DmaBuffer> {
        let bufs: Vec<DmaBuffer> = lbas
            .iter()
            .map(|&lba| {
                let buf = self.access.dma_alloc(BLOCK).unwrap();
                if op == NvmOpcode::WRITE {
                    buf.write_bytes(0, &block(nsid, lba, seed)).unwrap();
                }
                buf
            })
            .collect();
        for (&lba, buf) in lbas.iter().zip(&bufs) {
            q.enqueue_rw(op, nsid, lba, 1, buf).unwrap();
        }
        q.ring().unwrap();
        bufs
    }

    /// Reaps `n` completions within `timeout`: all successful, each once.
    fn reap(q: &mut IoQueue, n: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut done = Vec::new();
        while done.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "{} of {n} completed in {timeout:?}",
                done.len()
            );
            let want = n - done.len();
            let _ = q.wait(&mut done, want, left.min(Duration::from_secs(1)));
        }
        assert!(done.iter().all(|c| c.status().is_success()), "{done:?}");
        let mut cids: Vec<u16> = done.iter().map(|c| c.cid()).collect();
        cids.sort_unstable();
        cids.dedup();
        assert_eq!(cids.len(), n, "each command completed once");
    }

    fn check(&self, q: &mut IoQueue, nsid: u32, lbas: &[u64], seed: u32) {
        let bufs = self.submit(q, NvmOpcode::READ, nsid, lbas, seed);
        Self::reap(q, lbas.len(), Duration::from_secs(30));
        for (&lba, buf) in lbas.iter().zip(&bufs) {
            assert!(
                buf.to_vec() == block(nsid, lba, seed),
                "nsid {nsid} LBA {lba}"
            );
        }
    }

    fn qos(&self) -> Value {
        ctl_ok(&self.control, &["qos_get"])
    }
}

#[test]
fn throttled_commands_wait_and_complete_with_their_data() {
    // 40 a second, a burst of 4: 40 writes and 40 reads take about 2 s.
    let r = rig("qos-wait", &["--ns", "16M:ram,iops=40"], None);
    let mut q = r.ctrl.take_io_queue(0).unwrap();
    let lbas: Vec<u64> = (0..40).map(|i| i * 7).collect();
    let _w = r.submit(&mut q, NvmOpcode::WRITE, 1, &lbas, 1);
    Rig::reap(&mut q, lbas.len(), Duration::from_secs(30));
    r.check(&mut q, 1, &lbas, 1);

    let got = r.qos();
    assert_eq!(
        got["namespaces"]["1"]["own"]["limits"]["iops"], 40,
        "{got:#}"
    );
    assert_eq!(got["namespaces"]["1"]["own"]["limits"]["iops_burst"], 4);
    // All 80 were queued at once against a burst of 4: nearly all waited
    // (a worker descheduled for 25 ms between two fetches would let one by).
    let throttled = got["throttled_commands"].as_u64().unwrap();
    assert!((60..=80).contains(&throttled), "{got:#}");
    assert!(got["throttled_ns"].as_u64().unwrap() > 0);
    assert_eq!(
        got["namespaces"]["1"]["own"]["throttled_commands"],
        throttled
    );
    // The same counters in the stats.
    let stats = ctl_ok(&r.control, &["stats"]);
    assert_eq!(stats["qos_throttled_commands"], throttled);
    drop(q);
    assert!(r.server.terminate().success());
}

#[test]
fn qos_set_reaches_the_commands_already_waiting() {
    let r = rig("qos-set", &["--ns", "16M:ram"], None);
    let mut q = r.ctrl.take_io_queue(0).unwrap();
    assert_eq!(r.qos()["throttled_commands"], 0);
    ctl_ok(
        &r.control,
        &["qos_set", "nsid=1", "write_iops=1", "write_iops_burst=1"],
    );
    assert_eq!(r.qos()["namespaces"]["1"]["own"]["limits"]["write_iops"], 1);
    // 30 writes at 1 a second: the last would start after 29 s.
    let lbas: Vec<u64> = (0..30).collect();
    let _w = r.submit(&mut q, NvmOpcode::WRITE, 1, &lbas, 2);
    let deadline = Instant::now() + Duration::from_secs(10);
    while r.qos()["throttled_commands"].as_u64().unwrap() < 29 {
        assert!(Instant::now() < deadline, "{:#}", r.qos());
        std::thread::sleep(Duration::from_millis(20));
    }
    // Reads are not write_iops's: they pass the waiting writes.
    let other: Vec<u64> = (100..104).collect();
    let _r = r.submit(&mut q, NvmOpcode::READ, 1, &other, 0);
    // No limit now: the waiting writes go at once.
    ctl_ok(&r.control, &["qos_set", "nsid=1"]);
    Rig::reap(&mut q, lbas.len() + other.len(), Duration::from_secs(10));
    r.check(&mut q, 1, &lbas, 2);
    let got = r.qos();
    assert_eq!(got["throttled_commands"], 29, "{got:#}");
    assert_eq!(
        got["namespaces"]["1"]["own"]["limits"],
        serde_json::json!({})
    );
    drop(q);
    assert!(r.server.terminate().success());
}

#[test]
fn a_group_from_the_config_is_one_budget_for_its_namespaces() {
    let config = r#"
[qos_groups.tenant]
iops = 20
iops_burst = 1

[[namespaces]]
size = "8M"
qos = { group = "tenant" }

[[namespaces]]
size = "8M"
qos = { group = "tenant" }

[[namespaces]]
size = "8M"
"#;
    let r = rig("qos-group", &[], Some(config));
    let mut q = r.ctrl.take_io_queue(0).unwrap();
    let lbas: Vec<u64> = (0..10).collect();
    let _a = r.submit(&mut q, NvmOpcode::WRITE, 1, &lbas, 3);
    let _b = r.submit(&mut q, NvmOpcode::WRITE, 2, &lbas, 3);
    // Namespace 3 is in no group: never throttled.
    let _c = r.submit(&mut q, NvmOpcode::WRITE, 3, &lbas, 3);
    Rig::reap(&mut q, 30, Duration::from_secs(30));
    for nsid in 1..=3 {
        r.check(&mut q, nsid, &lbas, 3);
    }
    let got = r.qos();
    assert_eq!(got["namespaces"]["1"]["group"], "tenant", "{got:#}");
    assert_eq!(got["namespaces"]["2"]["group"], "tenant");
    assert!(got["namespaces"].get("3").is_none());
    // 20 writes and 20 reads on one bucket of 1: all but one or two waited
    // (both namespaces' share one budget, or a few would not have).
    let group = got["groups"]["tenant"]["throttled_commands"]
        .as_u64()
        .unwrap();
    assert!((35..=40).contains(&group), "{got:#}");
    assert_eq!(got["throttled_commands"], group);
    drop(q);
    assert!(r.server.terminate().success());
}

#[test]
fn hostile_limits_get_clear_errors() {
    let r = rig("qos-hostile", &["--ns", "16M:ram"], None);
    for (args, says) in [
        (&["qos_set", "iops=0"][..], "0 would stop all I/O"),
        (&["qos_set", "iops=-5"], "negative"),
        (&["qos_set", "iops=2.5"], "not commands a second"),
        (
            &["qos_set", "bps=99999999999999999999"],
            "not bytes a second",
        ),
        (
            &["qos_set", "bps=18446744073709551615"],
            "more than the highest",
        ),
        (&["qos_set", "bps=lots"], "bps:"),
        (&["qos_set", "iops_total=5"], "unknown QoS key 'iops_total'"),
        (&["qos_set", "iops_burst=5"], "iops_burst needs iops"),
        (
            &["qos_set", "nsid=9", "iops=5"],
            "namespace 9 does not exist",
        ),
        (&["qos_set", "nsid=0", "iops=5"], "not a namespace id"),
        (&["qos_set", "group=nope", "iops=5"], "no QoS group 'nope'"),
        (&["qos_set", "nsid=1", "group=g", "iops=5"], "not both"),
        (&["qos_get", "nsid=1"], "unknown field"),
    ] {
        let e = ctl_err(&r.control, args);
        assert!(e.contains(says), "{args:?}: {e}");
    }
    // Nothing was set by the refused requests.
    assert!(!r.qos()["controller"]["own"].is_object());
    // Bad limits in --ns and the configuration stop the start, saying why.
    let dir = temp_dir("qos-hostile-start");
    for (args, says) in [
        (vec!["--ns", "16M,iops=0"], "0 would stop all I/O"),
        (
            vec!["--ns", "16M,qos-group=nope"],
            "QoS group 'nope' is not defined",
        ),
        (vec!["--ns", "16M,read-iops=fast"], "read_iops: 'fast'"),
    ] {
        let out = Command::new(BIN)
            .args(["serve", "--socket"])
            .arg(dir.join("s.sock"))
            .args(&args)
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && e.contains(says), "{args:?}: {e}");
    }
    assert!(r.server.terminate().success());
}
