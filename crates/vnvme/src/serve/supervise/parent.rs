//! A supervised server stops when its supervisor dies (SIGKILLed, it
//! cannot pass its stop on): the parent-death signal (`PR_SET_PDEATHSIG`).
//!
//! That signal is sent when the process's *parent* dies, and the parent
//! of a live upgrade's new process is the old server, which exits once
//! the new one is ready: asked for at once, the signal would stop the new
//! process at the very moment it takes over. The supervisor is a child
//! subreaper (`PR_SET_CHILD_SUBREAPER`), so it adopts the new process when
//! the old one exits; the new process asks for the signal only then.

use std::os::fd::OwnedFd;

use anyhow::{Context, Result};
use rustix::process::{Pid, Signal};

/// Asks for SIGTERM at the supervisor's death and returns the
/// supervisor's pid: at once for a child the supervisor started
/// (`supervisor` is `None`: the parent is the supervisor); for an
/// upgrade's new process (`supervisor` is the supervisor's pid), once the
/// old process exited and the supervisor adopted this one, on a thread
/// that waits for it.
pub fn die_with_supervisor(supervisor: Option<u32>) -> Result<u32> {
    let parent = parent();
    let Some(supervisor) = supervisor else {
        ask().context("asking for a signal at the supervisor's death")?;
        return Ok(parent);
    };
    let old = match Pid::from_raw(parent as i32).filter(|_| parent != supervisor) {
        Some(pid) => rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok(),
        None => None,
    };
    let Some(old) = old else {
        // Adopted already (the old process is gone).
        adopted(supervisor).context("asking for a signal at the supervisor's death")?;
        return Ok(supervisor);
    };
    std::thread::Builder::new()
        .name("vnvme-parent-watch".into())
        .spawn(move || watch(old, supervisor))
        .context("starting the thread that waits for the supervisor to adopt this process")?;
    Ok(supervisor)
}

/// Waits until the old process (`old`, a pidfd) exits, then asks for the
/// signal; stays parked, since the kernel keeps the request per thread.
fn watch(old: OwnedFd, supervisor: u32) {
    loop {
        let mut fds = [rustix::event::PollFd::new(
            &old,
            rustix::event::PollFlags::IN,
        )];
        match rustix::event::poll(&mut fds, None) {
            Ok(_) if !fds[0].revents().is_empty() => break,
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                tracing::error!(
                    "waiting for the old process to exit ({e}): this process will not stop at \
                     the supervisor's death"
                );
                return;
            }
        }
    }
    drop(old);
    if let Err(e) = adopted(supervisor) {
        tracing::error!("{e}: this process will not stop at the supervisor's death");
        return;
    }
    loop {
        std::thread::park();
    }
}

/// The old process is gone: asks for the signal, then checks the parent
/// is the supervisor (one that died before the request sends nothing;
/// then this process stops at once, as it would have been told to).
fn adopted(supervisor: u32) -> std::io::Result<()> {
    ask()?;
    let parent = parent();
    if parent != supervisor {
        tracing::error!(
            "the supervisor (pid {supervisor}) is gone (this process's parent is {parent}): \
             stopping"
        );
        rustix::process::kill_process(rustix::process::getpid(), Signal::TERM)?;
    }
    Ok(())
}

/// This process's parent's pid (0: none).
fn parent() -> u32 {
    rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get() as u32)
}

fn ask() -> std::io::Result<()> {
    Ok(rustix::process::set_parent_process_death_signal(Some(
        Signal::TERM,
    ))?)
}
