//! The host side of a guest benchmark: the `vnvme serve` child, the console
//! log followed as it grows, and the temporary folder they live in.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};

use super::{BEGIN, END, SLICE_MARK};

/// New complete lines of a growing file.
#[derive(Debug, Default)]
pub(super) struct Tail {
    offset: u64,
    partial: String,
}

impl Tail {
    pub(super) fn lines(&mut self, path: &Path) -> Vec<String> {
        let Ok(mut f) = std::fs::File::open(path) else {
            return Vec::new();
        };
        let mut buf = Vec::new();
        if f.seek(SeekFrom::Start(self.offset)).is_err() || f.read_to_end(&mut buf).is_err() {
            return Vec::new();
        }
        self.offset += buf.len() as u64;
        self.partial.push_str(&String::from_utf8_lossy(&buf));
        let mut out = Vec::new();
        while let Some(i) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=i).collect();
            // The console is a serial line: "\r\n", and a marker can follow
            // kernel output on the same line.
            let line = line.trim_end_matches(['\r', '\n']);
            for marker in [BEGIN, END, SLICE_MARK] {
                if let Some(at) = line.find(marker) {
                    out.push(line[at..].to_string());
                }
            }
        }
        out
    }
}

/// `vnvme serve` as a child of this executable.
pub(super) struct Server {
    child: Child,
    pub(super) socket: PathBuf,
}

impl Server {
    /// `vnvme serve` (of `exe`, or this executable) with its socket and log
    /// in `dir`, counters in `stats`, and `args` (namespaces, doorbell
    /// mode, ...).
    pub(super) fn start(
        exe: Option<&Path>,
        dir: &Path,
        stats: &Path,
        args: &[String],
    ) -> Result<Self> {
        let exe = match exe {
            Some(e) => e.to_path_buf(),
            None => std::env::current_exe().context("finding the vnvme executable")?,
        };
        let socket = dir.join("vnvme.sock");
        let log = dir.join("serve.log");
        let mut cmd = Command::new(&exe);
        cmd.arg("serve")
            .arg("--socket")
            .arg(&socket)
            .arg("--stats")
            .arg(stats)
            .args(args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log)?)
            .stderr(std::fs::File::create(&log)?.try_clone()?);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {} serve", exe.display()))?;
        let mut server = Self { child, socket };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !server.socket.exists() {
            if let Some(status) = server.child.try_wait()? {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                bail!("vnvme serve exited ({status}): {}", text.trim());
            }
            if Instant::now() > deadline {
                server.stop();
                bail!(
                    "vnvme serve did not create {} in 10 s",
                    server.socket.display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(server)
    }

    /// SIGTERM, then SIGKILL after 3 s.
    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(super) fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        if let Some(pid) = rustix::process::Pid::from_child(&self.child).into() {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("pid", &self.child.id())
            .field("socket", &self.socket)
            .finish()
    }
}

/// Why `run-test.sh` exited with `code` (its documented exit statuses).
pub(super) fn run_test_failure(code: i32) -> &'static str {
    match code {
        124 => "timed out",
        125 => "QEMU failed or the guest crashed",
        126 => "harness error",
        _ => "the guest script failed (see its TEST: lines in the console)",
    }
}

/// A temporary folder, removed on drop unless kept.
#[derive(Debug)]
pub(super) struct TempDir {
    path: PathBuf,
    keep: std::cell::Cell<bool>,
}

impl TempDir {
    pub(super) fn new() -> Result<Self> {
        let base = std::env::temp_dir();
        let stamp = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = base.join(format!(
            "vnvme-bench-guest.{}.{stamp:x}",
            std::process::id()
        ));
        std::fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self {
            path,
            keep: std::cell::Cell::new(false),
        })
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    pub(super) fn keep(&self) {
        self.keep.set(true);
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.keep.get() && std::env::var_os("VNVME_BENCH_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_found_after_kernel_output() {
        let dir = std::env::temp_dir().join(format!("vnvme-tail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("c.log");
        std::fs::write(
            &p,
            "boot\r\n[ 1.0] x VNVME-BENCH-BEGIN io_uring-qd1\r\nVNVME-BENCH-E",
        )
        .unwrap();
        let mut t = Tail::default();
        assert_eq!(t.lines(&p), vec!["VNVME-BENCH-BEGIN io_uring-qd1"]);
        std::fs::write(
            &p,
            "boot\r\n[ 1.0] x VNVME-BENCH-BEGIN io_uring-qd1\r\nVNVME-BENCH-END io_uring-qd1\r\n\
             VNVME-BENCH-SLICE io_uring-qd1@vnvme-trap\r\n",
        )
        .unwrap();
        assert_eq!(
            t.lines(&p),
            vec![
                "VNVME-BENCH-END io_uring-qd1",
                "VNVME-BENCH-SLICE io_uring-qd1@vnvme-trap"
            ]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
