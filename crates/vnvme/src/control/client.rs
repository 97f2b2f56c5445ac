//! `vnvme ctl`: the control socket's command-line client. One request per
//! run: `vnvme ctl --control PATH METHOD [KEY=VALUE]...`, the values JSON
//! where they parse as JSON (numbers, true, `["read"]`) and strings
//! otherwise; readable output, or the JSON result with `--json`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Map, Value};

use super::RpcError;

/// Where `vnvme serve --control` listens unless told otherwise.
pub const DEFAULT_CONTROL: &str = "/run/vnvme-control.sock";

/// How long the client waits for a reply (a resize waits up to 10 s for
/// the namespace's commands).
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for an upgrade's outcome: the server answers within its
/// own bound (its message timeout plus the handover's, 37 s by default),
/// which `ctl` cannot know, so it waits well past it.
const UPGRADE_REPLY_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest reply taken.
const MAX_REPLY: u64 = 16 << 20;

const CTL_HELP: &str = "\
Methods: stats [controller=N] (default every controller of the subsystem);
namespace_add ns=SPEC [nsid=N] (SPEC as --ns: 64M:ram,format=0); namespace_remove nsid=N; namespace_attach nsid=N; namespace_detach nsid=N; namespace_resize nsid=N size=SIZE;
fault_add kind=KIND [nsid=N] [opcodes=read,write] [lba=N blocks=N] [probability=P] [count=N] and
the kind's own (latency=5ms | distribution=uniform min= max= | distribution=exponential mean=;
status=NAME|0xSCTSC dnr=true|false; duration=5s; warning=temperature|spare|reliability|read-only|backup;
ana: controller=CNTLID [group=G] [state=inaccessible|...] [duration=3s]);
KIND is latency, status, never-complete, media-error, not-ready, smart-warning, power-loss or ana;
with several --socket, [controller=N] (not ana) arms it on controller N only, default every one
(a command fault has one id on all); fault_list [controller=N]; fault_clear [id=N] [controller=N]; qos_set [nsid=N | group=NAME] [iops=N] [read_iops=N]
[write_iops=N] [bps=SIZE] [read_bps=SIZE] [write_bps=SIZE] [KEY_burst=N] (replaces every limit of
the controller, namespace or group; none given: unlimited); qos_get; controller_fatal
[reason=TEXT]; shutdown; upgrade [--exe PATH] (hands the client to a new process running PATH,
default the server's own binary, with the same arguments; commands held back by a QoS limit, a
fault or a Preempt and Abort are handed over, and a command on the storage that does not complete
within 5 s refuses it; prints the handover's phases in ms, or why it was refused, the old server then
serving on; see docs/upgrade.md); hold_message command=NAME|N at=handling|kept (under --supervise
only, a fault for tests of crash recovery: the next vfio-user message of the command, e.g. dma_map,
dma_unmap, set_irqs, region_info, holds the server until it is killed, marked and not handled, or
handled and kept; see docs/crash-recovery.md).

Example: vnvme ctl fault_add kind=status nsid=1 opcodes=read status=unrecovered-read-error dnr=true count=1
Example: vnvme ctl qos_set nsid=1 read_iops=5000 write_bps=50M";

#[derive(Args, Debug, Clone)]
#[command(after_help = CTL_HELP)]
pub struct CtlOptions {
    /// The control socket (`vnvme serve --control PATH`).
    #[arg(long, short = 'c', default_value = DEFAULT_CONTROL)]
    pub control: PathBuf,
    /// Print the JSON result instead of text.
    #[arg(long)]
    pub json: bool,
    /// The method (see below).
    pub method: String,
    /// The method's parameters, KEY=VALUE.
    #[arg(value_name = "KEY=VALUE")]
    pub args: Vec<String>,
    /// For `upgrade`: the binary the new process runs (default: the one the server was started
    /// as; a path the server can reach).
    #[arg(long, value_name = "PATH")]
    pub exe: Option<PathBuf>,
}

/// Sends one request and returns the server's result or error.
pub fn call(path: &Path, method: &str, params: Value) -> Result<Result<Value, RpcError>> {
    let mut stream = crate::socket::connect(path, crate::socket::connect::CONTROL)?;
    let wait = if method == "upgrade" {
        UPGRADE_REPLY_TIMEOUT
    } else {
        REPLY_TIMEOUT
    };
    stream.set_read_timeout(Some(wait))?;
    stream.set_write_timeout(Some(REPLY_TIMEOUT))?;
    let mut line = json!({"jsonrpc": "2.0", "method": method, "params": params, "id": 1})
        .to_string()
        .into_bytes();
    line.push(b'\n');
    stream.write_all(&line).context("sending the request")?;
    let mut reply = String::new();
    BufReader::new(std::io::Read::take(&stream, MAX_REPLY))
        .read_line(&mut reply)
        .context("reading the reply")?;
    if reply.is_empty() {
        bail!("the server closed the connection without a reply");
    }
    let v: Value = serde_json::from_str(&reply).context("the reply is not JSON")?;
    if let Some(e) = v.get("error") {
        let code = e.get("code").and_then(Value::as_i64).unwrap_or(0);
        let message = e.get("message").and_then(Value::as_str).unwrap_or("?");
        return Ok(Err(RpcError::new(code, message)));
    }
    Ok(Ok(v.get("result").cloned().unwrap_or(Value::Null)))
}

/// KEY=VALUE arguments as a params object.
pub fn parse_args(args: &[String]) -> Result<Value> {
    let mut params = Map::new();
    for arg in args {
        let Some((key, value)) = arg.split_once('=') else {
            bail!("argument '{arg}' is not KEY=VALUE");
        };
        let v = match serde_json::from_str::<Value>(value) {
            Ok(v) => v,
            Err(_) if key == "opcodes" => json!(value.split(',').collect::<Vec<_>>()),
            Err(_) => json!(value),
        };
        // Names keep their text even if they look like JSON (a NSID is a
        // number, a status name is text): `opcodes=1` is one opcode.
        let v = match (key, v) {
            ("opcodes", v @ (Value::Number(_) | Value::String(_))) => json!([v]),
            (
                "ns" | "reason" | "latency" | "min" | "max" | "mean" | "duration",
                Value::Number(n),
            ) => {
                json!(n.to_string())
            }
            (_, v) => v,
        };
        if params.insert(key.to_owned(), v).is_some() {
            bail!("parameter '{key}' given twice");
        }
    }
    Ok(Value::Object(params))
}

pub fn run(opts: &CtlOptions) -> Result<()> {
    let mut params = parse_args(&opts.args)?;
    if let Some(exe) = &opts.exe {
        if opts.method != "upgrade" {
            bail!("--exe is for the upgrade method, not {}", opts.method);
        }
        let exe = std::path::absolute(exe).with_context(|| format!("--exe {}", exe.display()))?;
        if let Value::Object(p) = &mut params {
            if p.insert("exe".into(), json!(exe)).is_some() {
                bail!("--exe and exe= both given: give one");
            }
        }
    }
    match call(&opts.control, &opts.method, params)? {
        Ok(result) if opts.json => {
            println!("{}", serde_json::to_string_pretty(&result)?);
            Ok(())
        }
        // The handover's report is nested: JSON reads best.
        Ok(result) if opts.method == "upgrade" => {
            println!("{result}");
            Ok(())
        }
        Ok(result) => {
            print!("{}", readable(&opts.method, &result));
            Ok(())
        }
        Err(e) => bail!("{}: {} (JSON-RPC error {})", opts.method, e.message, e.code),
    }
}

/// One controller's `fault_list`, as lines of text.
fn faults_text(result: &Value) -> String {
    let mut out = String::new();
    let faults = result.get("faults").and_then(Value::as_array);
    for f in faults.into_iter().flatten() {
        let Some(obj) = f.as_object() else { continue };
        let fields: Vec<String> = obj
            .iter()
            .filter(|(k, v)| *k != "id" && !v.is_null())
            .map(|(k, v)| format!("{k}={}", scalar(v)))
            .collect();
        out += &format!("fault {}: {}\n", scalar(&f["id"]), fields.join(" "));
    }
    if faults.is_none_or(|f| f.is_empty()) {
        out += "no command faults\n";
    }
    out += &format!("smart_warning: {}\n", scalar(&result["smart_warning"]));
    out += &format!("not_ready: {}\n", scalar(&result["not_ready"]));
    out
}

/// The result as lines of text.
fn readable(method: &str, result: &Value) -> String {
    let mut out = String::new();
    if method == "fault_list" {
        match result.get("controllers").and_then(Value::as_array) {
            Some(each) => {
                for c in each {
                    out += &format!("controller {}:\n", scalar(&c["cntlid"]));
                    out += &faults_text(c);
                }
            }
            None => out += &faults_text(result),
        }
        return out;
    }
    match result.as_object() {
        Some(obj) if obj.is_empty() => out += "ok\n",
        Some(obj) => {
            for (k, v) in obj {
                out += &format!("{k}: {}\n", scalar(v));
            }
        }
        None => out += &format!("{}\n", scalar(result)),
    }
    out
}

/// A value on one line: strings without quotes, the rest as JSON.
fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_become_typed_params() {
        let args: Vec<String> = [
            "nsid=1",
            "opcodes=read,write",
            "status=internal-error",
            "dnr=true",
            "latency=5",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let p = parse_args(&args).unwrap();
        assert_eq!(
            p,
            json!({"nsid": 1, "opcodes": ["read", "write"], "status": "internal-error", "dnr": true, "latency": "5"})
        );
        assert!(parse_args(&["nsid".to_string()]).is_err());
        assert!(parse_args(&["a=1".to_string(), "a=2".to_string()]).is_err());
    }
}
