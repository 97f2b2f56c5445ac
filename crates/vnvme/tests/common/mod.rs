//! What the CLI tests share: the `vnvme` binary, a `vnvme serve` child that
//! cannot outlive its test, and running the tools against it.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use vnvme_driver::VfioUserAccess;

pub mod client;
pub mod crc32c;
pub mod io_thread;
pub mod pattern;
pub mod proc_counts;
pub mod rounds;
pub mod supervised;

pub const BIN: &str = env!("CARGO_BIN_EXE_vnvme");

/// A fresh, empty temporary folder for one test, removed with what it
/// holds when dropped (also when the test fails).
pub struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn temp_dir(name: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("vnvme-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

/// A `vnvme serve` child, killed if the test ends before stopping it (else it
/// would hold the test's output pipe and hang `cargo test`).
pub struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

impl Served {
    /// Takes a started server (or a launcher that will exec one).
    pub fn from_child(child: Child) -> Self {
        Served(child)
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Whether the server is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None))
    }

    /// Stops the server as a user would (SIGTERM) and returns how it exited.
    pub fn terminate(mut self) -> ExitStatus {
        self.terminate_ref()
    }
}

impl Served {
    /// Stops the server (SIGTERM) if it runs, and returns how it exited
    /// with what it wrote to stderr (which the caller must have piped).
    pub fn terminate_with_stderr(mut self) -> (ExitStatus, String) {
        let mut log = String::new();
        let stderr = self.0.stderr.take();
        let status = self.terminate_ref();
        if let Some(mut e) = stderr {
            let _ = std::io::Read::read_to_string(&mut e, &mut log);
        }
        (status, log)
    }

    /// Waits up to `timeout` for the server to exit by itself (an error
    /// at start), then stops it; how it exited and its stderr (piped).
    pub fn exit_with_stderr(mut self, timeout: Duration) -> (ExitStatus, String) {
        let deadline = Instant::now() + timeout;
        while matches!(self.0.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.terminate_with_stderr()
    }

    fn terminate_ref(&mut self) -> ExitStatus {
        if let Some(status) = self.0.try_wait().unwrap() {
            return status;
        }
        let pid = rustix::process::Pid::from_child(&self.0);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "serve did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Starts `vnvme serve --socket SOCKET ARGS...` and waits for its socket.
pub fn serve(socket: &Path, args: &[&str]) -> Served {
    let mut child = Command::new(BIN)
        .args(["serve", "--socket"])
        .arg(socket)
        .args(args)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "serve did not create its socket");
        assert!(child.try_wait().unwrap().is_none(), "serve exited early");
        std::thread::sleep(Duration::from_millis(20));
    }
    Served(child)
}

/// Starts `vnvme serve ARGS...` with its stderr in `log`, and waits until
/// every path of `ready` (its sockets) exists; fails with the log if the
/// server exits first.
pub fn serve_logged<A: AsRef<OsStr>>(args: &[A], log: &Path, ready: &[&Path]) -> Served {
    let child = Command::new(BIN)
        .arg("serve")
        .args(args)
        .stderr(std::fs::File::create(log).unwrap())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut served = Served(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready.iter().all(|p| p.exists()) {
        assert!(
            served.running(),
            "serve exited: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        assert!(
            Instant::now() < deadline,
            "serve did not create its sockets"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    served
}

/// Connects to a server's socket, retrying for 10 s: the socket file
/// appears at bind(), a moment before listen(). The last error after that.
pub fn connect(socket: &Path) -> Result<VfioUserAccess, vnvme_vfio_user::Error> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match VfioUserAccess::connect(socket) {
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            r => return r,
        }
    }
}

/// `vnvme ctl --control CONTROL ARGS...`
pub fn ctl(control: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(["ctl", "--control"])
        .arg(control)
        .args(args)
        .output()
        .unwrap()
}

/// `vnvme ctl --control CONTROL --json ARGS...`, which must succeed: its
/// result.
pub fn ctl_ok(control: &Path, args: &[&str]) -> serde_json::Value {
    let mut a = vec!["--json"];
    a.extend_from_slice(args);
    let out = ctl(control, &a);
    assert!(
        out.status.success(),
        "ctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&out)
}

/// `vnvme ctl --control CONTROL ARGS...`, which must fail: what it said.
pub fn ctl_err(control: &Path, args: &[&str]) -> String {
    let out = ctl(control, args);
    assert!(!out.status.success(), "ctl {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `vnvme ARGS... --socket SOCKET`.
pub fn vnvme(args: &[&str], socket: &Path) -> Output {
    Command::new(BIN)
        .args(args)
        .arg("--socket")
        .arg(socket)
        .output()
        .unwrap()
}

/// The JSON a command printed, or a panic showing what it printed instead.
pub fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}
