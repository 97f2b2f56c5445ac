//! IOPS and bandwidth limits as `vnvme serve` takes them: in the
//! configuration file, in `--ns` options, on the control socket
//! (`qos_set`, `qos_get`) and in `vnvme bench --qos`. What a limit does is
//! `vnvme_controller::qos`'s; this module parses and applies.
//!
//! ```toml
//! [qos]                        # the controller: every namespace's commands together
//! iops = 20000                 # reads and writes, commands a second
//! bps = "200M"                 # bytes a second (K, M, G, T: powers of 1024)
//! bps_burst = "16M"            # the bucket's size (default: a tenth of a second's worth)
//! group = "tenant-a"           # also shares this group's budget
//!
//! [qos_groups.tenant-a]        # a budget its members share (QEMU's throttle-group)
//! write_iops = 5000
//!
//! [[namespaces]]
//! size = "1G"
//! qos = { read_iops = 1000, write_bps = "50M", group = "tenant-a" }
//! ```
//!
//! Keys: `iops`, `read_iops`, `write_iops` (commands a second), `bps`,
//! `read_bps`, `write_bps` (bytes a second, a number or a size with a
//! unit), each with a `_burst` (same unit, default a tenth of the rate, at
//! least 1), and `group` (not in `[qos_groups]`). Each value is a whole
//! number from 1 to 2^40; leave a key out for no limit. `--ns` takes the
//! rates (`--ns 1G,iops=1000,write-bps=50M,qos-group=tenant-a`; groups are
//! defined in the configuration only).

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use vnvme_controller::{Controller, QosGroup, QosLimits, QosTarget};

use crate::size::parse_size;

/// `--ns` options ([`crate::ns_syntax`]) that set limits.
pub const NS_QOS_OPTIONS: &[&str] = &[
    "iops=N",
    "read-iops=N",
    "write-iops=N",
    "bps=SIZE",
    "read-bps=SIZE",
    "write-bps=SIZE",
    "qos-group=NAME",
];

/// One target's limits and the group it joins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QosSpec {
    pub limits: QosLimits,
    pub group: Option<String>,
    /// In a configuration file, `controller = N`: only controller N (a
    /// CNTLID of a `--socket A --socket B` subsystem) has these limits;
    /// none: every controller, each its own budget (a group's budget is
    /// one, whoever joins it).
    pub controller: Option<u16>,
}

/// A value as a file or a JSON request writes it.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(untagged)]
pub enum QosValue {
    Int(i64),
    /// Past `i64` (so refused as too high, not as a fraction).
    Big(u64),
    Float(f64),
    Text(String),
}

impl QosSpec {
    /// No limit and no group.
    pub fn is_empty(&self) -> bool {
        self.limits.is_empty() && self.group.is_none()
    }

    /// Sets `key` (`iops`, `read_bps_burst`..., or `group` if `groups` is
    /// true) from `value`.
    pub fn set(&mut self, key: &str, value: &QosValue, groups: bool) -> Result<(), String> {
        if key == "controller" && groups {
            return match value {
                QosValue::Int(n) => match u16::try_from(*n).ok().filter(|&n| n > 0) {
                    Some(n) => {
                        self.controller = Some(n);
                        Ok(())
                    }
                    None => Err(format!("controller: {n} is not a CNTLID (1, 2, ...)")),
                },
                _ => Err("controller: a CNTLID (1, 2, ... in --socket order)".into()),
            };
        }
        if key == "group" && groups {
            return match value {
                QosValue::Text(name) if !name.is_empty() => {
                    self.group = Some(name.clone());
                    Ok(())
                }
                _ => Err("group: a group's name, as in [qos_groups.NAME]".into()),
            };
        }
        let Some(bytes) = QosLimits::key_counts_bytes(key) else {
            let keys = QosLimits::keys().join(", ");
            let group = if groups { ", group, controller" } else { "" };
            return Err(format!("unknown QoS key '{key}': use one of {keys}{group}"));
        };
        let unit = if bytes {
            "bytes a second: a whole number or a size (50M)"
        } else {
            "commands a second: a whole number"
        };
        let n = match value {
            // The only way an i64 does not fit a u64 is being negative: said below.
            QosValue::Int(n) => u64::try_from(*n).map_err(|_| {
                format!("{key}: {n} is negative; give {unit}, or leave {key} out for no limit")
            })?,
            QosValue::Big(n) => *n,
            QosValue::Float(f) => return Err(format!("{key}: {f} is not {unit}")),
            QosValue::Text(t) if bytes => parse_size(t).map_err(|e| format!("{key}: {e}"))?,
            QosValue::Text(t) => t
                .trim()
                .parse()
                // The integer parse error (invalid digit, too large) says less than naming the unit.
                .map_err(|_| format!("{key}: '{t}' is not {unit}"))?,
        };
        self.limits.set(key, n).map_err(|e| e.to_string())
    }

    /// Checks what single keys cannot: every burst has its rate.
    pub fn validate(&self) -> Result<(), String> {
        self.limits.validate().map_err(|e| e.to_string())
    }

    /// Sets `--ns` option `option` (`read-iops=1000`) if it is one of
    /// [`NS_QOS_OPTIONS`]; `None` if it is not.
    pub fn take_ns_option(&mut self, option: &str) -> Option<Result<(), String>> {
        let (key, value) = option.split_once('=')?;
        if key == "qos-group" {
            return Some(self.set("group", &QosValue::Text(value.into()), true));
        }
        let listed = NS_QOS_OPTIONS
            .iter()
            .any(|o| o.split_once('=').is_some_and(|(k, _)| k == key));
        if !listed {
            return None;
        }
        let key = key.replace('-', "_");
        Some(self.set(&key, &QosValue::Text(value.into()), false))
    }
}

/// `vnvme bench --qos`: `KEY=VALUE` pairs, comma separated (`iops=20000`,
/// `read_bps=100M,read_bps_burst=1M`); no group.
impl FromStr for QosSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut spec = QosSpec::default();
        for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("'{pair}' is not KEY=VALUE (iops=20000)"))?;
            let key = key.trim().replace('-', "_");
            spec.set(&key, &QosValue::Text(value.trim().into()), false)?;
        }
        spec.validate()?;
        if spec.is_empty() {
            return Err("no limit given (iops=20000, bps=100M...)".into());
        }
        Ok(spec)
    }
}

/// Makes the groups of a configuration (`[qos_groups.NAME]`), to share
/// between the controllers of one process.
pub fn groups(defined: &BTreeMap<String, QosLimits>) -> Result<BTreeMap<String, Arc<QosGroup>>> {
    defined
        .iter()
        .map(|(name, limits)| {
            let g = QosGroup::new(name, *limits).with_context(|| format!("qos_groups.{name}"))?;
            Ok((name.clone(), g))
        })
        .collect()
}

/// Gives `target` of `ctrl` its limits and group.
pub fn apply(
    ctrl: &Controller,
    target: QosTarget,
    spec: &QosSpec,
    groups: &BTreeMap<String, Arc<QosGroup>>,
) -> Result<()> {
    if !spec.limits.is_empty() {
        ctrl.qos_set(target, spec.limits)?;
    }
    if let Some(name) = &spec.group {
        let Some(g) = groups.get(name) else {
            bail!("QoS group '{name}' is not defined: add a [qos_groups.{name}] table to the configuration");
        };
        ctrl.qos_join(target, Some(Arc::clone(g)))?;
    }
    Ok(())
}

/// Gives a started controller the limits of its configuration: its own
/// (`controller`) and its namespaces' (NSIDs from 1 in order). The
/// namespaces come as their limits only: `namespace` holds [`QosSpec`], so
/// this module does not name `NamespaceSpec` (no import circle).
pub fn apply_all<'a>(
    ctrl: &Controller,
    controller: &QosSpec,
    namespaces: impl IntoIterator<Item = &'a QosSpec>,
    groups: &BTreeMap<String, Arc<QosGroup>>,
) -> Result<()> {
    let mine = |spec: &QosSpec| spec.controller.is_none_or(|c| c == ctrl.cntlid());
    if mine(controller) {
        apply(ctrl, QosTarget::Controller, controller, groups).context("the controller's QoS")?;
    }
    for (i, ns) in namespaces.into_iter().enumerate() {
        let nsid = u32::try_from(i + 1).unwrap_or(u32::MAX);
        if mine(ns) {
            apply(ctrl, QosTarget::Namespace(nsid), ns, groups)
                .with_context(|| format!("namespace {nsid}'s QoS"))?;
        }
    }
    Ok(())
}

/// Checks that every `controller = N` of the `controller` and
/// `namespaces` limits names one of `cntlids` (the server's).
pub fn check_controllers<'a>(
    controller: &QosSpec,
    namespaces: impl IntoIterator<Item = &'a QosSpec>,
    cntlids: std::ops::RangeInclusive<u16>,
) -> Result<()> {
    let named = std::iter::once(("qos", controller))
        .chain(namespaces.into_iter().map(|ns| ("a namespace's qos", ns)));
    for (what, spec) in named {
        if let Some(n) = spec.controller.filter(|n| !cntlids.contains(n)) {
            bail!(
                "{what}: controller = {n}: this server has controllers {} to {} (CNTLID, in \
                 --socket order)",
                cntlids.start(),
                cntlids.end()
            );
        }
    }
    Ok(())
}

/// The limits a live upgrade hands to the new process (crate::upgrade):
/// every target's own limits and every group's, as `qos_get` reports them,
/// so that limits changed at run time (`qos_set`) outlive the upgrade. A
/// target whose limits were never set keeps its configuration's.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandedQos {
    pub controller: Option<BTreeMap<String, u64>>,
    pub namespaces: BTreeMap<u32, BTreeMap<String, u64>>,
    pub groups: BTreeMap<String, BTreeMap<String, u64>>,
}

impl HandedQos {
    /// `ctrl`'s limits now.
    pub fn of(ctrl: &Controller) -> Self {
        let now = ctrl.qos_get();
        Self {
            controller: now.controller.own.map(|t| t.limits),
            namespaces: now
                .namespaces
                .into_iter()
                .filter_map(|(nsid, t)| Some((nsid, t.own?.limits)))
                .collect(),
            groups: now.groups.into_iter().map(|(g, t)| (g, t.limits)).collect(),
        }
    }

    /// Gives `ctrl` (configured already) these limits.
    pub fn apply(&self, ctrl: &Controller) -> Result<()> {
        let limits = QosLimits::from_map;
        if let Some(keys) = &self.controller {
            ctrl.qos_set(QosTarget::Controller, limits(keys)?)
                .context("the controller's handed-over QoS")?;
        }
        for (&nsid, keys) in &self.namespaces {
            ctrl.qos_set(QosTarget::Namespace(nsid), limits(keys)?)
                .with_context(|| format!("namespace {nsid}'s handed-over QoS"))?;
        }
        for (name, keys) in &self.groups {
            ctrl.qos_set_group(name, limits(keys)?)
                .with_context(|| format!("QoS group {name}'s handed-over limits"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse_by_unit_and_hostile_ones_are_refused_clearly() {
        let mut s = QosSpec::default();
        s.set("bps", &QosValue::Text("50M".into()), false).unwrap();
        s.set("iops", &QosValue::Int(1000), false).unwrap();
        s.set("group", &QosValue::Text("a".into()), true).unwrap();
        let m = s.limits.to_map();
        assert_eq!(m["bps"], 50 << 20);
        assert_eq!(m["iops"], 1000);
        assert_eq!(s.group.as_deref(), Some("a"));
        for (key, value, says) in [
            ("iops", QosValue::Int(0), "0 would stop all I/O"),
            ("iops", QosValue::Int(-5), "negative"),
            ("iops", QosValue::Float(1.5), "not commands a second"),
            (
                "iops",
                QosValue::Text("10M".into()),
                "not commands a second",
            ),
            ("bps", QosValue::Int(1 << 50), "more than the highest"),
            ("bps", QosValue::Text("lots".into()), "bps:"),
            ("iops_total", QosValue::Int(1), "unknown QoS key"),
            ("group", QosValue::Text("a".into()), "unknown QoS key"),
        ] {
            let e = QosSpec::default().set(key, &value, false).unwrap_err();
            assert!(e.contains(says), "{key}={value:?}: {e}");
        }
    }

    #[test]
    fn bench_limits_parse_and_empty_or_burst_only_is_refused() {
        let s: QosSpec = "iops=20000, read-bps=100M".parse().unwrap();
        assert_eq!(s.limits.to_map()["read_bps"], 100 << 20);
        assert!("".parse::<QosSpec>().unwrap_err().contains("no limit"));
        assert!("iops_burst=5"
            .parse::<QosSpec>()
            .unwrap_err()
            .contains("iops_burst needs iops"));
        assert!("iops".parse::<QosSpec>().unwrap_err().contains("KEY=VALUE"));
    }

    #[test]
    fn the_configuration_sets_controller_namespace_and_group_limits() {
        use crate::config::ServeConfig;
        let text = "[qos]\niops = 20000\nbps = \"200M\"\ngroup = \"t\"\n\n[qos_groups.t]\nwrite_iops = 5000\n\n[[namespaces]]\nsize = \"1G\"\nqos = { read_iops = 1000, write_bps_burst = \"4M\", write_bps = \"50M\", group = \"t\" }\n";
        let cfg = ServeConfig::parse("c.toml", text).unwrap();
        assert_eq!(cfg.qos.limits.to_map()["iops"], 20000);
        assert_eq!(cfg.qos.group.as_deref(), Some("t"));
        assert_eq!(cfg.qos_groups["t"].to_map()["write_iops"], 5000);
        let ns = &cfg.namespaces[0].qos;
        assert_eq!(ns.limits.to_map()["write_bps_burst"], 4 << 20);
        assert_eq!(ns.group.as_deref(), Some("t"));
        for (text, says) in [
            (
                "[qos]\niops = 0\n",
                "c.toml:2: qos.iops: iops: 0 would stop all I/O",
            ),
            (
                "[qos]\niops = -1\n",
                "c.toml:2: qos.iops: iops: -1 is negative",
            ),
            (
                "[qos]\nspeed = 1\n",
                "c.toml:2: qos.speed: unknown QoS key 'speed'",
            ),
            (
                "[qos]\ngroup = \"x\"\n",
                "c.toml:2: qos.group: no [qos_groups.x] table",
            ),
            (
                "[qos_groups.x]\ngroup = \"x\"\n",
                "qos_groups.x.group: unknown QoS key 'group'",
            ),
            (
                "[[namespaces]]\nsize = \"1M\"\nqos = { bps_burst = 5 }\n",
                "namespaces[0].qos: bps_burst needs bps",
            ),
        ] {
            let e = ServeConfig::parse("c.toml", text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
