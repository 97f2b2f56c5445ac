//! A fault as the operator writes it, in a control request's params or a
//! `[[fault]]` table of the configuration file, turned into the
//! controller's [`FaultSpec`].
//!
//! ```toml
//! [[fault]]
//! kind = "status"              # latency, status, never-complete, media-error,
//!                              # not-ready, smart-warning, power-loss, ana
//! nsid = 1                     # default: every namespace
//! opcodes = ["read"]           # names or numbers; default: every I/O opcode
//! lba = 0                      # first block and blocks (default: anywhere)
//! blocks = 2048
//! probability = 0.01           # default 1
//! count = 5                    # times it fires; default: no limit
//! status = "unrecovered-read-error"   # a name, or the 11-bit SCT/SC value (0x281)
//! dnr = true                   # default false: the host may retry
//! ```

use std::time::Duration;

use serde::Deserialize;
use vnvme_controller::{AnaFault, AnaState, FaultKind, FaultSpec, Latency};
use vnvme_spec::{NvmOpcode, Status};

use crate::duration::parse_duration;

/// A number or a name (`opcodes`, `status`, `warning`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum NumberOrName {
    Number(u64),
    Name(String),
}

/// The fields of a fault; which apply depends on `kind`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FaultParams {
    pub kind: String,
    pub nsid: Option<u32>,
    pub opcodes: Option<Vec<NumberOrName>>,
    pub lba: Option<u64>,
    pub blocks: Option<u64>,
    pub probability: Option<f64>,
    pub count: Option<u64>,
    /// latency: `latency = "5ms"` (fixed), or `distribution = "uniform"`
    /// with `min` and `max`, or `"exponential"` with `mean`.
    pub latency: Option<String>,
    pub distribution: Option<String>,
    pub min: Option<String>,
    pub max: Option<String>,
    pub mean: Option<String>,
    /// status.
    pub status: Option<NumberOrName>,
    pub dnr: Option<bool>,
    /// not-ready: how long; ana: how long (default: the state stays).
    pub duration: Option<String>,
    /// ana: the path (CNTLID), the group (default every one) and the
    /// state it goes to (default inaccessible).
    pub controller: Option<u16>,
    pub group: Option<u32>,
    pub state: Option<String>,
    /// smart-warning: spare, temperature, reliability, read-only,
    /// backup, or the critical warning bits.
    pub warning: Option<NumberOrName>,
}

/// I/O opcodes by name.
const OPCODES: &[(&str, NvmOpcode)] = &[
    ("flush", NvmOpcode::FLUSH),
    ("write", NvmOpcode::WRITE),
    ("read", NvmOpcode::READ),
    ("write-uncorrectable", NvmOpcode::WRITE_UNCORRECTABLE),
    ("compare", NvmOpcode::COMPARE),
    ("write-zeroes", NvmOpcode::WRITE_ZEROES),
    ("dsm", NvmOpcode::DATASET_MANAGEMENT),
    ("verify", NvmOpcode::VERIFY),
    ("copy", NvmOpcode::COPY),
];

/// SMART critical warning bits by name (§5.16.1.3 byte 0).
const WARNINGS: &[(&str, u8)] = &[
    ("spare", 0x01),
    ("temperature", 0x02),
    ("reliability", 0x04),
    ("read-only", 0x08),
    ("backup", 0x10),
];

impl FaultParams {
    /// The controller whose commands the fault hits (`controller`), for
    /// every kind but `ana`, whose `controller` is the path it fails.
    pub fn target(&self) -> Option<u16> {
        self.controller.filter(|_| self.kind != "ana")
    }

    /// The controller's fault, or what is wrong with these params.
    pub fn to_spec(&self) -> Result<FaultSpec, String> {
        let kind = self.kind()?;
        let lba = match (self.lba, self.blocks) {
            (None, None) => None,
            (Some(l), Some(n)) => Some((l, n)),
            (Some(l), None) => Some((l, 1)),
            (None, Some(_)) => return Err("blocks needs lba (the first block)".into()),
        };
        let opcodes = self
            .opcodes
            .iter()
            .flatten()
            .map(opcode)
            .collect::<Result<Vec<u8>, String>>()?;
        let spec = FaultSpec {
            kind,
            nsid: self.nsid,
            opcodes,
            lba,
            probability: self.probability.unwrap_or(1.0),
            count: self.count,
        };
        spec.validate().map_err(|e| e.to_string())?;
        Ok(spec)
    }

    fn kind(&self) -> Result<FaultKind, String> {
        let needs = |what: &str| format!("a {} fault needs {what}", self.kind);
        let duration = |name: &str, v: &Option<String>| -> Result<Duration, String> {
            let text = v.as_deref().ok_or_else(|| needs(name))?;
            parse_duration(text).map_err(|e| format!("{name}: {e}"))
        };
        Ok(match self.kind.as_str() {
            "latency" => FaultKind::Latency(match self.distribution.as_deref() {
                None | Some("fixed") => Latency::Fixed(duration("latency", &self.latency)?),
                Some("uniform") => {
                    Latency::Uniform(duration("min", &self.min)?, duration("max", &self.max)?)
                }
                Some("exponential") => Latency::Exponential(duration("mean", &self.mean)?),
                Some(other) => {
                    return Err(format!(
                        "unknown distribution '{other}': use fixed, uniform or exponential"
                    ))
                }
            }),
            "status" => {
                let status = status(self.status.as_ref().ok_or_else(|| needs("status"))?)?;
                FaultKind::Status(status.with_dnr(self.dnr.unwrap_or(false)))
            }
            "never-complete" => FaultKind::NeverComplete,
            "media-error" => FaultKind::MediaError,
            "not-ready" => FaultKind::NotReady(duration("duration", &self.duration)?),
            "smart-warning" => FaultKind::SmartWarning(warning(
                self.warning.as_ref().ok_or_else(|| needs("warning"))?,
            )?),
            "power-loss" => FaultKind::PowerLoss,
            "ana" => FaultKind::Ana(AnaFault {
                controller: self
                    .controller
                    .ok_or_else(|| needs("controller (its CNTLID: 1, 2, ... in --socket order)"))?,
                group: self.group,
                state: match &self.state {
                    Some(s) => s.parse::<AnaState>()?,
                    None => AnaState::Inaccessible,
                },
                duration: match &self.duration {
                    Some(_) => Some(duration("duration", &self.duration)?),
                    None => None,
                },
            }),
            other => {
                return Err(format!(
                    "unknown fault kind '{other}': use latency, status, never-complete, \
                     media-error, not-ready, smart-warning, power-loss or ana"
                ))
            }
        })
    }
}

fn opcode(v: &NumberOrName) -> Result<u8, String> {
    match v {
        // Past u8 is the conversion's only failure: the message says it.
        NumberOrName::Number(n) => u8::try_from(*n).map_err(|_| format!("opcode {n} is past 255")),
        NumberOrName::Name(name) => OPCODES
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, op)| op.0)
            .ok_or_else(|| {
                let names: Vec<&str> = OPCODES.iter().map(|(n, _)| *n).collect();
                format!(
                    "unknown opcode '{name}': use a number or {}",
                    names.join(", ")
                )
            }),
    }
}

/// A status by its name ([`Status::name`]) or its SCT and SC as one
/// number (`0x281`: SCT 2, SC 81h).
fn status(v: &NumberOrName) -> Result<Status, String> {
    let (raw, name) = match v {
        NumberOrName::Number(n) => (*n, None),
        NumberOrName::Name(s) => match s.strip_prefix("0x").map(|h| u64::from_str_radix(h, 16)) {
            Some(Ok(n)) => (n, None),
            _ => (0, Some(s.as_str())),
        },
    };
    let found = match name {
        Some(name) => (1..0x800u16)
            .map(Status::from_raw)
            .find(|s| s.name() == name),
        None => u16::try_from(raw)
            .ok()
            .filter(|&r| r > 0 && r < 0x800)
            .map(Status::from_raw),
    };
    found.ok_or_else(|| {
        format!(
            "unknown status {v:?}: use a name such as unrecovered-read-error, namespace-not-ready, \
             internal-error, write-fault, or SCT and SC as one number (0x281), not success"
        )
    })
}

fn warning(v: &NumberOrName) -> Result<u8, String> {
    match v {
        NumberOrName::Number(n) => u8::try_from(*n)
            .ok()
            .filter(|&b| b != 0 && b & !0x3F == 0)
            .ok_or_else(|| format!("warning bits {n} must be 1 to 0x3f")),
        NumberOrName::Name(name) => WARNINGS
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| *b)
            .ok_or_else(|| {
                format!("unknown warning '{name}': use spare, temperature, reliability, read-only, backup or the bits")
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(json: &str) -> Result<FaultSpec, String> {
        serde_json::from_str::<FaultParams>(json)
            .map_err(|e| e.to_string())?
            .to_spec()
    }

    #[test]
    fn status_by_name_with_dnr_and_range() {
        let s = params(
            r#"{"kind":"status","nsid":1,"opcodes":["read",1],"lba":8,"blocks":4,"status":"unrecovered-read-error","dnr":true,"count":3}"#,
        )
        .unwrap();
        assert_eq!(
            s.kind,
            FaultKind::Status(Status::UNRECOVERED_READ_ERROR.with_dnr(true))
        );
        assert_eq!(s.opcodes, vec![2, 1]);
        assert_eq!(s.lba, Some((8, 4)));
        assert_eq!(s.count, Some(3));
    }

    #[test]
    fn status_by_number_and_latency_distributions() {
        let s = params(r#"{"kind":"status","status":"0x182"}"#).unwrap();
        assert_eq!(s.kind, FaultKind::Status(Status::from_raw(0x182)));
        let s = params(r#"{"kind":"latency","distribution":"uniform","min":"1ms","max":"3ms"}"#)
            .unwrap();
        assert_eq!(
            s.kind,
            FaultKind::Latency(Latency::Uniform(
                Duration::from_millis(1),
                Duration::from_millis(3)
            ))
        );
    }

    #[test]
    fn mistakes_are_named() {
        let e = params(r#"{"kind":"status"}"#).unwrap_err();
        assert!(e.contains("needs status"), "{e}");
        let e = params(r#"{"kind":"status","status":"nonsense"}"#).unwrap_err();
        assert!(e.contains("unknown status"), "{e}");
        let e = params(r#"{"kind":"latency","latency":"fast"}"#).unwrap_err();
        assert!(e.contains("invalid duration"), "{e}");
        let e =
            params(r#"{"kind":"status","status":"internal-error","probability":2}"#).unwrap_err();
        assert!(e.contains("probability"), "{e}");
        let e = params(r#"{"kind":"explode"}"#).unwrap_err();
        assert!(e.contains("unknown fault kind"), "{e}");
        let e = params(r#"{"kind":"status","colour":"red"}"#).unwrap_err();
        assert!(e.contains("unknown field"), "{e}");
        let e = params(r#"{"kind":"smart-warning","warning":"hot"}"#).unwrap_err();
        assert!(e.contains("unknown warning"), "{e}");
    }
}
