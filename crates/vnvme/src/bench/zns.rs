//! `vnvme bench zns`: sequential 4 KiB writes on a zoned namespace against
//! the same writes on a conventional namespace of the same size and
//! backend, at each queue depth, in one process (controller and driver
//! over a real vfio-user socketpair). What the zoned namespace adds is its
//! zone bookkeeping: each write checked against its zone's write pointer
//! under the namespace's zone lock, and a reset of every zone when the
//! writes reach the end (the conventional namespace just wraps).
//!
//! The two are measured in alternation, conventional first, for
//! `--rounds` rounds; each line prints both and their ratio, so a loaded
//! machine shifts both alike.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use vnvme_driver::{DmaBuffer, InitOptions, IoQueue};
use vnvme_spec::zns::zsa;
use vnvme_spec::NvmOpcode;

use super::{BackendArg, List};
use crate::device::DeviceOptions;
use crate::identity::Origin;
use crate::inproc::InProcess;
use crate::namespace::NamespaceSpec;
use crate::size::parse_size;
use crate::zoned_options::DEFAULT_ZONE_SIZE;

const CONVENTIONAL: u32 = 1;
const ZONED: u32 = 2;
const BLOCK: usize = 4096;

#[derive(Args, Debug, Clone)]
pub struct ZnsBenchOptions {
    /// Queue depths, comma separated (1 to 1023).
    #[arg(long, default_value = "1,8,32")]
    pub qd: List<u16>,
    /// Seconds per namespace per point (fractions allowed).
    #[arg(long, default_value = "1.5")]
    pub runtime: f64,
    /// Rounds of the two namespaces in alternation per queue depth.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=100))]
    pub rounds: u16,
    /// Size of each namespace.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub size: u64,
    /// Zone size of the zoned namespace (a power of two).
    #[arg(long, default_value_t = DEFAULT_ZONE_SIZE, value_parser = parse_size)]
    pub zone_size: u64,
    /// Backend of both namespaces (ram or null: a file would measure the disk).
    #[arg(long, value_enum, default_value = "ram")]
    pub backend: BackendArg,
}

/// One namespace at one queue depth.
#[derive(Debug, Clone, Copy)]
struct Point {
    iops: f64,
    /// Zone resets (Select All) the run needed to wrap around.
    resets: u64,
}

pub fn main(opts: &ZnsBenchOptions) -> Result<()> {
    let runtime = super::check_runtime(opts.runtime)?;
    super::check_qd(&opts.qd.0)?;
    let backend = match opts.backend {
        BackendArg::Ram => "ram",
        BackendArg::Null => "null",
        BackendArg::File => bail!("--backend file would measure the disk: use ram or null"),
    };
    let size = opts.size;
    let conventional: NamespaceSpec = format!("{size}:{backend}")
        .parse()
        .map_err(anyhow::Error::msg)?;
    let zoned: NamespaceSpec = format!("{size}:{backend},zoned,zone-size={}", opts.zone_size)
        .parse()
        .map_err(anyhow::Error::msg)?;
    let max_qd = opts.qd.0.iter().copied().max().unwrap_or(1);
    let device = DeviceOptions {
        max_io_queues: 1,
        ..DeviceOptions::default()
    }
    .build(&[conventional, zoned], &Origin::embedded())?;
    let init = InitOptions {
        io_queues: 1,
        queue_depth: max_qd.saturating_add(1).max(2),
        ..InitOptions::default()
    };
    let (_inproc, access, driver) = InProcess::start_driver(device, init)?;
    let blocks = |nsid: u32| {
        driver
            .namespaces()
            .iter()
            .find(|n| n.nsid == nsid && n.lba_size as usize == BLOCK)
            .map(|n| n.blocks)
            .with_context(|| format!("namespace {nsid} with 4096-byte blocks"))
    };
    let (conv_blocks, zoned_blocks) = (blocks(CONVENTIONAL)?, blocks(ZONED)?);
    let mut q = driver.take_io_queue(0)?;
    let bufs: Vec<DmaBuffer> = (0..max_qd)
        .map(|_| access.dma_alloc(BLOCK))
        .collect::<Result<_, _>>()?;
    eprintln!(
        "bench zns: sequential 4 KiB writes, {} s per point, {} rounds, {backend} namespaces of {} MiB, zones of {} MiB",
        runtime.as_secs_f64(),
        opts.rounds,
        size >> 20,
        opts.zone_size >> 20
    );
    let mut cursor = [0u64; 2];
    for &qd in &opts.qd.0 {
        for round in 1..=opts.rounds {
            let c = run(
                &mut q,
                CONVENTIONAL,
                conv_blocks,
                &mut cursor[0],
                qd,
                &bufs,
                runtime,
            )?;
            let z = run(
                &mut q,
                ZONED,
                zoned_blocks,
                &mut cursor[1],
                qd,
                &bufs,
                runtime,
            )?;
            println!(
                "qd {qd:>3} round {round}: conventional {:>9.0} IOPS, zoned {:>9.0} IOPS ({} zone resets), zoned/conventional {:.2}",
                c.iops,
                z.iops,
                z.resets,
                z.iops / c.iops.max(1.0)
            );
        }
    }
    Ok(())
}

/// Sequential one-block writes to `nsid` from `*cursor` on for `runtime`,
/// `qd` in flight, wrapping at the end (a zoned namespace resets every
/// zone first, once nothing is in flight).
fn run(
    q: &mut IoQueue,
    nsid: u32,
    blocks: u64,
    cursor: &mut u64,
    qd: u16,
    bufs: &[DmaBuffer],
    runtime: Duration,
) -> Result<Point> {
    let start = Instant::now();
    let deadline = start + runtime;
    let mut done = Vec::with_capacity(usize::from(qd));
    let mut free: Vec<usize> = (0..usize::from(qd)).collect();
    let (mut completed, mut resets) = (0u64, 0u64);
    let mut slot_of = vec![0usize; usize::from(u16::MAX) + 1];
    loop {
        let open = Instant::now() < deadline;
        if open && *cursor >= blocks && q.outstanding() == 0 {
            if nsid == ZONED {
                q.zone_action(nsid, 0, zsa::RESET, true)?;
                resets += 1;
            }
            *cursor = 0;
        }
        while open && *cursor < blocks {
            let Some(slot) = free.pop() else { break };
            let buf = bufs.get(slot).context("buffer")?;
            let cid = q.enqueue_rw(NvmOpcode::WRITE, nsid, *cursor, 1, buf)?;
            slot_of[usize::from(cid)] = slot;
            *cursor += 1;
            q.ring()?;
        }
        if q.outstanding() == 0 {
            if open {
                continue;
            }
            break;
        }
        done.clear();
        q.wait(&mut done, usize::from(qd), Duration::from_secs(10))
            .context("waiting for completions")?;
        for c in &done {
            if !c.status().is_success() {
                bail!("a write to namespace {nsid} failed: {:?}", c.status());
            }
            free.push(slot_of[usize::from(c.cid())]);
            completed += 1;
        }
    }
    Ok(Point {
        iops: completed as f64 / start.elapsed().as_secs_f64(),
        resets,
    })
}
