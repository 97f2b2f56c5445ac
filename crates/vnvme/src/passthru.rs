//! `vnvme admin-passthru` and `vnvme io-passthru`: any command to a
//! vfio-user NVMe device through the driver's synchronous passthrough,
//! with the options and output of nvme-cli's commands of the same names.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use vnvme_driver::{DataDirection, PassthruCompletion, PassthruData};
use vnvme_spec::Command;

use crate::serve;

/// Parses a number in decimal or, with `0x`, hexadecimal (as nvme-cli does).
pub fn parse_number<T: TryFrom<u64>>(s: &str) -> Result<T, String> {
    let s = s.trim();
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse::<u64>(),
    }
    .map_err(|e| format!("'{s}': {e}"))?;
    // Out of `T`'s range is the only failure (its error type need not
    // even be printable).
    T::try_from(v).map_err(|_| format!("'{s}' is out of range"))
}

fn num_u8(s: &str) -> Result<u8, String> {
    parse_number(s)
}

fn num_u32(s: &str) -> Result<u32, String> {
    parse_number(s)
}

/// Options of `admin-passthru` and `io-passthru` (nvme-cli's names).
#[derive(Args, Debug, Clone)]
pub struct PassthruArgs {
    /// The vfio-user server socket.
    #[arg(long, short = 's', default_value = serve::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Opcode (0x hex accepted).
    #[arg(long, short = 'o', value_parser = num_u8)]
    pub opcode: u8,
    /// Namespace ID (default: 0 for admin-passthru, 1 for io-passthru).
    #[arg(long, short = 'n', value_parser = num_u32)]
    pub namespace_id: Option<u32>,
    #[arg(long, value_parser = num_u32, default_value = "0")]
    pub cdw2: u32,
    #[arg(long, value_parser = num_u32, default_value = "0")]
    pub cdw3: u32,
    #[arg(long, value_parser = num_u32, default_value = "0")]
    pub cdw10: u32,
    #[arg(long, value_parser = num_u32, default_value = "0")]
    pub cdw11: u32,
    #[arg(long, value_parser = num_u32, default_value = "0")]
    pub cdw12: u32,
    #[arg(long, value_parser = num_u32, default_value = "0")]
    pub cdw13: u32,
    #[arg(long, value_parser = num_u32, default_value = "0")]
    pub cdw14: u32,
    #[arg(long, value_parser = num_u32, default_value = "0")]
    pub cdw15: u32,
    /// Data length in bytes (0: no data).
    #[arg(long, short = 'l', value_parser = num_u32, default_value = "0")]
    pub data_len: u32,
    /// Data goes from the controller to the host (default: from the opcode's bits 1:0).
    #[arg(long, short = 'r', conflicts_with = "write")]
    pub read: bool,
    /// Data goes from the host to the controller (default: from the opcode's bits 1:0).
    #[arg(long, short = 'w')]
    pub write: bool,
    /// File with the data to send (write; zeroes when absent, zero-padded when short).
    #[arg(long, short = 'i')]
    pub input_file: Option<PathBuf>,
    /// File to store the data received (read) in, instead of a hex dump.
    #[arg(long)]
    pub output_file: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Which queue the command goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queue {
    Admin,
    Io,
}

impl PassthruArgs {
    /// The 64-byte command (CID and PRPs are the driver's).
    pub fn command(&self, queue: Queue) -> Command {
        let mut c = Command::new(self.opcode, 0);
        let nsid = self.namespace_id.unwrap_or(match queue {
            Queue::Admin => 0,
            Queue::Io => 1,
        });
        c.nsid = nsid.into();
        c.cdw2 = self.cdw2.into();
        c.cdw3 = self.cdw3.into();
        c.cdw10 = self.cdw10.into();
        c.cdw11 = self.cdw11.into();
        c.cdw12 = self.cdw12.into();
        c.cdw13 = self.cdw13.into();
        c.cdw14 = self.cdw14.into();
        c.cdw15 = self.cdw15.into();
        c
    }

    /// The data direction: `--read`/`--write`, else the opcode's bits 1:0.
    pub fn direction(&self) -> Option<DataDirection> {
        if self.read {
            Some(DataDirection::ControllerToHost)
        } else if self.write {
            Some(DataDirection::HostToController)
        } else {
            DataDirection::of_opcode(self.opcode)
        }
    }
}

/// Runs `vnvme admin-passthru` or `vnvme io-passthru`.
pub fn run(args: &PassthruArgs, queue: Queue) -> Result<()> {
    let ctrl = crate::tools::open(&args.socket)?;
    let len = usize::try_from(args.data_len).context("--data-len")?;
    let direction = match (len, args.direction()) {
        (0, _) => None,
        (_, Some(d)) => Some(d),
        (_, None) => bail!(
            "opcode {:#04x} transfers no data (bits 1:0 are 00b): give --read or --write with --data-len",
            args.opcode
        ),
    };
    let buf = match direction {
        Some(_) => Some(
            ctrl.access()
                .dma_alloc(len)
                .context("allocating the data buffer")?,
        ),
        None => None,
    };
    if let (Some(buf), Some(path)) = (&buf, &args.input_file) {
        let mut data =
            std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        data.resize(len, 0);
        buf.write_bytes(0, &data)?;
    }
    let data = match (&buf, direction) {
        (Some(buf), Some(direction)) => Some(PassthruData {
            buf,
            offset: 0,
            len,
            direction,
        }),
        _ => None,
    };
    let cmd = args.command(queue);
    let done = match queue {
        Queue::Admin => ctrl.admin_passthru(cmd, data),
        Queue::Io => {
            let mut q = ctrl.take_io_queue(0)?;
            q.passthru(cmd, data)
        }
    }
    .context("submitting the command")?;
    let received = match (&buf, direction) {
        (Some(buf), Some(DataDirection::ControllerToHost | DataDirection::Bidirectional)) => {
            let mut v = vec![0; len];
            buf.read_bytes(0, &mut v)?;
            Some(v)
        }
        _ => None,
    };
    if let (Some(data), Some(path)) = (&received, &args.output_file) {
        if done.is_success() {
            std::fs::write(path, data).with_context(|| format!("writing {}", path.display()))?;
        }
    }
    let show_data = received.as_deref().filter(|_| args.output_file.is_none());
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&to_json(&done, show_data))?
        );
    } else {
        print!("{}", to_text(&done, show_data));
    }
    if !done.is_success() {
        bail!(
            "{} command {:#04x} failed: {}",
            match queue {
                Queue::Admin => "admin",
                Queue::Io => "I/O",
            },
            args.opcode,
            done.status
        );
    }
    Ok(())
}

/// `{ "result", "status", "status_name", "dnr", "more", "data"? }`: status is
/// the completion's status field without the phase tag (SC 7:0, SCT 10:8,
/// More 13, DNR 14), as nvme-cli prints it; data is lowercase hex.
pub fn to_json(done: &PassthruCompletion, data: Option<&[u8]>) -> serde_json::Value {
    let mut doc = json!({
        "result": done.result,
        "status": done.status.raw(),
        "status_name": done.status.name(),
        "dnr": done.dnr(),
        "more": done.more(),
    });
    if let (Some(data), Some(map)) = (data, doc.as_object_mut()) {
        let hex = data
            .iter()
            .fold(String::with_capacity(data.len() * 2), |mut s, b| {
                let _ = write!(s, "{b:02x}");
                s
            });
        map.insert("data".into(), json!(hex));
    }
    doc
}

/// nvme-cli's text: the status on failure, the result on success, then a
/// hex dump of the data received.
pub fn to_text(done: &PassthruCompletion, data: Option<&[u8]>) -> String {
    let mut out = String::new();
    if done.is_success() {
        let _ = writeln!(out, "NVMe command result:{:08x}", done.result);
        if let Some(data) = data {
            out.push_str(&hex_dump(data));
        }
    } else {
        let _ = writeln!(
            out,
            "NVMe status: {}({:#x}) result:{:08x}",
            done.status.name(),
            done.status.raw(),
            done.result
        );
    }
    out
}

/// nvme-cli's `d()`: 16 bytes a row, offset, hex and printable ASCII.
pub fn hex_dump(data: &[u8]) -> String {
    let mut out = String::from("      0  1  2  3  4  5  6  7  8  9  a  b  c  d  e  f\n");
    for (row, chunk) in data.chunks(16).enumerate() {
        let _ = write!(out, "{:04x}:", row * 16);
        for b in chunk {
            let _ = write!(out, " {b:02x}");
        }
        for _ in chunk.len()..16 {
            out.push_str("   ");
        }
        out.push_str(" \"");
        for &b in chunk {
            out.push(if b.is_ascii_graphic() || b == b' ' {
                char::from(b)
            } else {
                '.'
            });
        }
        out.push_str("\"\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use vnvme_spec::Status;

    #[test]
    fn numbers_accept_decimal_and_hex() {
        assert_eq!(parse_number::<u8>("0xC2"), Ok(0xC2));
        assert_eq!(parse_number::<u32>("4096"), Ok(4096));
        assert!(parse_number::<u8>("0x100").is_err());
        assert!(parse_number::<u32>("twelve").is_err());
    }

    #[test]
    fn failed_status_prints_name_and_raw_value_like_nvme_cli() {
        let done = PassthruCompletion {
            result: 0,
            dw1: 0,
            status: Status::INVALID_OPCODE.with_dnr(true),
        };
        assert_eq!(
            to_text(&done, None),
            "NVMe status: invalid-opcode(0x4001) result:00000000\n"
        );
        let doc = to_json(&done, None);
        assert_eq!(doc["status"], 0x4001);
        assert_eq!(doc["status_name"], "invalid-opcode");
        assert_eq!(doc["dnr"], true);
        assert!(doc.get("data").is_none());
    }

    #[test]
    fn hex_dump_pads_the_last_row() {
        let dump = hex_dump(b"VNVMEVND\x01");
        let row = format!(
            "0000: 56 4e 56 4d 45 56 4e 44 01{} \"VNVMEVND.\"\n",
            " ".repeat(7 * 3)
        );
        assert!(dump.ends_with(&row), "{dump}");
    }
}
