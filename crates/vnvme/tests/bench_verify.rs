//! `vnvme bench --verify` through the library: mixed reads and writes on
//! several queues read back exactly what was last written.

use clap::Parser;
use vnvme::bench::{self, BenchOptions};

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
    // No poll window and no dozing: the adaptive worker arms EventIdx as soon
    // as its queue is empty, so a driver at queue depth 1 traps whenever its
    // next command comes after the arming: 0.4-0.75 per I/O beside this
    // file's other tests on 2 cores, nearly all on a quiet machine. With the
    // default 300 µs window it hardly ever traps (under 0.01 per I/O).
    // `--no-idle-class`: beside the other tests the worker waits for a core
    // long enough to move to SCHED_IDLE, where the woken driver preempts it
    // between the completion and the arming and submits unseen by EventIdx
    // (0.09-0.23 traps per I/O in that class; one CI run failed on it).
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

    let runs = bench::run(&opts).expect("bench run");

    let [run] = runs.as_slice() else {
        panic!("one point expected, got {}", runs.len());
    };
    assert!(run.ios > 0, "{run:?}");
    assert!(run.sq_traps_per_io > 0.1, "{run:?}");
}
