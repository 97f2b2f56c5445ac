//! Messages with fds (and fd replies) handled at a kill (issue 35, task
//! "fdmsg"): the server is held in a DMA_MAP, DMA_UNMAP, SET_IRQS or
//! region info by the control socket's `hold_message` fault, at one of
//! its two points (marked and not handled; handled, kept and its reply
//! staged), and killed there. The next server handles the message again
//! with the fds the supervisor kept, against a state that holds its
//! effect or not, and the client on the same connection gets exactly one
//! reply, the effect took place once, and its I/O before and after is
//! verified.

use std::os::fd::AsFd;
use std::sync::Arc;

use vnvme_driver::access::DmaRegion;
use vnvme_spec::Completion;
use vnvme_vfio_user::{irq, region};

use super::*;
use crate::common::TempDir;
use vnvme_driver::DmaBuffer;

/// Where our maps go: far above the driver's pool (`DmaPool::BASE_IOVA`).
const IOVA: u64 = 1 << 40;
const REGION_LEN: usize = 64 << 10;

/// Kills the server the supervisor started last once it holds the
/// message `hold_message` armed (the log says so for the `n`th time),
/// while `call` waits for its reply on another thread; returns what
/// `call` returned once the next server answered (or closed the
/// connection), and the log once that server runs.
fn kill_while_held<T: Send + 'static>(
    r: &Rig,
    n: usize,
    call: impl FnOnce() -> T + Send + 'static,
) -> (T, String) {
    let waiting = std::thread::spawn(call);
    r.wait_log("hold_message: holding vfio-user message", n);
    kill(r.server_pid(), rustix::process::Signal::KILL);
    r.wait_log("died (signal: 9 (SIGKILL))", n);
    // A hang guard only: the reply comes as soon as the next server runs.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !waiting.is_finished() {
        assert!(
            Instant::now() < deadline,
            "no reply after the kill:\n{}",
            r.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let got = waiting.join().unwrap();
    (got, r.wait_log("supervising the server, pid", n + 1))
}

/// A supervised `file` rig in `mode` with a control socket (its folder
/// kept with it), our driver's client on it, round 1 written.
struct Served {
    r: Rig,
    _dir: TempDir,
    control: std::path::PathBuf,
    access: Arc<VfioUserAccess>,
    ctrl: Controller,
    q: IoQueue,
}

fn served(name: &str, mode: &str) -> Served {
    let (r, _dir, control) = controlled_file_rig(name, mode);
    let (access, ctrl, mut q) = r.client();
    round(&r, &access, &mut q, 1, true);
    Served {
        r,
        _dir,
        control,
        access,
        ctrl,
        q,
    }
}

/// Round 1 read back, round 2 written and read back, and no reply came
/// that no call waited for.
fn verified_on(r: &Rig, access: &VfioUserAccess, q: &mut IoQueue) {
    round(r, access, q, 1, false);
    round(r, access, q, 2, true);
    assert_eq!(access.client().unexpected_replies(), 0, "{}", r.log());
}

/// Arms `hold_message` for `command` at `at`.
fn hold(control: &std::path::Path, command: &str, at: &str) {
    ctl_ok(
        control,
        &[
            "hold_message",
            &format!("command={command}"),
            &format!("at={at}"),
        ],
    );
}

/// One command on `q` (one block at `lba` from or into `buf`), waited for.
fn io(q: &mut IoQueue, opcode: NvmOpcode, lba: u64, buf: &DmaBuffer) -> Completion {
    let cid = q.enqueue_rw(opcode, 1, lba, 1, buf).unwrap();
    q.ring().unwrap();
    q.wait_cid(cid).unwrap()
}

fn ok(c: &Completion) -> bool {
    c.status().is_success()
}

/// The log says the client is served on its connection and the next
/// server handled the message (`command`) again.
fn assert_handled_again(log: &str, command: u16) {
    assert!(
        log.contains("starting a new server that serves the client on its connection"),
        "{log}"
    );
    let again = log
        .lines()
        .find(|l| l.contains("handling again the vfio-user message the dead server was handling"))
        .unwrap_or_else(|| panic!("not handled again:\n{log}"));
    assert!(again.contains(&format!(" command={command}")), "{again}");
}

/// A DMA_MAP held at `at` and killed there is handled again with its fd:
/// one reply, the map made once (answered as done when the slot held it
/// already), I/O through it both ways, and the disk's data from before
/// intact.
fn a_dma_map_survives_a_kill(at: &str) {
    let mut s = served(&format!("fdmsg-map-{at}"), "trap");
    let (r, control, access, q) = (&s.r, &s.control, &s.access, &mut s.q);
    hold(control, "dma_map", at);
    let mem = Arc::new(DmaRegion::new(REGION_LEN, IOVA).unwrap());
    mem.buffer(0, BLOCK)
        .unwrap()
        .write_bytes(0, &block(3, 9))
        .unwrap();
    let (a, m) = (Arc::clone(access), Arc::clone(&mem));
    let (mapped, log) = kill_while_held(r, 1, move || {
        a.client().dma_map(IOVA, REGION_LEN as u64, m.fd(), 0, true)
    });
    mapped.unwrap_or_else(|e| panic!("DMA_MAP: {e}\n{}", r.log()));
    assert_handled_again(&log, 2);
    let done_already = log.contains("the map is there already");
    assert_eq!(done_already, at == "kept", "{log}");
    // Written from the new map, read back into it elsewhere.
    let from = mem.buffer(0, BLOCK).unwrap();
    assert!(ok(&io(q, NvmOpcode::WRITE, 3, &from)));
    let into = mem.buffer(BLOCK, BLOCK).unwrap();
    assert!(ok(&io(q, NvmOpcode::READ, 3, &into)));
    assert!(into.to_vec() == block(3, 9));
    // The rest of the disk as round 1 left it (block 3 excepted).
    let check = access.dma_alloc(BLOCK).unwrap();
    for lba in (0..BLOCKS).filter(|&l| l != 3) {
        assert!(ok(&io(q, NvmOpcode::READ, lba, &check)));
        assert!(check.to_vec() == block(lba, 1), "LBA {lba}");
    }
    round(r, access, q, 2, true);
    assert_eq!(access.client().unexpected_replies(), 0, "{}", r.log());
}

#[test]
fn a_dma_map_marked_at_the_kill_is_made_by_the_next_server() {
    a_dma_map_survives_a_kill("handling");
}

#[test]
fn a_dma_map_kept_at_the_kill_is_answered_as_done_by_the_next_server() {
    a_dma_map_survives_a_kill("kept");
}

/// A DMA_UNMAP held at `at` and killed there is handled again: one reply,
/// the range gone (a command into it fails, the server says the map is
/// not there), the rest of the client's I/O verified on.
fn a_dma_unmap_survives_a_kill(at: &str) {
    let mut s = served(&format!("fdmsg-unmap-{at}"), "trap");
    let (r, control, access, q) = (&s.r, &s.control, &s.access, &mut s.q);
    let mem = Arc::new(DmaRegion::new(REGION_LEN, IOVA).unwrap());
    access
        .client()
        .dma_map(IOVA, REGION_LEN as u64, mem.fd(), 0, true)
        .unwrap();
    let buf = mem.buffer(0, BLOCK).unwrap();
    assert!(ok(&io(q, NvmOpcode::READ, 2, &buf)));
    assert!(buf.to_vec() == block(2, 1));
    hold(control, "dma_unmap", at);
    let a = Arc::clone(access);
    let (unmapped, log) =
        kill_while_held(r, 1, move || a.client().dma_unmap(IOVA, REGION_LEN as u64));
    unmapped.unwrap_or_else(|e| panic!("DMA_UNMAP: {e}\n{}", r.log()));
    assert_handled_again(&log, 3);
    buf.fill(0, BLOCK, 0xa5).unwrap();
    let refused = io(q, NvmOpcode::READ, 2, &buf);
    assert!(!ok(&refused), "a read into the unmapped range: {refused:?}");
    assert!(buf.to_vec().iter().all(|&b| b == 0xa5));
    verified_on(r, access, q);
}

#[test]
fn a_dma_unmap_marked_at_the_kill_is_made_by_the_next_server() {
    a_dma_unmap_survives_a_kill("handling");
}

#[test]
fn a_dma_unmap_kept_at_the_kill_is_answered_as_done_by_the_next_server() {
    a_dma_unmap_survives_a_kill("kept");
}

/// A SET_IRQS giving the I/O queue's vector a new eventfd, held at `at`
/// and killed there, is handled again with that eventfd: one reply, and
/// the I/O queue's interrupts arrive on the new eventfd.
fn a_set_irqs_survives_a_kill(at: &str) {
    let mut s = served(&format!("fdmsg-irqs-{at}"), "trap");
    let (r, control, access, q) = (&s.r, &s.control, &s.access, &mut s.q);
    let vector = q.interrupt_vector().expect("the I/O queue has a vector");
    let new = Arc::new(
        rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )
        .unwrap(),
    );
    hold(control, "set_irqs", at);
    let (a, fd) = (Arc::clone(access), Arc::clone(&new));
    let (set, log) = kill_while_held(r, 1, move || {
        a.client()
            .set_irqs_eventfds(irq::MSIX, u32::from(vector), &[fd.as_fd()])
    });
    set.unwrap_or_else(|e| panic!("SET_IRQS: {e}\n{}", r.log()));
    assert_handled_again(&log, 8);
    verified_on(r, access, q);
    // The completions of those rounds signal the new eventfd (within the
    // coalescing time: the poll is a hang guard).
    let mut fds = [rustix::event::PollFd::new(
        &*new,
        rustix::event::PollFlags::IN,
    )];
    let guard = rustix::event::Timespec {
        tv_sec: 30,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&guard)).unwrap();
    let mut count = [0u8; 8];
    rustix::io::read(&*new, &mut count).expect("no interrupt on the new eventfd");
    assert!(u64::from_ne_bytes(count) > 0);
}

#[test]
fn a_set_irqs_marked_at_the_kill_is_made_by_the_next_server() {
    a_set_irqs_survives_a_kill("handling");
}

#[test]
fn a_set_irqs_kept_at_the_kill_is_made_again_by_the_next_server() {
    a_set_irqs_survives_a_kill("kept");
}

/// A region info request (its reply carries the doorbell page's memfd,
/// sent straight) killed before its reply is handled again: the client
/// gets one reply with the fd. Killed after the reply went out (`kept`),
/// the doubt remains (the client may or may not have it): the connection
/// is closed, saying why, and the next client is served. (Our client asks
/// twice, the first time with too small an argsz: each is held once.)
#[test]
fn a_region_info_killed_before_its_fd_reply_is_handled_again_and_after_it_is_the_old_doubt() {
    let Served {
        r,
        _dir,
        control,
        access,
        ctrl,
        mut q,
    } = served("fdmsg-info", "adaptive");
    hold(&control, "region_info", "handling");
    let a = Arc::clone(&access);
    let (info, log) = kill_while_held(&r, 1, move || a.client().region_info(region::BAR0));
    let (info, fd) = info.unwrap_or_else(|e| panic!("region info: {e}\n{}", r.log()));
    assert!(fd.is_some(), "no doorbell memfd with {info:?}");
    assert_handled_again(&log, 5);
    round(&r, &access, &mut q, 1, false);
    assert_eq!(access.client().unexpected_replies(), 0, "{}", r.log());

    hold(&control, "region_info", "kept");
    let a = Arc::clone(&access);
    let (info, log) = kill_while_held(&r, 2, move || a.client().region_info(region::BAR0).err());
    assert!(info.is_some(), "the connection served on");
    let death = log
        .lines()
        .rfind(|l| l.contains("died (signal: 9 (SIGKILL))"))
        .unwrap();
    assert!(
        death.contains("(command 5), which cannot be handled again"),
        "{death}"
    );
    drop((q, ctrl, access));
    let (access, _ctrl, mut q) = r.client();
    round(&r, &access, &mut q, 1, false);
}
