//! `vnvme serve --ns PATH:file` and `--ns SIZE:file=PATH` as a user runs
//! them: sizes, the lock, and the messages when a file cannot be served.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{Served, BIN};

fn temp_dir(name: &str) -> common::TempDir {
    common::temp_dir(&format!("file-{name}"))
}

fn serve(socket: &Path, ns: &str) -> Served {
    common::serve(socket, &["--ns", ns])
}

/// `vnvme serve` that is expected to fail at once.
fn serve_fails(socket: &Path, ns: &str) -> String {
    let out: Output = Command::new(BIN)
        .args(["serve", "--socket"])
        .arg(socket)
        .args(["--ns", ns])
        .output()
        .unwrap();
    assert!(!out.status.success(), "serve --ns {ns} started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn list(socket: &Path) -> serde_json::Value {
    let out = Command::new(BIN)
        .args(["list", "--json", "--socket"])
        .arg(socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn terminate(server: Served) {
    let status = server.terminate();
    assert!(status.success(), "serve exited with {status}");
}

#[test]
fn a_sized_file_namespace_is_created_then_served_at_its_size() {
    let dir = temp_dir("create");
    let socket = dir.join("vnvme.sock");
    let image = dir.join("ns.img");
    let server = serve(&socket, &format!("8M:file={}", image.display()));
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 8 << 20);
    assert_eq!(list(&socket)["Devices"][0]["PhysicalSize"], 8 << 20);
    let id = Command::new(BIN)
        .args(["id-ctrl", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&id.stdout);
    assert!(text.contains("vwc       : 0x7"), "VWC present: {text}");
    terminate(server);

    // PATH:file takes the size from the file.
    let server = serve(&socket, &format!("{}:file", image.display()));
    assert_eq!(list(&socket)["Devices"][0]["PhysicalSize"], 8 << 20);
    terminate(server);
}

#[test]
fn a_file_served_by_another_vnvme_is_refused_by_name() {
    let dir = temp_dir("locked");
    let image = dir.join("ns.img");
    let first = serve(&dir.join("a.sock"), &format!("1M:file={}", image.display()));
    let err = serve_fails(&dir.join("b.sock"), &format!("{}:file", image.display()));
    assert!(
        err.contains(&format!("{} is in use by another vnvme", image.display())),
        "{err}"
    );
    terminate(first);
}

#[test]
fn unusable_files_are_explained() {
    let dir = temp_dir("unusable");
    let socket = dir.join("vnvme.sock");
    let missing = dir.join("missing.img");
    let err = serve_fails(&socket, &format!("{}:file", missing.display()));
    assert!(err.contains("missing.img does not exist"), "{err}");

    let small = dir.join("small.img");
    std::fs::write(&small, [0u8; 100]).unwrap();
    let err = serve_fails(&socket, &format!("{}:file", small.display()));
    assert!(
        err.contains("small.img is 100 bytes: a namespace needs a non-zero multiple of 4096 bytes"),
        "{err}"
    );

    let err = serve_fails(&socket, &format!("{}:file", dir.display()));
    assert!(
        err.contains("is neither a regular file nor a block device"),
        "{err}"
    );

    let err = serve_fails(&socket, "1M:file");
    assert!(err.contains("PATH:file or SIZE:file=PATH"), "{err}");
}

/// A disk image made for 512-byte sectors (a GPT header at byte 512, as
/// every cloud image has) is served with 512-byte blocks without format=,
/// so its partitions show; one with its GPT at byte 4096 with 4096-byte
/// blocks; format= wins.
#[test]
fn a_disk_image_is_served_in_the_sector_size_it_was_made_for() {
    let dir = temp_dir("image");
    let socket = dir.join("vnvme.sock");
    let image = |name: &str, gpt_at: usize| {
        let path = dir.join(name);
        let mut head = vec![0u8; 8 << 20];
        head[gpt_at..gpt_at + 8].copy_from_slice(b"EFI PART");
        std::fs::write(&path, head).unwrap();
        path
    };
    let sector_size = |ns: String| {
        let server = serve(&socket, &ns);
        let size = list(&socket)["Devices"][0]["SectorSize"].clone();
        terminate(server);
        size
    };
    let gpt512 = image("gpt512.img", 512);
    let gpt4k = image("gpt4k.img", 4096);
    assert_eq!(sector_size(format!("{}:file", gpt512.display())), 512);
    assert_eq!(sector_size(format!("{}:file", gpt4k.display())), 4096);
    assert_eq!(
        sector_size(format!("{}:file,format=3", gpt512.display())),
        4096
    );
    // A new file: the default.
    let new = dir.join("new.img");
    assert_eq!(sector_size(format!("8M:file={}", new.display())), 4096);
}
