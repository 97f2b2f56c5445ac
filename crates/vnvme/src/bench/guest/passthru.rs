//! `vnvme bench passthru --guest`: the async passthrough seed's table through
//! a Linux kernel, as the seed measured it. One boot of the `tests/guest`
//! guest on a `vnvme serve` namespace runs `tests/guest/tests/passthru-table.sh`:
//! per queue depth, 4 KiB random reads through
//! * sync: `tests/guest/nvme-sync-read.c`, compiled here with `cc -static` and
//!   put into the guest (`run-test.sh --guest-file`): one
//!   `NVME_IOCTL_IO64_CMD` at a time on `/dev/ng0n1`;
//! * async: fio `io_uring_cmd --cmd_type=nvme` on `/dev/ng0n1`;
//! * block: fio `io_uring`, direct, on `/dev/nvme0n1`;
//!
//! and the same table as the in-process bench is printed from the guest's
//! `RESULT` lines: with `--reps N`, the median of each point's N samples,
//! taken in N interleaved passes over all the points.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::host::{run_test_failure, Server, Tail, TempDir};
use super::{ensure_rig, serve_args_from_env, GuestBenchOptions, END};
use crate::bench::passthru::{self, medians, Api, PassthruOptions, PassthruRun, SYNC_NOTE};
use crate::bench::{report, BackendArg};

/// Seconds per point when `--runtime` is not given.
const DEFAULT_RUNTIME: f64 = 5.0;
/// The guest script, under the rig folder.
const SCRIPT: &str = "tests/passthru-table.sh";
const READER_SOURCE: &str = "nvme-sync-read.c";

pub fn main(opts: &PassthruOptions) -> Result<()> {
    let runtime = check(opts)?;
    let rig = GuestBenchOptions::default_rig();
    let rig = rig
        .canonicalize()
        .with_context(|| format!("guest rig {}", rig.display()))?;
    ensure_rig(&rig)?;
    let tmp = TempDir::new()?;
    let dir = tmp.path();

    // A null namespace keeps no data: nothing to read back.
    let check_data = opts.backend != BackendArg::Null;
    let mut run_test = Command::new(rig.join("run-test.sh"));
    // The reader runs the sync points and the read-back check.
    if opts.apis.0.contains(&Api::Sync) || check_data {
        let reader = dir.join("nvme-sync-read");
        compile_reader(&rig.join(READER_SOURCE), &reader)?;
        run_test.arg("--guest-file").arg(&reader);
    }
    let ns = match opts.backend {
        BackendArg::Null => format!("{}:null", opts.size),
        BackendArg::Ram => format!("{}:ram", opts.size),
        BackendArg::File => format!("{}:file={}", opts.size, dir.join("ns.img").display()),
    };
    let mut serve_args = vec!["--ns".to_string(), ns];
    serve_args.extend(serve_args_from_env());
    let mut server = Server::start(None, dir, &dir.join("stats.json"), &serve_args)?;

    let points = opts.apis.0.len() * opts.qd.0.len();
    let samples = points * usize::from(opts.reps);
    // Boot, then per sample: the ramp and fio's or the reader's start under TCG.
    let expected = 20.0 + samples as f64 * (f64::from(runtime) + 3.0);
    eprintln!(
        "bench passthru --guest: {points} points x {} reps of {runtime} s in one guest boot: about {:.0} min; logs in {}",
        opts.reps,
        expected / 60.0,
        dir.display()
    );
    eprintln!("bench passthru --guest: {SYNC_NOTE}");
    let console = dir.join("console.log");
    let results = dir.join("results.jsonl");
    let harness = dir.join("harness.log");
    let qds: Vec<String> = opts.qd.0.iter().map(u16::to_string).collect();
    let apis: Vec<&str> = opts.apis.0.iter().map(|&a| api_name(a)).collect();
    let append = format!(
        "rig.qds={} rig.apis={} rig.runtime={runtime} rig.reps={} rig.check={}",
        qds.join(","),
        apis.join(","),
        opts.reps,
        u8::from(check_data),
    );
    run_test
        .arg("--vfio-user")
        .arg(&server.socket)
        .args(["--timeout", &((expected * 2.0 + 120.0) as u64).to_string()])
        .args(["--append", &append])
        .arg("--log")
        .arg(&console)
        .arg("--results")
        .arg(&results)
        .arg(rig.join(SCRIPT))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&harness)?);
    let mut child = run_test
        .spawn()
        .with_context(|| format!("starting {}", rig.join("run-test.sh").display()))?;
    let t0 = Instant::now();
    let mut tail = Tail::default();
    let status = loop {
        for line in tail.lines(&console) {
            if let Some(name) = line.strip_prefix(END) {
                eprintln!(
                    "bench passthru --guest:   {} done (at {:.0} s)",
                    name.trim(),
                    t0.elapsed().as_secs_f64()
                );
            }
        }
        if let Some(status) = child.try_wait()? {
            break status;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    server.stop();

    let text = std::fs::read_to_string(&results).unwrap_or_default();
    let all = parse_results(&text);
    let runs = medians(&all);
    let guest = guest_versions(&text);
    if !runs.is_empty() {
        println!(
            "In the guest (tests/guest: QEMU, TCG, Linux {}, {}) on vnvme: Sync-PT = nvme-sync-read \
             (NVME_IOCTL_IO64_CMD) and Async-PT = fio io_uring_cmd on /dev/ng0n1, Block = fio \
             io_uring on /dev/nvme0n1; {runtime} s per point; latencies are fio's clat",
            guest.0, guest.1
        );
        print!("{}", passthru::table(&runs));
        print!("{}", passthru::shape(&runs));
    }
    let code = status.code().unwrap_or(-1);
    if code != 0 || all.len() < samples {
        tmp.keep();
        let last = std::fs::read_to_string(&harness).unwrap_or_default();
        bail!(
            "run-test.sh exit {code} ({}), {} of {samples} samples measured: {}; logs kept in {}",
            run_test_failure(code),
            all.len(),
            last.lines().last().unwrap_or_default(),
            dir.display()
        );
    }
    if let Some(path) = &opts.json {
        let doc = serde_json::json!({
            "runs": runs,
            "samples": all,
            "reps": opts.reps,
            "runtime_s": runtime,
            "kernel": guest.0,
            "fio": guest.1,
            "note": SYNC_NOTE,
            "guest": "tests/guest rig: QEMU -accel tcg, Debian trixie kernel; sync: nvme-sync-read \
                      (NVME_IOCTL_IO64_CMD) on /dev/ng0n1, async: fio io_uring_cmd on /dev/ng0n1, \
                      block: fio io_uring direct on /dev/nvme0n1; 4 KiB randread, 1 job",
            "machine": report::machine(),
        });
        crate::bench::write_json(path, &doc, "bench passthru --guest")?;
    }
    Ok(())
}

/// Checks the options; returns the seconds per point.
fn check(opts: &PassthruOptions) -> Result<u32> {
    let runtime = opts.runtime.unwrap_or(DEFAULT_RUNTIME);
    if !(1.0..=3600.0).contains(&runtime) {
        bail!("--runtime must be between 1 and 3600 seconds with --guest (got {runtime})");
    }
    crate::bench::check_qd(&opts.qd.0)?;
    if !rustix::process::geteuid().is_root() {
        bail!("--guest boots QEMU in the rig's chroot: run as root");
    }
    // fio and the reader take whole seconds.
    Ok(runtime.round() as u32)
}

/// `cc -static`: the guest's initramfs has its own libc, maybe not the host's.
fn compile_reader(source: &Path, out: &Path) -> Result<()> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let output = Command::new(&cc)
        .args(["-static", "-O2", "-Wall", "-o"])
        .arg(out)
        .arg(source)
        .output()
        .with_context(|| {
            format!("running {cc} to build the synchronous passthrough reader (needs gcc and libc6-dev)")
        })?;
    if !output.status.success() {
        bail!(
            "{cc} -static {} failed ({}): {}",
            source.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// The guest script's name for an API (its `rig.apis` words).
fn api_name(api: Api) -> &'static str {
    match api {
        Api::Sync => "sync",
        Api::Async => "async",
        Api::Block => "block",
    }
}

/// The guest's `RESULT` lines named `API-qdN` (fio_json's fields, which the
/// reader prints too); other lines, and failed points, are skipped.
fn parse_results(text: &str) -> Vec<PassthruRun> {
    let mut runs = Vec::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let name = v.get("name").and_then(Value::as_str).unwrap_or_default();
        let Some((api, qd)) = name.rsplit_once("-qd") else {
            continue;
        };
        let (Ok(api), Ok(qd)) = (api.parse::<Api>(), qd.parse::<u16>()) else {
            continue;
        };
        // fio's error number, or a message when the job did not run.
        if v.get("err").and_then(Value::as_u64) != Some(0) {
            eprintln!("bench passthru --guest:   {name}: failed: {line}");
            continue;
        }
        let f = |k: &str| v.get(k).and_then(Value::as_f64).unwrap_or(0.0);
        runs.push(PassthruRun {
            api,
            qd,
            iops: f("iops"),
            lat_p50_us: f("clat_p50_us"),
            lat_p99_us: f("clat_p99_us"),
            ios: (f("io_kib") / 4.0) as u64,
            errors: 0,
            server: None,
            driver: None,
        });
    }
    runs
}

/// The guest's kernel release and fio version, from its `guest` RESULT line.
fn guest_versions(text: &str) -> (String, String) {
    let v = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v.get("name").and_then(Value::as_str) == Some("guest"))
        .unwrap_or_default();
    let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
    (s("kernel"), s("fio"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_of_fio_and_the_reader_become_runs() {
        let text = r#"{"name":"guest","kernel":"6.12.57+deb13-amd64","fio":"fio-3.39"}
{"name":"sync-check","blocks":16}
{"name":"sync-qd1","iops":5012,"ios":15036,"io_kib":60144,"lat_mean_us":199.1,"clat_p50_us":180,"clat_p99_us":420,"runtime_ms":3000,"err":0}
{"name":"async-qd8","iops":12000,"read_iops":12000,"write_iops":0,"bw_kib":48000,"lat_mean_us":600.0,"clat_p50_us":550,"clat_p99_us":1200,"io_kib":144000,"runtime_ms":3000,"err":0}
{"name":"block-qd8","err":"fio status 1: bad"}
{"name":"block-qd1","iops":4000,"io_kib":48000,"clat_p50_us":200,"clat_p99_us":500,"err":0}"#;
        let runs = parse_results(text);
        let got: Vec<(Api, u16, u64)> = runs.iter().map(|r| (r.api, r.qd, r.ios)).collect();
        assert_eq!(
            got,
            vec![
                (Api::Sync, 1, 15036),
                (Api::Async, 8, 36000),
                (Api::Block, 1, 12000)
            ]
        );
        assert!((runs[0].lat_p99_us - 420.0).abs() < f64::EPSILON);
        assert!((runs[1].iops - 12000.0).abs() < f64::EPSILON);
        assert_eq!(
            guest_versions(text),
            ("6.12.57+deb13-amd64".to_string(), "fio-3.39".to_string())
        );
    }

    #[test]
    fn medians_take_the_middle_sample_of_each_point() {
        let s = |api, qd, iops| PassthruRun {
            api,
            qd,
            iops,
            lat_p50_us: iops / 1000.0,
            lat_p99_us: 0.0,
            ios: 0,
            errors: 0,
            server: None,
            driver: None,
        };
        let m = medians(&[
            s(Api::Sync, 1, 300.0),
            s(Api::Block, 1, 50.0),
            s(Api::Sync, 1, 100.0),
            s(Api::Block, 1, 70.0),
            s(Api::Sync, 1, 200.0),
        ]);
        let got: Vec<(Api, f64, f64)> = m.iter().map(|r| (r.api, r.iops, r.lat_p50_us)).collect();
        assert_eq!(got, vec![(Api::Sync, 200.0, 0.2), (Api::Block, 70.0, 0.07)]);
    }

    #[test]
    fn api_names_are_what_the_parser_reads_back() {
        for api in [Api::Sync, Api::Async, Api::Block] {
            assert_eq!(api_name(api).parse::<Api>(), Ok(api));
        }
    }
}
