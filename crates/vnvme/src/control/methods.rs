//! The control socket's methods (JSON-RPC 2.0, named params):
//!
//! | method | params | result |
//! |---|---|---|
//! | `stats` | `controller`? (a CNTLID of the subsystem; default every controller) | the counters (as `--stats` writes them: one controller's object, or `{controllers: [...]}` with several), each with its `cntlid` |
//! | `namespace_add` | `ns` (as `--ns`: `64M:ram,format=0`), `nsid`? | `{nsid}` |
//! | `namespace_remove` | `nsid` | `{}` |
//! | `namespace_attach` / `namespace_detach` | `nsid` | `{}` |
//! | `namespace_resize` | `nsid`, `size` | `{nsze}` (blocks) |
//! | `zone_set_state` | `nsid`, `zslba`, `state` (`read-only`, `offline`, `full`, `finish-recommended`, `reset-recommended`) | `{changed}` |
//! | `fault_add` | a fault (`fault_params`), `controller`? (default every controller; see `faults`) | `{id}` (command faults) or `{applied}`, and `{controllers}` |
//! | `fault_list` | `controller`? | `{cntlid, faults, smart_warning, not_ready}`, or `{controllers: [...]}` with several |
//! | `fault_clear` | `id`? (none: every fault), `controller`? | `{cleared}` |
//! | `qos_set` | `nsid`? or `group`?, then limits (`crate::qos`: `iops`, `read_bps`, `write_iops_burst`...) | `{}`; replaces every limit of the target (none given: no limit) |
//! | `qos_get` | | `{controller, namespaces, groups}` with limits and counters |
//! | `ana_set` | `controller` (CNTLID: 1, 2, ... in `--socket` order), `group`? (ANA group = NSID; none: every group), `state` (`optimized`, `non-optimized`, `inaccessible`, `persistent-loss`, `change`) | `{changed}`; that controller's host gets an ANA Change notice |
//! | `ana_get` | | `{states: [{controller, group, state}]}` (empty with one controller) |
//! | `controller_fatal` | `reason`? | `{}` |
//! | `shutdown` | | `{}`; the server stops as on SIGTERM |

use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

use vnvme_controller::{AnaState, Controller, QosTarget, ZoneChange};

use super::{code, params, refused, RpcError};
use crate::namespace::NamespaceSpec;
use crate::qos::{QosSpec, QosValue};
use vnvme_controller::NamespaceIds;

/// Every method, for `vnvme ctl --help` and the not-found error.
pub const METHODS: &[&str] = &[
    "stats",
    "namespace_add",
    "namespace_remove",
    "namespace_attach",
    "namespace_detach",
    "namespace_resize",
    "zone_set_state",
    "fault_add",
    "fault_list",
    "fault_clear",
    "qos_set",
    "qos_get",
    "ana_set",
    "ana_get",
    "controller_fatal",
    "shutdown",
    "upgrade",
    "hold_message",
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoParams {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Nsid {
    nsid: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Add {
    ns: String,
    nsid: Option<u32>,
}

/// A size as a number of bytes or text with a unit ("64M").
#[derive(Deserialize)]
#[serde(untagged)]
enum Size {
    Bytes(u64),
    Text(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Resize {
    nsid: u32,
    size: Size,
}

/// What the controller does to a zone, as `zone_set_state` names it.
#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
enum ZoneStateParam {
    ReadOnly,
    Offline,
    Full,
    FinishRecommended,
    ResetRecommended,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ZoneSetState {
    nsid: u32,
    zslba: u64,
    state: ZoneStateParam,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StatsOf {
    controller: Option<u16>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AnaSet {
    controller: u16,
    group: Option<u32>,
    state: String,
}

/// Parameters of `hold_message` (a fault for tests of crash recovery,
/// `control::hold`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HoldMessage {
    /// The vfio-user command: a number or one of [`HELD_COMMANDS`].
    command: CommandParam,
    at: super::hold::At,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum CommandParam {
    Number(u16),
    Name(String),
}

/// The vfio-user commands `hold_message` names, with their numbers.
const HELD_COMMANDS: &[(&str, u16)] = &[
    ("dma_map", 2),
    ("dma_unmap", 3),
    ("region_info", 5),
    ("set_irqs", 8),
    ("region_read", 9),
    ("region_write", 10),
    ("reset", 13),
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Fatal {
    reason: Option<String>,
}

/// Runs `method` with `p` on `ctrl`; `stop` is the server's stop flag.
/// Parameters of `upgrade`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Upgrade {
    /// The binary to start (default: the server's own argv[0]).
    exe: Option<std::path::PathBuf>,
}

/// `upgrade [exe=PATH]`: hands the served client to a new process
/// (`crate::upgrade`) and answers with its report, or why not; the
/// [`Written`](crate::upgrade::Written) is told once the reply is out.
pub fn upgrade(
    hooks: &super::Hooks,
    p: Value,
) -> (Result<Value, RpcError>, Option<crate::upgrade::Written>) {
    let u: Upgrade = match params("upgrade", p) {
        Ok(u) => u,
        Err(e) => return (Err(e), None),
    };
    let Some(requests) = &hooks.upgrade else {
        return (
            Err(RpcError::new(
                code::REFUSED,
                "this server cannot be upgraded: it offers no upgrade on this socket",
            )),
            None,
        );
    };
    if let Some(exe) = &u.exe {
        if exe.as_os_str().is_empty() {
            return (
                Err(RpcError::new(code::INVALID_PARAMS, "exe is empty")),
                None,
            );
        }
    }
    let (outcome, written) = requests.ask(u.exe);
    (
        outcome.map_err(|why| RpcError::new(code::REFUSED, why)),
        written,
    )
}

pub fn call(
    ctrl: &Arc<Controller>,
    hooks: &super::Hooks,
    method: &str,
    p: Value,
) -> Result<Value, RpcError> {
    let targets = super::faults::Targets {
        first: ctrl,
        peers: &hooks.peers,
    };
    if hooks.supervised && matches!(method, "namespace_add" | "namespace_resize") {
        // The server a supervisor starts after a crash serves the
        // namespaces of its arguments, as they were: an added one would
        // come back empty, a resized ram one without what was written since.
        return Err(refused(format!(
            "{method} is refused under --supervise: a new server after a crash would not keep \
             the change (issue 35); restart the server with the namespace in its arguments"
        )));
    }
    match method {
        "stats" => {
            let c: StatsOf = params(method, p)?;
            match c.controller {
                None => crate::metrics::stats_json(ctrl).map_err(refused),
                Some(n) => {
                    let stats = ctrl.stats_of(n).ok_or_else(|| {
                        refused(format!(
                            "the subsystem has no controller {n} serving (CNTLID 1, 2, ... in --socket order)"
                        ))
                    })?;
                    serde_json::to_value(stats).map_err(refused)
                }
            }
        }
        "namespace_add" => {
            let a: Add = params(method, p)?;
            let spec: NamespaceSpec =
                a.ns.parse()
                    .map_err(|e: String| RpcError::new(code::INVALID_PARAMS, format!("ns: {e}")))?;
            spec.validate()
                .map_err(|e| RpcError::new(code::INVALID_PARAMS, format!("ns: {e}")))?;
            if spec.readiness != vnvme_controller::Readiness::Immediate {
                return Err(RpcError::new(
                    code::INVALID_PARAMS,
                    "ns: ready= and never-ready apply at start only: add the namespace, then a not-ready fault",
                ));
            }
            let (backend, format) = spec
                .open_formatted()
                .map_err(|e| refused(format!("{e:#}")))?;
            let nsid = ctrl
                .namespace_add(
                    backend,
                    format,
                    a.nsid,
                    spec.attached,
                    // A ram namespace with one identifier chosen: the others new.
                    spec.ids(|| NamespaceIds::fresh("control socket", 0)),
                )
                .map_err(refused)?;
            if !spec.qos.is_empty() {
                // A group named in --ns is the configuration's: reach it
                // through a member of this controller.
                let groups = spec
                    .qos
                    .group
                    .iter()
                    .filter_map(|name| Some((name.clone(), ctrl.qos_group(name)?)))
                    .collect();
                crate::qos::apply(ctrl, QosTarget::Namespace(nsid), &spec.qos, &groups)
                    .map_err(|e| refused(format!("namespace {nsid} added, but its QoS: {e:#}")))?;
            }
            Ok(json!({ "nsid": nsid }))
        }
        "namespace_remove" => {
            let n: Nsid = params(method, p)?;
            ctrl.namespace_remove(n.nsid).map_err(refused)?;
            Ok(json!({}))
        }
        "namespace_attach" | "namespace_detach" => {
            let n: Nsid = params(method, p)?;
            ctrl.namespace_attach(n.nsid, method == "namespace_attach")
                .map_err(refused)?;
            Ok(json!({}))
        }
        "namespace_resize" => {
            let r: Resize = params(method, p)?;
            let bytes = match r.size {
                Size::Bytes(b) => b,
                Size::Text(t) => crate::size::parse_size(&t)
                    .map_err(|e| RpcError::new(code::INVALID_PARAMS, format!("size: {e}")))?,
            };
            if bytes < 4096 || bytes % 4096 != 0 {
                return Err(RpcError::new(
                    code::INVALID_PARAMS,
                    format!("size {bytes} must be a non-zero multiple of 4096 bytes"),
                ));
            }
            let nsze = ctrl.namespace_resize(r.nsid, bytes).map_err(refused)?;
            Ok(json!({ "nsze": nsze }))
        }
        "zone_set_state" => {
            // The controller changes a zone by itself, as a worn or busy
            // device's do: the host sees it in the Changed Zone List.
            let z: ZoneSetState = params(method, p)?;
            let to = match z.state {
                ZoneStateParam::ReadOnly => ZoneChange::ReadOnly,
                ZoneStateParam::Offline => ZoneChange::Offline,
                ZoneStateParam::Full => ZoneChange::Finished,
                ZoneStateParam::FinishRecommended => ZoneChange::FinishRecommended,
                ZoneStateParam::ResetRecommended => ZoneChange::ResetRecommended,
            };
            let changed = ctrl.zone_set_state(z.nsid, z.zslba, to).map_err(refused)?;
            Ok(json!({ "changed": changed }))
        }
        "fault_add" => super::faults::add(&targets, p),
        "fault_list" => super::faults::list(&targets, p),
        "fault_clear" => super::faults::clear(&targets, p),
        "qos_set" => qos_set(ctrl, p),
        "qos_get" => {
            params::<NoParams>(method, p)?;
            let stats = ctrl.stats();
            let mut v = serde_json::to_value(ctrl.qos_get()).map_err(refused)?;
            v["throttled_commands"] = json!(stats.qos_throttled_commands);
            v["throttled_ns"] = json!(stats.qos_throttled_ns);
            Ok(v)
        }
        "ana_set" => {
            let a: AnaSet = params(method, p)?;
            let state: AnaState = a
                .state
                .parse()
                .map_err(|e| RpcError::new(code::INVALID_PARAMS, format!("{method}: {e}")))?;
            let changed = ctrl
                .ana_set(a.controller, a.group, state)
                .map_err(refused)?;
            Ok(json!({ "changed": changed }))
        }
        "ana_get" => {
            params::<NoParams>(method, p)?;
            let states: Vec<Value> = ctrl
                .ana_states()
                .into_iter()
                .map(|(c, g, s)| json!({ "controller": c, "group": g, "state": s.to_string() }))
                .collect();
            Ok(json!({ "states": states }))
        }
        "controller_fatal" => {
            let f: Fatal = params(method, p)?;
            let reason = f
                .reason
                .unwrap_or_else(|| "controller_fatal from the control socket".into());
            ctrl.controller_fatal(&reason);
            Ok(json!({}))
        }
        "hold_message" => {
            if !hooks.supervised {
                return Err(refused(
                    "hold_message is a fault for tests of crash recovery: offered under \
                     --supervise only",
                ));
            }
            let h: HoldMessage = params(method, p)?;
            let command = match &h.command {
                CommandParam::Number(n) => Some(*n),
                CommandParam::Name(name) => HELD_COMMANDS
                    .iter()
                    .find(|(known, _)| known == name)
                    .map(|(_, n)| *n),
            }
            .filter(|n| (1..=13).contains(n))
            .ok_or_else(|| {
                let names: Vec<&str> = HELD_COMMANDS.iter().map(|(n, _)| *n).collect();
                RpcError::new(
                    code::INVALID_PARAMS,
                    format!(
                        "{method}: command is a vfio-user command number (1-13) or one of {}",
                        names.join(", ")
                    ),
                )
            })?;
            super::hold::arm(command, h.at);
            tracing::warn!(
                "hold_message: the next vfio-user message of command {command} is held until \
                 this process dies"
            );
            Ok(json!({}))
        }
        "shutdown" => {
            params::<NoParams>(method, p)?;
            tracing::info!("shutdown requested on the control socket");
            hooks.stop.ask();
            Ok(json!({}))
        }
        other => Err(RpcError::new(
            code::METHOD_NOT_FOUND,
            format!("no method '{other}': use one of {}", METHODS.join(", ")),
        )),
    }
}

/// `qos_set`: `nsid` (a namespace), `group` (a group's budget) or neither
/// (the controller), then the limits; keys not given are unlimited.
fn qos_set(ctrl: &Controller, p: Value) -> Result<Value, RpcError> {
    let bad = |m: String| RpcError::new(code::INVALID_PARAMS, format!("qos_set: {m}"));
    let map = match p {
        Value::Object(m) => m,
        Value::Null => serde_json::Map::new(),
        _ => return Err(bad("params must be named (an object)".into())),
    };
    let mut target = QosTarget::Controller;
    let mut group = None;
    let mut spec = QosSpec::default();
    for (key, v) in map {
        match key.as_str() {
            "nsid" => {
                let nsid = v
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|&n| n != 0)
                    .ok_or_else(|| bad(format!("nsid: {v} is not a namespace id")))?;
                target = QosTarget::Namespace(nsid);
            }
            "group" => match v {
                Value::String(name) => group = Some(name),
                other => return Err(bad(format!("group: {other} is not a group's name"))),
            },
            _ => {
                let value: QosValue = serde_json::from_value(v.clone())
                    // serde's untagged-enum error names no variant: the message names both.
                    .map_err(|_| bad(format!("{key}: {v} is not a number or a size")))?;
                spec.set(&key, &value, false).map_err(bad)?;
            }
        }
    }
    spec.validate().map_err(bad)?;
    match group {
        Some(_) if target != QosTarget::Controller => {
            Err(bad("give nsid or group, not both".into()))
        }
        Some(name) => ctrl.qos_set_group(&name, spec.limits).map_err(refused),
        None => ctrl.qos_set(target, spec.limits).map_err(refused),
    }?;
    Ok(json!({}))
}
