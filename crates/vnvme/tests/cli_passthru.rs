//! `vnvme admin-passthru` and `vnvme io-passthru` as a user runs them,
//! against `vnvme serve` in another process.

mod common;

use std::path::Path;

use common::crc32c::crc32c;
use common::{json, Served};

fn temp_dir(name: &str) -> common::TempDir {
    common::temp_dir(&format!("pt-{name}"))
}

fn serve(socket: &Path) -> Served {
    common::serve(socket, &["--ns", "64M:ram"])
}

fn vnvme(socket: &Path, args: &[&str]) -> std::process::Output {
    common::vnvme(args, socket)
}

#[test]
fn admin_passthru_identify_vendor_info_and_unknown_opcode() {
    let dir = temp_dir("admin");
    let socket = dir.join("vnvme.sock");
    let _server = serve(&socket);

    // Identify Controller: what id-ctrl reports, MN "vnvme" at byte 24.
    let out = vnvme(
        &socket,
        &[
            "admin-passthru",
            "--opcode",
            "0x06",
            "--cdw10",
            "1",
            "--data-len",
            "4096",
            "--read",
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = json(&out);
    assert_eq!(doc["status"], 0);
    assert_eq!(doc["status_name"], "success");
    let data = doc["data"].as_str().unwrap();
    assert_eq!(data.len(), 8192);
    let id = json(&vnvme(&socket, &["id-ctrl", "--json"]));
    let vid = id["vid"].as_u64().unwrap() as u16;
    assert_eq!(
        &data[..4],
        format!("{:02x}{:02x}", vid as u8, vid >> 8),
        "VID"
    );
    assert_eq!(&data[48..58], "766e766d65", "MN 'vnvme'");

    // Vendor info (C2h), text output as nvme-cli prints it.
    let out = vnvme(
        &socket,
        &[
            "admin-passthru",
            "-o",
            "0xc2",
            "--cdw10",
            "15",
            "-l",
            "64",
            "-r",
        ],
    );
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("NVMe command result:00000000\n"), "{text}");
    assert!(text.contains("\"VNVMEVND"), "{text}");

    // An unregistered vendor opcode fails with Invalid Command Opcode.
    let out = vnvme(&socket, &["admin-passthru", "--opcode", "0xc4", "--json"]);
    assert!(!out.status.success());
    let doc = json(&out);
    assert_eq!(doc["status_name"], "invalid-opcode");
    assert_eq!(doc["dnr"], true);
    assert_eq!(doc["status"], 0x4001);
    let out = vnvme(&socket, &["admin-passthru", "--opcode", "0xc4"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "NVMe status: invalid-opcode(0x4001) result:00000000\n"
    );
}

#[test]
fn io_passthru_write_read_back_and_checksum() {
    let dir = temp_dir("io");
    let socket = dir.join("vnvme.sock");
    let _server = serve(&socket);
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 31 + 7) as u8).collect();
    let input = dir.join("in.bin");
    let output = dir.join("out.bin");
    std::fs::write(&input, &data).unwrap();
    let input_s = input.to_str().unwrap();
    let output_s = output.to_str().unwrap();

    // Write two blocks at LBA 5 (NLB 0's based in CDW12).
    let out = vnvme(
        &socket,
        &[
            "io-passthru",
            "--opcode",
            "1",
            "--namespace-id",
            "1",
            "--cdw10",
            "5",
            "--cdw12",
            "1",
            "--data-len",
            "8192",
            "--write",
            "--input-file",
            input_s,
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "NVMe command result:00000000\n"
    );

    // Read them back into a file.
    let out = vnvme(
        &socket,
        &[
            "io-passthru",
            "-o",
            "2",
            "-n",
            "1",
            "--cdw10",
            "5",
            "--cdw12",
            "1",
            "-l",
            "8192",
            "-r",
            "--output-file",
            output_s,
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&output).unwrap(), data);

    // The vendor checksum (C0h) of the same range, no data transferred.
    let out = vnvme(
        &socket,
        &[
            "io-passthru",
            "--opcode",
            "0xc0",
            "--cdw10",
            "5",
            "--cdw12",
            "1",
            "--json",
        ],
    );
    assert!(out.status.success());
    let doc = json(&out);
    assert_eq!(doc["result"], u64::from(crc32c(&data)));
    assert!(doc.get("data").is_none());

    // A buffer for an opcode that transfers no data is refused locally.
    let out = vnvme(
        &socket,
        &["io-passthru", "--opcode", "0", "-l", "4096", "--write"],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("transfers no data"));
}
