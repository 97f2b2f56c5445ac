//! `vnvme`: serve an emulated NVMe controller over vfio-user, drive one with
//! the user-space driver, and benchmark the two.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use vnvme::bench::{self, BenchOptions};
use vnvme::serve::{self, ServeOptions};
use vnvme::tools;

#[derive(Parser, Debug)]
#[command(
    name = "vnvme",
    version,
    about = "An NVMe controller served over vfio-user, a user-space NVMe driver, and their benchmarks"
)]
struct Cli {
    /// More logging on stderr (-v debug, -vv trace); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Measure IOPS, traps per I/O and interrupts per I/O against queue depth for each doorbell mode
    /// (controller and driver in this process, over a real vfio-user socketpair).
    Bench(BenchCommand),
    /// Serve an NVMe controller on a vfio-user socket (for QEMU's vfio-user-pci or `vnvme` tools).
    Serve(ServeOptions),
    /// Print the Identify Controller data of a vfio-user NVMe device, like `nvme id-ctrl`.
    IdCtrl(DeviceArgs),
    /// List the namespaces of a vfio-user NVMe device, like `nvme list`.
    List(DeviceArgs),
    /// Send any admin command and print its completion, like `nvme admin-passthru`.
    AdminPassthru(vnvme::passthru::PassthruArgs),
    /// Send any I/O command (on I/O queue 1) and print its completion, like `nvme io-passthru`.
    IoPassthru(vnvme::passthru::PassthruArgs),
    /// Change or break a running `vnvme serve --control PATH`: namespaces, faults, stats, shutdown.
    Ctl(vnvme::control::client::CtlOptions),
}

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
struct BenchCommand {
    #[command(subcommand)]
    which: Option<BenchWhich>,
    #[command(flatten)]
    opts: BenchOptions,
}

#[derive(Subcommand, Debug)]
enum BenchWhich {
    /// 4 KiB random reads through sync passthrough, async passthrough and the block API, against queue depth
    /// (the seed's async passthrough table).
    Passthru(bench::passthru::PassthruOptions),
    /// Admin commands at driver initialisation (fast against the old learning dance) and the time
    /// until every namespace is usable, per number of I/O queues (the seed's nvmewin fast-init table).
    Init(bench::init::InitBenchOptions),
    /// Sequential 4 KiB writes on a zoned namespace against the same on a conventional one, per queue
    /// depth (the cost of the zone bookkeeping).
    Zns(bench::zns::ZnsBenchOptions),
    /// How long a busy client's I/O stalls while `vnvme serve` is upgraded (`vnvme ctl upgrade`),
    /// and the handover's time by phase, per doorbell mode.
    Upgrade(bench::upgrade::UpgradeBenchOptions),
}

#[derive(Args, Debug)]
struct DeviceArgs {
    /// The vfio-user server socket.
    #[arg(long, short = 's', default_value = serve::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let result = match cli.command {
        Command::Bench(BenchCommand { which: None, opts }) => bench::main(&opts),
        Command::Bench(BenchCommand {
            which: Some(BenchWhich::Passthru(opts)),
            ..
        }) if opts.guest => bench::guest::passthru::main(&opts),
        Command::Bench(BenchCommand {
            which: Some(BenchWhich::Passthru(opts)),
            ..
        }) => bench::passthru::main(&opts),
        Command::Bench(BenchCommand {
            which: Some(BenchWhich::Init(opts)),
            ..
        }) => bench::init::main(&opts),
        Command::Bench(BenchCommand {
            which: Some(BenchWhich::Zns(opts)),
            ..
        }) => bench::zns::main(&opts),
        Command::Bench(BenchCommand {
            which: Some(BenchWhich::Upgrade(opts)),
            ..
        }) => bench::upgrade::main(&opts),
        Command::Serve(opts) => serve::run(opts),
        Command::IdCtrl(d) => tools::id_ctrl(&d.socket, d.json),
        Command::List(d) => tools::list(&d.socket, d.json),
        Command::AdminPassthru(a) => vnvme::passthru::run(&a, vnvme::passthru::Queue::Admin),
        Command::IoPassthru(a) => vnvme::passthru::run(&a, vnvme::passthru::Queue::Io),
        Command::Ctl(c) => vnvme::control::client::run(&c),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vnvme: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
