//! A supervised server (`vnvme serve --supervise`) for a test: started
//! with its log in a temporary folder, waited on through its log lines,
//! killed with the test.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vnvme_driver::{Controller, IoQueue, VfioUserAccess};

use super::{temp_dir, TempDir, BIN};

/// A supervised server of a 16 MiB `file` namespace.
pub struct Rig {
    pub dir: TempDir,
    pub socket: PathBuf,
    pub supervisor: Child,
    /// The namespace's folder, apart from the log's.
    pub ns_dir: Option<TempDir>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        // The server gets SIGTERM when its supervisor dies.
        let _ = self.supervisor.kill();
        let _ = self.supervisor.wait();
    }
}

pub fn rig(name: &str, args: &[&str]) -> Rig {
    let dir = temp_dir(name);
    let socket = dir.join("vnvme.sock");
    let log = std::fs::File::create(dir.join("serve.log")).unwrap();
    let supervisor = Command::new(BIN)
        .args(["serve", "--supervise", "--socket"])
        .arg(&socket)
        .args(args)
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    let r = Rig {
        dir,
        socket,
        supervisor,
        ns_dir: None,
    };
    r.wait_log("supervising the server, pid", 1);
    r
}

pub fn file_rig(name: &str, mode: &str) -> Rig {
    file_rig_with(name, mode, &[])
}

pub fn file_rig_with(name: &str, mode: &str, extra: &[&str]) -> Rig {
    let dir = temp_dir(&format!("{name}-ns"));
    let ns = format!("16M:file={}", dir.join("ns1.img").display());
    let mut args = vec!["--ns", &ns, "--doorbells", mode];
    args.extend_from_slice(extra);
    let mut r = rig(name, &args);
    r.ns_dir = Some(dir);
    r
}

/// [`file_rig`] with a control socket (`--control`): the rig, the
/// folder the socket is in (kept while the test runs) and its path.
pub fn controlled_file_rig(name: &str, mode: &str) -> (Rig, TempDir, PathBuf) {
    let dir = temp_dir(&format!("{name}-control"));
    let control = dir.join("control.sock");
    let arg = control.display().to_string();
    (
        file_rig_with(name, mode, &["--control", &arg]),
        dir,
        control,
    )
}

impl Rig {
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
    }

    /// Waits until `what` is in the log `n` times.
    pub fn wait_log(&self, what: &str, n: usize) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let log = self.log();
            if log.matches(what).count() >= n {
                return log;
            }
            assert!(
                Instant::now() < deadline && alive(self.supervisor.id() as i32),
                "{what:?} not {n} times in the log:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The pid of the server the supervisor started last.
    pub fn server_pid(&self) -> i32 {
        let log = self.log();
        let at = log.rfind("supervising the server, pid ").unwrap();
        let rest = &log[at + "supervising the server, pid ".len()..];
        let end = rest.find(|c: char| !c.is_ascii_digit()).unwrap();
        rest[..end].parse().unwrap()
    }

    pub fn client(&self) -> (Arc<VfioUserAccess>, Controller, IoQueue) {
        super::client::default_client(&self.socket)
    }
}

pub fn kill(pid: i32, sig: rustix::process::Signal) {
    rustix::process::kill_process(rustix::process::Pid::from_raw(pid).unwrap(), sig).unwrap();
}

/// Whether `pid` runs (a zombie, exited and not yet reaped, does not).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.starts_with(" Z"))
    })
}
