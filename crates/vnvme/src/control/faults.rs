//! The control socket's fault methods, over every controller of the
//! subsystem the server serves (`--socket` given several times: CNTLID 1,
//! 2, ... in `--socket` order), as `[[fault]]` in a configuration:
//!
//! * `fault_add`: on controller `controller` if given (for every kind but
//!   `ana`, whose `controller` is the path it fails), else on every
//!   controller. A command fault gets one id on all of them (the
//!   subsystem's ids); a state fault is applied on each, except the ones
//!   that act on the subsystem's namespaces (`media-error`, `power-loss`:
//!   once, then a power loss makes every other target fatal too, as a
//!   lost supply would) and `ana` (its own `controller`).
//! * `fault_list`: one controller's, or every controller's as `stats`
//!   lists them (`{controllers: [...]}` with several), each with its `cntlid`.
//! * `fault_clear`: fault `id` (or every fault) on one controller or all.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};
use vnvme_controller::{Controller, Fault, FaultError, FaultKind, FaultSpec, Latency};

use super::fault_params::FaultParams;
use super::{code, params, refused, RpcError};

/// The controllers a request reaches: `first` (the control socket's,
/// CNTLID 1) and the rest of its subsystem.
pub struct Targets<'a> {
    pub first: &'a Arc<Controller>,
    pub peers: &'a [Arc<Controller>],
}

impl Targets<'_> {
    fn all(&self) -> Vec<&Arc<Controller>> {
        std::iter::once(self.first).chain(self.peers).collect()
    }

    /// Controller `cntlid`, or every one (`None`).
    fn pick(&self, cntlid: Option<u16>) -> Result<Vec<&Arc<Controller>>, RpcError> {
        let all = self.all();
        let Some(n) = cntlid else { return Ok(all) };
        match all.into_iter().find(|c| c.cntlid() == n) {
            Some(c) => Ok(vec![c]),
            None => Err(refused(format!(
                "the subsystem has no controller {n} (CNTLID 1 to {}, in --socket order)",
                self.peers.len() + 1
            ))),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Of {
    controller: Option<u16>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Clear {
    id: Option<u64>,
    controller: Option<u16>,
}

pub fn add(t: &Targets<'_>, p: Value) -> Result<Value, RpcError> {
    let f: FaultParams = params("fault_add", p)?;
    let spec = f
        .to_spec()
        .map_err(|e| RpcError::new(code::INVALID_PARAMS, e))?;
    let on = match spec.kind {
        // Its `controller` names the path it fails, reached from any.
        FaultKind::Ana(_) => vec![t.first],
        _ => t.pick(f.target())?,
    };
    let cntlids: Vec<u16> = on.iter().map(|c| c.cntlid()).collect();
    match arm(&on, spec).map_err(refused)? {
        Some(id) => Ok(json!({ "id": id, "controllers": cntlids })),
        None => Ok(json!({ "applied": f.kind, "controllers": cntlids })),
    }
}

/// Adds `spec` on controllers `on` (at least one) of one subsystem: a
/// command fault with one id on each (that id), a state fault on each or,
/// where it acts on the subsystem's namespaces, once.
pub fn arm(on: &[&Arc<Controller>], spec: FaultSpec) -> Result<Option<u64>, FaultError> {
    let Some((first, rest)) = on.split_first() else {
        return Ok(None);
    };
    let kind = spec.kind.clone();
    let id = first.fault_add(spec.clone())?;
    for c in rest {
        match (&kind, id) {
            (_, Some(id)) => c.fault_arm(spec.clone(), id)?,
            // The namespaces lost their cache once; every controller the
            // host reaches them through fails, as on a real supply loss.
            (FaultKind::PowerLoss, None) => c.controller_fatal("power loss injected"),
            (FaultKind::MediaError | FaultKind::Ana(_), None) => {}
            (_, None) => drop(c.fault_add(spec.clone())?),
        }
    }
    Ok(id)
}

pub fn list(t: &Targets<'_>, p: Value) -> Result<Value, RpcError> {
    let of: Of = params("fault_list", p)?;
    let on = t.pick(of.controller)?;
    let mut each: Vec<Value> = on
        .iter()
        .map(|c| {
            let faults: Vec<Value> = c.fault_list().iter().map(fault_json).collect();
            json!({
                "cntlid": c.cntlid(),
                "faults": faults,
                "smart_warning": c.smart_warning(),
                "not_ready": c.not_ready_namespaces(),
            })
        })
        .collect();
    Ok(match each.len() {
        1 => each.remove(0),
        _ => json!({ "controllers": each }),
    })
}

pub fn clear(t: &Targets<'_>, p: Value) -> Result<Value, RpcError> {
    let c: Clear = params("fault_clear", p)?;
    let cleared: usize = t
        .pick(c.controller)?
        .iter()
        .map(|ctrl| ctrl.fault_clear(c.id))
        .sum();
    if let (Some(id), 0) = (c.id, cleared) {
        return Err(refused(format!("no fault with id {id}: see fault_list")));
    }
    Ok(json!({ "cleared": cleared }))
}

/// A command fault as `fault_list` shows it.
fn fault_json(f: &Fault) -> Value {
    let s = &f.spec;
    let mut v = json!({
        "id": f.id,
        "kind": s.kind.name(),
        "nsid": s.nsid,
        "opcodes": s.opcodes,
        "probability": s.probability,
        "count": s.count,
        "hits": f.hits,
    });
    if let Some((lba, blocks)) = s.lba {
        v["lba"] = json!(lba);
        v["blocks"] = json!(blocks);
    }
    match &s.kind {
        FaultKind::Latency(Latency::Fixed(d)) => v["latency"] = json!(format!("{d:?}")),
        FaultKind::Latency(Latency::Uniform(lo, hi)) => {
            v["latency"] = json!(format!("uniform {lo:?} to {hi:?}"))
        }
        FaultKind::Latency(Latency::Exponential(m)) => {
            v["latency"] = json!(format!("exponential, mean {m:?}"))
        }
        FaultKind::Status(st) => {
            v["status"] = json!(st.name());
            v["dnr"] = json!(st.dnr());
        }
        _ => {}
    }
    v
}
