//! `vnvme serve` as its own process, for what needs signals or an exact fd
//! count: SIGTERM must stop it within 2 s whatever the client does.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How fast SIGTERM must stop the server (issue: "within 2 s").
pub(crate) const STOP_LIMIT: Duration = Duration::from_secs(2);

pub(crate) struct ServeProcess {
    child: Child,
    pub(crate) path: PathBuf,
    dir: PathBuf,
}

impl ServeProcess {
    /// `vnvme serve` on a socket in a fresh folder, one 16 MiB RAM
    /// namespace, at most 4 I/O queues, plus `extra` arguments.
    pub(crate) fn start(extra: &[&str]) -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("vnvme-hostile-serve-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("vnvme.sock");
        let log = std::fs::File::create(dir.join("serve.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_vnvme"))
            .args(["serve", "--socket"])
            .arg(&path)
            .args(["--ns", "16M:ram", "--max-io-queues", "4", "-v"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn vnvme serve");
        let me = Self { child, path, dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !me.path.exists() {
            assert!(
                Instant::now() < deadline,
                "vnvme serve did not create its socket:\n{}",
                me.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        me
    }

    pub(crate) fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Open fds of the server process.
    pub(crate) fn fd_count(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .expect("the server process is alive")
            .count()
    }

    /// The server's log so far (stderr, with -v).
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
    }

    /// The server is still running.
    pub(crate) fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Sends SIGTERM and waits for the process: it must exit 0 within
    /// [`STOP_LIMIT`] and remove its socket. Returns the time it took.
    pub(crate) fn sigterm(mut self) -> Duration {
        let started = Instant::now();
        let status = self.terminate();
        let took = started.elapsed();
        assert!(
            status.success(),
            "vnvme serve exited with {status}:\n{}",
            self.log()
        );
        assert!(!self.path.exists(), "the socket file was left behind");
        assert!(
            took < STOP_LIMIT,
            "SIGTERM took {took:?} to stop the server:\n{}",
            self.log()
        );
        eprintln!("SIGTERM to exit: {took:?}");
        took
    }

    /// Sends SIGTERM and waits (15 s at most) for the process to exit.
    /// Sends SIGTERM and returns how long until the server exited: its
    /// main thread is gone (a zombie) even if the kernel cannot reap the
    /// process yet, as while an io_uring request of it waits on a hung
    /// filesystem; `None` if it still runs after `limit`.
    pub(crate) fn sigterm_exits_within(&mut self, limit: Duration) -> Option<Duration> {
        let started = Instant::now();
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(self.pid()).unwrap(),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        while started.elapsed() < limit {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid()));
            // "PID (comm) STATE ...": the state follows the last ')'.
            let state = stat
                .as_deref()
                .ok()
                .and_then(|s| s.rsplit(')').next())
                .map(str::trim);
            if state.is_none_or(|s| s.starts_with('Z') || s.starts_with('X')) {
                return Some(started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }

    /// Waits for the server's exit status.
    pub(crate) fn wait(&mut self) -> std::process::ExitStatus {
        self.child.wait().unwrap()
    }

    pub(crate) fn terminate(&mut self) -> std::process::ExitStatus {
        assert!(
            self.alive(),
            "the server died before SIGTERM:\n{}",
            self.log()
        );
        let started = Instant::now();
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(self.pid()).unwrap(),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "vnvme serve still runs 15 s after SIGTERM:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
