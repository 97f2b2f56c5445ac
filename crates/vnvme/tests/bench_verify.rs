//! `vnvme bench --verify` through the library: mixed reads and writes on
//! several queues read back exactly what was last written.

use std::time::Duration;

use clap::Parser;
use vnvme::bench::{self, BenchOptions};
use vnvme::identity::Origin;
use vnvme_controller::{DoorbellMode, DEFAULT_DOZE, DEFAULT_IDLE_POLL};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    opts: BenchOptions,
}

fn options(args: &[&str]) -> BenchOptions {
    Cli::parse_from(std::iter::once("bench").chain(args.iter().copied())).opts
}

#[test]
fn verify_randrw_on_two_queues_reads_back_every_completed_write() {
    let opts = options(&[
        "--modes",
        "adaptive",
        "--queues",
        "2",
        "--rw",
        "randrw",
        "--backend",
        "ram",
        "--size",
        "16M",
        "--qd",
        "8",
        "--runtime",
        "0.3",
        "--verify",
    ]);

    let runs = bench::run(&opts).expect("bench run");

    let [run] = runs.as_slice() else {
        panic!("one point expected, got {}", runs.len());
    };
    assert!(run.verify);
    assert!(run.ios > 0, "{run:?}");
    assert!(run.verified_reads > 0, "{run:?}");
    assert_eq!((run.errors, run.verify_errors), (0, 0), "{run:?}");
    assert!(run.rss_start_mib > 0.0 && run.rss_end_mib > 0.0, "{run:?}");
}

#[test]
fn verify_with_a_null_namespace_is_refused() {
    let opts = options(&[
        "--modes",
        "trap",
        "--qd",
        "1",
        "--runtime",
        "0.1",
        "--verify",
    ]);

    let err = bench::run(&opts).unwrap_err();

    assert!(err.to_string().contains("--backend ram"), "{err}");
}

#[test]
fn polling_knobs_reach_the_controller_and_the_guest_server() {
    // What the knobs do to the worker is counted exactly in the
    // controller's tests (adaptive_mode_poll_window_and_doze_decide_when_a_
    // qd1_host_traps: with neither, every I/O of a QD 1 host traps). How
    // often a free-running driver beats the arming is timing, and a figure
    // for the bench: `vnvme bench --modes adaptive --qd 1 --idle-poll-us 0
    // --doze-us 0 --no-idle-class` reports it (docs/benchmarks.md).
    let opts = options(&[
        "--modes",
        "adaptive",
        "--qd",
        "1",
        "--runtime",
        "0.3",
        "--idle-poll-us",
        "0",
        "--doze-us",
        "0",
        "--no-idle-class",
    ]);
    assert_eq!(
        opts.polling.serve_args(),
        ["--idle-poll-us", "0", "--doze-us", "0", "--no-idle-class"]
    );
    let config =
        bench::device_options(DoorbellMode::Adaptive, &opts).controller_config(&Origin::embedded());
    assert_eq!(config.doorbells, DoorbellMode::Adaptive);
    assert_eq!(config.idle_poll, Duration::ZERO);
    assert_eq!(config.doze, Duration::ZERO);
    assert!(!config.idle_class);
    // Without them, the defaults.
    let defaults = bench::device_options(DoorbellMode::Adaptive, &options(&[]))
        .controller_config(&Origin::embedded());
    assert_eq!(defaults.idle_poll, DEFAULT_IDLE_POLL);
    assert_eq!(defaults.doze, DEFAULT_DOZE);
    assert!(defaults.idle_class);

    // And a point runs with them.
    let runs = bench::run(&opts).expect("bench run");

    let [run] = runs.as_slice() else {
        panic!("one point expected, got {}", runs.len());
    };
    assert!(run.ios > 0 && run.errors == 0, "{run:?}");
}
