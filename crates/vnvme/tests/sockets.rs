//! Who may connect to `vnvme serve`'s socket, and what a client that may
//! not is told: `--socket-mode`/`--socket-group` (and the config file's
//! keys) set on the socket before it appears, socket activation through
//! `systemd-socket-activate`, the server running as an unprivileged user,
//! and the tools' messages for each way a connection fails (run as
//! `nobody` with `setpriv`: the tests run as root in CI).

mod common;

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{serve, temp_dir, vnvme, BIN};

const NOBODY: u32 = 65534;

fn mode_of(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Whether the test can act as another user (CI runs as root); if not, the
/// reason is printed and the caller returns.
fn can_switch_users(test: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    eprintln!("{test}: skipped: needs root to run a client as nobody (setpriv --reuid)");
    false
}

/// The `vnvme` binary where `nobody` can run it: `BIN` itself may sit
/// under a folder only root can enter (a checkout in /root).
fn binary_for_nobody(dir: &Path) -> PathBuf {
    let copy = dir.join("vnvme");
    if std::fs::hard_link(BIN, &copy).is_err() {
        std::fs::copy(BIN, &copy).unwrap();
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    copy
}

/// `vnvme ARGS... --socket SOCKET` as uid and gid `nobody`/`nogroup` (or `gid`).
fn as_nobody(bin: &Path, gid: u32, args: &[&str], socket: &Path) -> Output {
    Command::new("setpriv")
        .args([
            "--reuid",
            &NOBODY.to_string(),
            "--regid",
            &gid.to_string(),
            "--clear-groups",
        ])
        .arg(bin)
        .args(args)
        .arg("--socket")
        .arg(socket)
        .output()
        .expect("setpriv (util-linux) runs")
}

#[test]
fn the_socket_is_made_for_its_user_only_by_default() {
    let dir = temp_dir("sock-default");
    let socket = dir.join("vnvme.sock");
    let server = serve(&socket, &["--ns", "1M:null"]);
    let meta = std::fs::symlink_metadata(&socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(mode_of(&socket), 0o600);
    assert_eq!(meta.uid(), rustix::process::geteuid().as_raw());
    assert!(vnvme(&["id-ctrl"], &socket).status.success());
    assert!(server.terminate().success());
    assert!(!socket.exists(), "the socket was not removed");
    // The private folder it was bound in is gone too.
    let left: Vec<_> = std::fs::read_dir(&*dir).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn socket_mode_and_group_are_the_sockets_when_it_appears() {
    let dir = temp_dir("sock-group");
    let socket = dir.join("vnvme.sock");
    // Watch the folder: the socket must arrive whole, moved into place,
    // never created at its path (where it would have the umask's mode and
    // the server's group until changed).
    let inotify = rustix::fs::inotify::init(rustix::fs::inotify::CreateFlags::CLOEXEC).unwrap();
    rustix::fs::inotify::add_watch(
        &inotify,
        &*dir,
        rustix::fs::inotify::WatchFlags::CREATE | rustix::fs::inotify::WatchFlags::MOVED_TO,
    )
    .unwrap();
    let server = serve(
        &socket,
        &[
            "--ns",
            "1M:null",
            "--socket-group",
            "nogroup",
            "--socket-mode",
            "620",
        ],
    );
    let meta = std::fs::symlink_metadata(&socket).unwrap();
    assert_eq!(mode_of(&socket), 0o620);
    assert_eq!(meta.gid(), NOBODY, "nogroup's gid");

    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
    let mut reader = rustix::fs::inotify::Reader::new(&inotify, &mut buf);
    let mut arrival = None;
    while arrival.is_none() {
        let event = reader.next().unwrap();
        let name = event.file_name().map(|n| n.to_string_lossy().into_owned());
        if name.as_deref() == Some("vnvme.sock") {
            arrival = Some(event.events());
        }
    }
    assert_eq!(
        arrival,
        Some(rustix::fs::inotify::ReadFlags::MOVED_TO),
        "the socket was created at its path, not moved there finished"
    );
    assert!(server.terminate().success());
}

#[test]
fn a_group_member_connects_and_others_are_told_why_not() {
    if !can_switch_users("a_group_member_connects_and_others_are_told_why_not") {
        return;
    }
    let dir = temp_dir("sock-denied");
    let bin = binary_for_nobody(&dir);
    let socket = dir.join("vnvme.sock");

    // Default: root's only. nobody is refused, and told whose it is.
    let server = serve(&socket, &["--ns", "1M:null"]);
    let out = as_nobody(&bin, NOBODY, &["id-ctrl"], &socket);
    assert!(!out.status.success());
    let expected = format!(
        "vnvme: error: permission denied connecting to {}: the socket belongs to root:root mode \
         600; run as root, or start serve with --socket-group/--socket-mode\n",
        socket.display()
    );
    assert_eq!(stderr(&out), expected);
    // Nor may nobody's server take the path: that it cannot connect does
    // not make the socket stale.
    let out = as_nobody(&bin, NOBODY, &["serve", "--ns", "1M:null"], &socket);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("exists and cannot be probed for a running server"),
        "{}",
        stderr(&out)
    );
    assert!(socket.exists());
    assert!(vnvme(&["id-ctrl"], &socket).status.success());
    assert!(server.terminate().success());

    // --socket-group nogroup: nobody (in nogroup) connects; a user of
    // another group is refused, and told which group would do.
    let server = serve(&socket, &["--ns", "1M:null", "--socket-group", "nogroup"]);
    let out = as_nobody(&bin, NOBODY, &["id-ctrl"], &socket);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("mn        : vnvme"));
    let out = as_nobody(&bin, 1, &["list"], &socket);
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(
        err.contains("the socket belongs to root:nogroup mode 660; run as root or a member of group nogroup, or start serve with --socket-group/--socket-mode"),
        "{err}"
    );
    assert!(server.terminate().success());
}

#[test]
fn a_folder_the_client_cannot_search_is_named() {
    if !can_switch_users("a_folder_the_client_cannot_search_is_named") {
        return;
    }
    let dir = temp_dir("sock-folder");
    let bin = binary_for_nobody(&dir);
    let inner = dir.join("private");
    std::fs::create_dir(&inner).unwrap();
    std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o700)).unwrap();
    let socket = inner.join("vnvme.sock");
    let child = Command::new(BIN)
        .args([
            "serve",
            "--ns",
            "1M:null",
            "--socket-mode",
            "666",
            "--socket",
        ])
        .arg(&socket)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let server = common::Served::from_child(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "serve made no socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = as_nobody(&bin, NOBODY, &["id-ctrl"], &socket);
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!(
            "permission denied connecting to {}: folder {} (root:root mode 700) does not let you search it",
            socket.display(),
            inner.display()
        )),
        "{err}"
    );
    // The server said so when it made the socket.
    let (status, log) = server.terminate_with_stderr();
    assert!(status.success(), "{log}");
    assert!(
        log.contains(&format!(
            "other users cannot reach {}: folder {} (root:root mode 700) does not let them search it",
            socket.display(),
            inner.display()
        )),
        "{log}"
    );
}

#[test]
fn a_missing_a_dead_and_a_non_socket_path_get_their_own_message() {
    let dir = temp_dir("sock-errors");
    let missing = dir.join("none.sock");
    let err = stderr(&vnvme(&["id-ctrl"], &missing));
    assert!(
        err.contains(&format!(
            "no vfio-user socket at {0}: is `vnvme serve --socket {0}` running?",
            missing.display()
        )),
        "{err}"
    );

    // The control socket's client says the same, naming its own flag.
    let out = Command::new(BIN)
        .args(["ctl", "--control"])
        .arg(&missing)
        .arg("fault_list")
        .output()
        .unwrap();
    assert!(
        stderr(&out).contains(&format!(
            "no control socket at {0}: is `vnvme serve --control {0}` running?",
            missing.display()
        )),
        "{}",
        stderr(&out)
    );

    // A socket file left by a server that died: nothing listens.
    let stale = dir.join("stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    let err = stderr(&vnvme(&["list"], &stale));
    assert!(
        err.contains(&format!("nothing listens on {}", stale.display())),
        "{err}"
    );
    // serve replaces it (the file is there all along: wait for its log).
    let server = serve_until_ready(&stale, &["--ns", "1M:null"]);
    assert!(vnvme(&["id-ctrl"], &stale).status.success());
    assert!(server.terminate().success());

    // A regular file: the client says so, and serve neither binds over it
    // nor removes it.
    let file = dir.join("notes.txt");
    std::fs::write(&file, "keep me").unwrap();
    let err = stderr(&vnvme(&["id-ctrl"], &file));
    assert!(
        err.contains(&format!("{} is not a socket", file.display())),
        "{err}"
    );
    let out = vnvme(&["serve", "--ns", "1M:null"], &file);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("exists and is not a socket: remove it or choose another --socket"),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
}

/// Starts `vnvme serve --socket SOCKET ARGS...` and waits until it logs
/// that it serves (a socket file alone says nothing where a stale one was);
/// the rest of its log is drained so it never blocks on a full pipe.
fn serve_until_ready(socket: &Path, args: &[&str]) -> common::Served {
    use std::io::BufRead;
    let mut child = Command::new(BIN)
        .args(["serve", "--socket"])
        .arg(socket)
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if line.contains("serving NVMe controller") {
                let _ = tx.send(());
            }
        }
    });
    let served = common::Served::from_child(child);
    rx.recv_timeout(Duration::from_secs(10))
        .expect("serve did not log that it serves");
    served
}

#[test]
fn config_file_sets_mode_and_group_and_bad_values_name_the_line() {
    let dir = temp_dir("sock-config");
    let socket = dir.join("vnvme.sock");
    let config = dir.join("serve.toml");
    std::fs::write(
        &config,
        "socket_group = \"nogroup\"\nsocket_mode = \"660\"\n[[namespaces]]\nsize = \"1M\"\n",
    )
    .unwrap();
    let server = serve(&socket, &["--config", config.to_str().unwrap()]);
    assert_eq!(mode_of(&socket), 0o660);
    assert_eq!(std::fs::metadata(&socket).unwrap().gid(), NOBODY);
    assert!(server.terminate().success());

    let cases = [
        (
            "socket_mode = \"999\"\n",
            "serve.toml:1: socket_mode: invalid mode '999'",
        ),
        (
            "\nsocket_mode = \"440\"\n",
            "serve.toml:2: socket_mode: mode 440 lets nobody connect",
        ),
        (
            "socket_group = \"no-such-group-vnvme\"\n",
            "serve.toml:1: socket_group: no group 'no-such-group-vnvme'",
        ),
    ];
    for (text, want) in cases {
        std::fs::write(&config, text).unwrap();
        let out = vnvme(&["serve", "--config", config.to_str().unwrap()], &socket);
        assert!(!out.status.success(), "{text}");
        assert!(stderr(&out).contains(want), "{text}: {}", stderr(&out));
        assert!(!socket.exists(), "{text}: a socket was left");
    }
    let out = vnvme(&["serve", "--socket-group", "no-such-group-vnvme"], &socket);
    assert!(
        stderr(&out).contains("no group 'no-such-group-vnvme'"),
        "{}",
        stderr(&out)
    );
}

/// `systemd-socket-activate -l SOCKET ARGS...` (it execs ARGS, keeping its
/// pid, at the first connection attempt).
fn socket_activate(socket: &Path, args: &[&str]) -> common::Served {
    let child = Command::new("systemd-socket-activate")
        .arg("-l")
        .arg(socket)
        .arg(BIN)
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("systemd-socket-activate (package systemd; tests/install-deps.sh installs it)");
    let served = common::Served::from_child(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "systemd-socket-activate made no socket"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    served
}

#[test]
fn socket_activation_serves_the_passed_socket_and_leaves_it() {
    let dir = temp_dir("sock-activate");
    let socket = dir.join("activated.sock");
    let server = socket_activate(
        &socket,
        &["serve", "--ns", "16M:ram", "--serial", "ACTIVATED"],
    );
    // The launcher made it with the umask's mode; serve does not change it.
    let made = mode_of(&socket);
    let out = vnvme(&["list", "--json"], &socket);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc = common::json(&out);
    assert_eq!(doc["Devices"][0]["SerialNumber"], "ACTIVATED");
    assert_eq!(doc["Devices"][0]["PhysicalSize"], 16 << 20);
    assert_eq!(mode_of(&socket), made);
    let (status, log) = server.terminate_with_stderr();
    assert!(status.success(), "serve exited with {status}: {log}");
    assert!(
        log.contains("serving the socket passed by the launcher"),
        "{log}"
    );
    assert!(socket.exists(), "the launcher's socket was removed");
}

#[test]
fn socket_activation_refuses_what_it_cannot_serve() {
    let dir = temp_dir("sock-activate-bad");
    let socket = dir.join("a.sock");
    // A mode or group the unit would not get.
    let server = socket_activate(
        &socket,
        &["serve", "--ns", "1M:null", "--socket-mode", "660"],
    );
    let out = vnvme(&["id-ctrl"], &socket);
    assert!(!out.status.success());
    let (status, log) = server.exit_with_stderr(Duration::from_secs(10));
    assert!(!status.success());
    assert!(
        log.contains("SocketMode=, SocketGroup= in the .socket unit"),
        "{log}"
    );

    // A --socket other than the passed socket's path.
    let socket = dir.join("b.sock");
    let server = socket_activate(
        &socket,
        &["serve", "--ns", "1M:null", "--socket", "/run/other.sock"],
    );
    let _ = vnvme(&["id-ctrl"], &socket);
    let (status, log) = server.exit_with_stderr(Duration::from_secs(10));
    assert!(!status.success());
    assert!(
        log.contains("--socket /run/other.sock but the socket passed by the launcher"),
        "{log}"
    );

    // fd 3 not a socket, as a careless launcher might pass.
    let out = Command::new("sh")
        .args([
            "-c",
            "exec 3</dev/null; LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" serve --ns 1M:null",
            BIN,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out)
            .contains("fd 3 (passed with LISTEN_FDS) is not a socket but a character device"),
        "{}",
        stderr(&out)
    );
    // LISTEN_PID of another process: not ours, so serve binds its own.
    let own = dir.join("own.sock");
    let mut child = Command::new(BIN)
        .args(["serve", "--ns", "1M:null", "--socket"])
        .arg(&own)
        .env("LISTEN_PID", "1")
        .env("LISTEN_FDS", "1")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !own.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let made = own.exists();
    let _ = child.kill();
    let _ = child.wait();
    assert!(made, "serve did not bind its own socket");
}

#[test]
fn serve_runs_as_an_unprivileged_user() {
    if !can_switch_users("serve_runs_as_an_unprivileged_user") {
        return;
    }
    let dir = temp_dir("sock-unprivileged");
    let bin = binary_for_nobody(&dir);
    let work = dir.join("nobody");
    std::fs::create_dir(&work).unwrap();
    rustix::fs::chown(&work, Some(rustix::fs::Uid::from_raw(NOBODY)), None).unwrap();
    let socket = work.join("vnvme.sock");
    let image = work.join("disk.img");
    let serve_as_nobody = |group: &str| {
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .arg(&bin)
            .args(["serve", "--socket"])
            .arg(&socket)
            .args(["--ns", "16M:ram", "--ns"])
            .arg(format!("16M:file={}", image.display()))
            .args(["--socket-group", group, "--workers", "2"]);
        cmd
    };

    // A group it is not a member of: refused, saying what it takes.
    let out = serve_as_nobody("root").output().unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(&format!(
            "giving vfio-user socket {} to group root (gid 0): the server must be a member of that group or have CAP_CHOWN",
            socket.display()
        )),
        "{}",
        stderr(&out)
    );
    assert!(!socket.exists());

    // Its own group: it serves, the file namespace's io_uring included.
    let child = serve_as_nobody("nogroup")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut server = common::Served::from_child(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(
            server.running(),
            "serve as nobody exited: {}",
            server.terminate_with_stderr().1
        );
        assert!(Instant::now() < deadline, "serve as nobody made no socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    let meta = std::fs::metadata(&socket).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), mode_of(&socket)),
        (NOBODY, NOBODY, 0o660)
    );
    let data = work.join("data");
    let back = work.join("back");
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    std::fs::write(&data, &pattern).unwrap();
    for (opcode, dir_flag, file_flag, file) in [
        ("1", "--write", "--input-file", &data),
        ("2", "--read", "--output-file", &back),
    ] {
        let args = [
            "io-passthru",
            "--opcode",
            opcode,
            "--namespace-id",
            "2",
            "--cdw10",
            "8",
            "--data-len",
            "4096",
            dir_flag,
            file_flag,
            file.to_str().unwrap(),
        ];
        let out = as_nobody(&bin, NOBODY, &args, &socket);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    }
    assert_eq!(std::fs::read(&back).unwrap(), pattern);
    let (status, log) = server.terminate_with_stderr();
    assert!(status.success(), "{log}");
    assert!(
        !socket.exists(),
        "nobody's server did not remove its socket"
    );
    assert!(
        !log.contains("running synchronously"),
        "io_uring refused to nobody: {log}"
    );
    assert!(!log.contains("ERROR"), "{log}");
}
