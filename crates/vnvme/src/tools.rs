//! Driver-side tools: `vnvme id-ctrl` and `vnvme list`, printed like nvme-cli.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use serde_json::{json, Map, Value};
use vnvme_driver::{Controller, InitOptions, VfioUserAccess};
use vnvme_spec::identify::{ascii_field, IdentifyController};

use crate::size::human_decimal;

/// Connects to a vfio-user NVMe device and brings it up with one I/O queue,
/// polling (the tools issue a handful of admin commands).
pub fn open(socket: &Path) -> Result<Controller> {
    let stream = crate::socket::connect(socket, crate::socket::connect::VFIO_USER)?;
    let access = VfioUserAccess::from_stream(stream).with_context(|| {
        format!(
            "negotiating with the vfio-user server on {}",
            socket.display()
        )
    })?;
    let opts = InitOptions {
        io_queues: 1,
        interrupts: false,
        ..InitOptions::default()
    };
    Controller::init(Arc::new(access), opts).context("initialising the NVMe controller")
}

/// The Identify Controller fields nvme-cli prints first, in its order.
fn id_ctrl_fields(id: &IdentifyController) -> Vec<(&'static str, Value, String)> {
    let hex = |v: u64| format!("{v:#x}");
    let num = |k: &'static str, v: u64| (k, json!(v), v.to_string());
    let hexf = |k: &'static str, v: u64| (k, json!(v), hex(v));
    let text = |k: &'static str, b: &[u8]| {
        let s = ascii_field(b);
        (k, json!(s.clone()), s)
    };
    vec![
        hexf("vid", id.vid.get().into()),
        hexf("ssvid", id.ssvid.get().into()),
        text("sn", &id.sn),
        text("mn", &id.mn),
        text("fr", &id.fr),
        num("rab", id.rab.into()),
        (
            "ieee",
            json!(u32::from_le_bytes([id.ieee[0], id.ieee[1], id.ieee[2], 0])),
            format!("{:02x}{:02x}{:02x}", id.ieee[2], id.ieee[1], id.ieee[0]),
        ),
        num("cmic", id.cmic.into()),
        num("mdts", id.mdts.into()),
        hexf("cntlid", id.cntlid.get().into()),
        hexf("ver", id.ver.get().into()),
        hexf("oaes", id.oaes.get().into()),
        hexf("ctratt", id.ctratt.get().into()),
        num("cntrltype", id.cntrltype.into()),
        hexf("oacs", id.oacs.get().into()),
        num("acl", id.acl.into()),
        num("aerl", id.aerl.into()),
        hexf("frmw", id.frmw.into()),
        hexf("lpa", id.lpa.into()),
        num("elpe", id.elpe.into()),
        num("npss", id.npss.into()),
        num("wctemp", id.wctemp.get().into()),
        num("cctemp", id.cctemp.get().into()),
        num("kas", id.kas.get().into()),
        hexf("sqes", id.sqes.into()),
        hexf("cqes", id.cqes.into()),
        num("maxcmd", id.maxcmd.get().into()),
        num("nn", id.nn.get().into()),
        hexf("oncs", id.oncs.get().into()),
        hexf("fuses", id.fuses.get().into()),
        hexf("fna", id.fna.into()),
        hexf("vwc", id.vwc.into()),
        hexf("sgls", id.sgls.get().into()),
        num("mnan", id.mnan.get().into()),
        text("subnqn", &id.subnqn),
    ]
}

pub fn id_ctrl(socket: &Path, as_json: bool) -> Result<()> {
    let ctrl = open(socket)?;
    let fields = id_ctrl_fields(ctrl.identify());
    if as_json {
        let map: Map<String, Value> = fields
            .into_iter()
            .map(|(k, v, _)| (k.to_string(), v))
            .collect();
        println!("{}", serde_json::to_string_pretty(&Value::Object(map))?);
    } else {
        println!("NVME Identify Controller:");
        for (k, _, text) in fields {
            println!("{k:<10}: {text}");
        }
    }
    Ok(())
}

/// Lower-case hexadecimal digits, as nvme-cli prints identifiers.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn list(socket: &Path, as_json: bool) -> Result<()> {
    let ctrl = open(socket)?;
    let id = ctrl.identify();
    let (sn, mn, fr) = (
        ascii_field(&id.sn),
        ascii_field(&id.mn),
        ascii_field(&id.fr),
    );
    if as_json {
        let devices: Vec<Value> = ctrl
            .namespaces()
            .iter()
            .map(|ns| {
                json!({
                    "NameSpace": ns.nsid,
                    "DevicePath": socket.display().to_string(),
                    "Firmware": fr,
                    "ModelNumber": mn,
                    "SerialNumber": sn,
                    "UsedBytes": ns.identify.nuse.get().saturating_mul(u64::from(ns.lba_size)),
                    "MaximumLBA": ns.blocks,
                    "PhysicalSize": ns.size_bytes(),
                    "SectorSize": ns.lba_size,
                    "SubsystemNQN": ascii_field(&id.subnqn),
                    "NGUID": hex(&ns.identify.nguid),
                    "EUI64": hex(&ns.identify.eui64),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({ "Devices": devices }))?
        );
        return Ok(());
    }
    println!(
        "{:<24} {:<20} {:<40} {:<10} {:<26} {:<16} {:<8}",
        "Socket", "SN", "Model", "Namespace", "Usage", "Format", "FW Rev"
    );
    println!(
        "{} {} {} {} {} {} {}",
        "-".repeat(24),
        "-".repeat(20),
        "-".repeat(40),
        "-".repeat(10),
        "-".repeat(26),
        "-".repeat(16),
        "-".repeat(8)
    );
    for ns in ctrl.namespaces() {
        let used = ns
            .identify
            .nuse
            .get()
            .saturating_mul(u64::from(ns.lba_size));
        let usage = format!(
            "{} / {}",
            human_decimal(used),
            human_decimal(ns.size_bytes())
        );
        let format = format!(
            "{} B + {} B",
            ns.lba_size,
            ns.identify.current_format().ms.get()
        );
        println!(
            "{:<24} {:<20} {:<40} {:<10} {:<26} {:<16} {:<8}",
            socket.display(),
            sn,
            mn,
            format!("{:#x}", ns.nsid),
            usage,
            format,
            fr
        );
    }
    Ok(())
}
