//! `vnvme serve --config FILE`: the controller and its namespaces in TOML.
//!
//! ```toml
//! serial = "VNVME0042"         # default: derived from the machine-id and the socket path
//! nqn = "nqn.2024-01.com.example:disk1"  # default nqn.2024-01.io.vnvme:SERIAL
//! model = "vnvme slow-start"
//! doorbells = "adaptive"      # trap | shadow | adaptive | mmap-poll
//! max_io_queues = 8
//! msix_vectors = 4            # fewer than queues: CQs share vectors
//! interrupts = "msix"         # or "msi": for VMs that detach disks (QEMU 11.1)
//! workers = 2
//! ready_timeout = "5s"        # CRTO; never-ready namespaces get DNR after it
//! max_namespaces = 16         # NN
//! nvm_capacity = "2G"         # TNVMCAP for Namespace Management
//! format_duration = "100ms"   # Format In Progress this long
//! sanitize_rate = "64M"       # medium a sanitize goes over per second
//! self_test_rate = "1G"       # medium a device self-test reads per second
//! nssr = false                 # offer NVM Subsystem Reset (CAP.NSSRS)
//! max_dma_maps = 1024         # what a vfio-user client may map, in maps
//! max_dma_size = "64G"        # ... and in bytes
//! handshake_timeout = "5s"    # VERSION within this
//! message_timeout = "5s"      # each message whole within this
//! stop_timeout = "30s"        # then exit even if a worker is stuck
//! socket_group = "kvm"        # the vfio-user socket's group (a name or number) ...
//! socket_mode = "660"         # ... and mode, octal in a string (default 600; 660 with a group)
//! sockets = ["/run/vnvme/a.sock", "/run/vnvme/b.sock"]  # one subsystem, a controller per
//!                             # socket (CNTLID 1, 2, ...), namespaces shared; as --socket
//!                             # given more than once, which wins over it
//!
//! [[namespaces]]              # NSID 1
//! size = "1G"
//! backend = "ram"             # null | ram | file (with path = "...") | nbd=URI
//! volatile_cache = true       # ram: writes durable once flushed (power-loss fault)
//! nguid = "5d1e7a2c3f4b4e8e9a610c2b7d9fe310"  # identifiers (default: derived, unique):
//! eui64 = "0200000000000001"                  # hex digits, dashes allowed
//! uuid = "9a5e2a4e-3c1b-4a8f-8f4e-2b1d6c7e8f90"
//!
//! [[namespaces]]              # NSID 2
//! size = "256M"
//! ready = "5s"                # Namespace Not Ready until 5 s after enable
//! format = 0                  # index into LBA_FORMATS (512 + 0); default 3 (4096 + 0),
//!                             # or for a file or nbd image the one its partition table
//!                             # was made for (see vnvme::image_format)
//!
//! [[namespaces]]              # NSID 3
//! size = "64M"
//! never_ready = true
//! attached = false
//!
//! [[namespaces]]              # NSID 4
//! size = "64M"
//! format = 4                  # 4096 + 8
//! pi = 1                      # protection information Type 1 (2, 3)
//! pil = "first"               # in the first bytes of metadata (or "last")
//!
//! [[namespaces]]              # NSID 5: zoned (ZNS)
//! size = "1G"
//! zoned = true
//! zone_size = "64M"           # a power of two (default 64M)
//! zone_capacity = "48M"       # writable part of each zone (default: all)
//! max_open_zones = 8          # MOR + 1 (default: no limit)
//! max_active_zones = 12       # MAR + 1 (default: max_open_zones)
//! read_only_zones = 0         # the last N zones start read only
//! zone_extension_size = 64    # zone descriptor extension bytes, ZDES x 64 (default 0)
//!
//! [[namespaces]]              # NSID 6: limited (see crate::qos, docs/qos.md)
//! size = "1G"
//! qos = { read_iops = 1000, write_bps = "50M", write_bps_burst = "4M", group = "tenant-a" }
//!
//! [qos]                       # the controller's limits: all its namespaces together
//! iops = 20000
//! bps = "200M"
//!
//! [qos_groups.tenant-a]       # a budget shared by its members (group = "tenant-a")
//! write_iops = 5000
//!
//! [[fault]]                   # armed at start (see control::fault_params)
//! kind = "status"
//! nsid = 1
//! opcodes = ["read"]
//! status = "unrecovered-read-error"
//! probability = 0.001
//! controller = 2              # only controller 2 of several --socket (default: every one)
//! ```
//!
//! Errors name the file, line and field:
//! `config.toml:7: namespaces[1].ready: invalid duration 'soon' ...`.
//!
//! # Several controllers in one process
//!
//! A file with `[[controllers]]` tables serves several independent
//! controllers from one process ([`ServeFile::Many`]). Each table is a
//! whole document as above (the same keys, its own
//! `[[controllers.namespaces]]` and `[[controllers.fault]]`) plus `socket`
//! (required) and `control` (optional: `vnvme ctl --control PATH` for that
//! controller). At the top level only `workers` may stand: the poll-group
//! threads that serve every controller's queues (default: `--workers`,
//! 1), each controller's admin queue and one I/O worker per thread, a
//! busy controller yielding to the others every 128 commands per queue.
//!
//! ```toml
//! workers = 2                  # poll-group threads for all controllers
//!
//! [[controllers]]
//! socket = "/run/vnvme/vm1-disk1.sock"
//! control = "/run/vnvme/vm1-disk1.ctl"
//! [[controllers.namespaces]]
//! size = "8G"
//! backend = "file"
//! path = "/var/lib/vnvme/vm1-disk1.img"
//!
//! [[controllers]]
//! socket = "/run/vnvme/vm1-disk2.sock"
//! doorbells = "shadow"
//! [[controllers.namespaces]]
//! size = "1G"
//! ```
//!
//! Errors name the table: `serve.toml:14: controllers[1].namespaces[0].size:
//! ...`. Mixing top-level controller keys with `[[controllers]]`, a
//! controller table without `socket`, `workers` inside one, two tables with
//! one socket or control path, and two controllers with one serial number,
//! subsystem NQN or namespace identifier (NGUID, EUI-64, UUID, also where
//! derived) are refused. Without `[[controllers]]` the file is one
//! controller, as before, and separate processes (one `--socket` each)
//! stay the default.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;
use vnvme_controller::{
    DoorbellMode, FaultSpec, Protection, QosLimits, Readiness, DEFAULT_FORMAT_INDEX, MAX_NAMESPACES,
};
use vnvme_device::{Interrupts, MAX_MSIX_VECTORS};

use crate::control::fault_params::FaultParams;
use crate::device::{DeviceOptions, MAX_IO_QUEUES, MAX_WORKERS};
use crate::duration::parse_duration;
use crate::identity::{parse_nqn, parse_serial};
use crate::namespace::{
    check_format_index, check_pi_fits, parse_pi_type, parse_pil, Backend, NamespaceSpec,
};
use crate::qos::{QosSpec, QosValue};
use crate::size::parse_size;
use crate::zoned_options::ZonedOptions;

/// A configuration file that cannot be used: where and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {field}{sep}{message}", sep = if field.is_empty() { "" } else { ": " })]
pub struct ConfigFileError {
    pub file: String,
    /// 1-based.
    pub line: usize,
    /// `namespaces[1].ready`; empty when the error is not about one field.
    pub field: String,
    pub message: String,
}

/// Makes the error for a span (its line), a field and a message.
type At<'a> = dyn Fn(Option<Range<usize>>, String, String) -> ConfigFileError + 'a;

mod controllers;
mod position;
pub use controllers::{ControllerEntry, ServeFile};

/// A size: bytes as an integer, or text with a K/M/G/T suffix.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum SizeValue {
    Bytes(u64),
    Text(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    serial: Option<Spanned<String>>,
    nqn: Option<Spanned<String>>,
    model: Option<Spanned<String>>,
    doorbells: Option<Spanned<String>>,
    max_io_queues: Option<Spanned<u16>>,
    msix_vectors: Option<Spanned<u16>>,
    interrupts: Option<Spanned<String>>,
    workers: Option<Spanned<u64>>,
    ready_timeout: Option<Spanned<String>>,
    max_namespaces: Option<Spanned<u32>>,
    nvm_capacity: Option<Spanned<SizeValue>>,
    format_duration: Option<Spanned<String>>,
    sanitize_rate: Option<Spanned<SizeValue>>,
    self_test_rate: Option<Spanned<SizeValue>>,
    nssr: Option<Spanned<bool>>,
    max_dma_maps: Option<Spanned<u64>>,
    max_dma_size: Option<Spanned<SizeValue>>,
    handshake_timeout: Option<Spanned<String>>,
    message_timeout: Option<Spanned<String>>,
    stop_timeout: Option<Spanned<String>>,
    socket_mode: Option<Spanned<String>>,
    socket_group: Option<Spanned<SizeValue>>,
    #[serde(default)]
    namespaces: Vec<FileNamespace>,
    /// Faults armed at start (`control::fault_params`).
    #[serde(default)]
    fault: Vec<Spanned<FaultParams>>,
    /// The controller's limits (`crate::qos`).
    qos: Option<QosTable>,
    #[serde(default)]
    qos_groups: BTreeMap<String, QosTable>,
    /// `[[controllers]]` only: the vfio-user socket and control socket.
    socket: Option<Spanned<String>>,
    /// One controller of the subsystem per socket (not in `[[controllers]]`).
    sockets: Option<Spanned<Vec<String>>>,
    control: Option<Spanned<String>>,
    /// Several controllers in one process ([`controllers`]).
    #[serde(default)]
    controllers: Vec<Spanned<FileConfig>>,
}

/// A `qos` table: keys are checked by `crate::qos`, so the error lists them.
type QosTable = BTreeMap<String, Spanned<QosValue>>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileNamespace {
    size: Option<Spanned<SizeValue>>,
    backend: Option<Spanned<String>>,
    path: Option<Spanned<String>>,
    format: Option<Spanned<u8>>,
    pi: Option<Spanned<u8>>,
    pil: Option<Spanned<String>>,
    ready: Option<Spanned<String>>,
    never_ready: Option<Spanned<bool>>,
    attached: Option<Spanned<bool>>,
    zoned: Option<Spanned<bool>>,
    zone_size: Option<Spanned<SizeValue>>,
    zone_capacity: Option<Spanned<SizeValue>>,
    max_open_zones: Option<Spanned<u32>>,
    max_active_zones: Option<Spanned<u32>>,
    read_only_zones: Option<Spanned<u32>>,
    zone_extension_size: Option<Spanned<u32>>,
    volatile_cache: Option<Spanned<bool>>,
    nguid: Option<Spanned<String>>,
    eui64: Option<Spanned<String>>,
    uuid: Option<Spanned<String>>,
    qos: Option<QosTable>,
}

/// What a configuration file sets; `None` leaves the command line's value.
/// A `[[fault]]` table: the fault, and the controller it is armed on
/// (`controller = N`, a CNTLID; none: every controller of the
/// subsystem). An `ana` fault's `controller` is the path it fails, and
/// it is armed once: `controller` here is then none.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfiguredFault {
    pub controller: Option<u16>,
    pub spec: FaultSpec,
}

/// A fault's `controller` in a server of one controller, `ctrl`: its
/// CNTLID or none; another is an error that says which there is.
pub fn only_controller(
    f: &ConfiguredFault,
    ctrl: &vnvme_controller::Controller,
) -> anyhow::Result<()> {
    match f.controller {
        Some(n) if n != ctrl.cntlid() => anyhow::bail!(
            "controller = {n}: this server has one controller, {} (several --socket make a \
             subsystem of several)",
            ctrl.cntlid()
        ),
        _ => Ok(()),
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServeConfig {
    pub serial: Option<String>,
    pub nqn: Option<String>,
    pub model: Option<String>,
    pub doorbells: Option<DoorbellMode>,
    pub max_io_queues: Option<u16>,
    pub msix_vectors: Option<u16>,
    pub interrupts: Option<Interrupts>,
    pub workers: Option<u64>,
    pub ready_timeout: Option<Duration>,
    pub max_namespaces: Option<u32>,
    pub nvm_capacity: Option<u64>,
    pub format_duration: Option<Duration>,
    pub sanitize_rate: Option<u64>,
    pub self_test_rate: Option<u64>,
    pub nssr: Option<bool>,
    pub max_dma_maps: Option<u64>,
    pub max_dma_size: Option<u64>,
    pub handshake_timeout: Option<Duration>,
    pub message_timeout: Option<Duration>,
    pub stop_timeout: Option<Duration>,
    /// `sockets`: a controller of the subsystem per socket (empty: the
    /// command line's one socket).
    pub sockets: Vec<PathBuf>,
    /// `--socket-mode` and `--socket-group` (a name or number, checked to exist).
    pub socket_mode: Option<u32>,
    pub socket_group: Option<String>,
    /// NSIDs from 1 in order; empty if the file has none.
    pub namespaces: Vec<NamespaceSpec>,
    /// `[[fault]]` tables, armed when the controller starts.
    pub faults: Vec<ConfiguredFault>,
    /// `[qos]`: the controller's limits and group.
    pub qos: QosSpec,
    /// `[qos_groups.NAME]` tables.
    pub qos_groups: BTreeMap<String, QosLimits>,
}

impl ServeConfig {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        Ok(Self::parse(&path.display().to_string(), &text)?)
    }

    /// Parses `text`, naming `file` in errors: one controller (a file with
    /// `[[controllers]]` is refused: see [`ServeFile`]).
    pub fn parse(file: &str, text: &str) -> Result<Self, ConfigFileError> {
        match ServeFile::parse(file, text)? {
            ServeFile::One(c) => Ok(*c),
            ServeFile::Many { .. } => Err(ConfigFileError {
                file: file.to_string(),
                line: 1,
                field: "controllers".into(),
                message: "this file describes several controllers: serve it with vnvme serve \
                          --config"
                    .into(),
            }),
        }
    }

    /// One controller's table: the whole file, or a `[[controllers]]`
    /// table (`at` then names it in front of every field).
    fn from_raw(raw: &FileConfig, at: &At<'_>) -> Result<Self, ConfigFileError> {
        // A value's check, reported at the value's line under `field`.
        let check =
            |field: &str, v: &Spanned<String>, parse: &dyn Fn(&str) -> Result<(), String>| {
                parse(v.get_ref()).map_err(|m| at(Some(v.span()), field.to_string(), m))
            };
        let duration = |field: &str,
                        v: &Option<Spanned<String>>|
         -> Result<Option<Duration>, ConfigFileError> {
            v.as_ref()
                .map(|v| {
                    parse_duration(v.get_ref())
                        .map_err(|m| at(Some(v.span()), field.to_string(), m))
                })
                .transpose()
        };
        let size = |field: &str, v: &Spanned<SizeValue>| -> Result<u64, ConfigFileError> {
            match v.get_ref() {
                SizeValue::Bytes(n) => Ok(*n),
                SizeValue::Text(t) => {
                    parse_size(t).map_err(|m| at(Some(v.span()), field.to_string(), m))
                }
            }
        };
        // A qos table, `field` naming it in errors; `group` if it may join one.
        let qos = |field: &str,
                   table: &QosTable,
                   group: bool,
                   defined: &BTreeMap<String, QosLimits>|
         -> Result<QosSpec, ConfigFileError> {
            let mut spec = QosSpec::default();
            for (key, v) in table {
                spec.set(key, v.get_ref(), group)
                    .map_err(|m| at(Some(v.span()), format!("{field}.{key}"), m))?;
            }
            let first = table.values().next().map(Spanned::span);
            spec.validate()
                .map_err(|m| at(first.clone(), field.to_string(), m))?;
            if let Some(name) = spec.group.as_ref().filter(|n| !defined.contains_key(*n)) {
                let span = table.get("group").map(Spanned::span);
                return Err(at(
                    span,
                    format!("{field}.group"),
                    format!("no [qos_groups.{name}] table defines this group"),
                ));
            }
            Ok(spec)
        };
        let mut qos_groups = BTreeMap::new();
        for (name, table) in &raw.qos_groups {
            let spec = qos(&format!("qos_groups.{name}"), table, false, &qos_groups)?;
            if vnvme_controller::QosGroup::new(name, spec.limits).is_err() {
                let span = table.values().next().map(Spanned::span);
                return Err(at(
                    span,
                    format!("qos_groups.{name}"),
                    "a group's name is 1 to 64 letters, digits, '-', '_' or '.'".into(),
                ));
            }
            qos_groups.insert(name.clone(), spec.limits);
        }
        let mut cfg = ServeConfig {
            serial: raw
                .serial
                .as_ref()
                .map(|v| {
                    parse_serial(v.get_ref()).map_err(|m| at(Some(v.span()), "serial".into(), m))
                })
                .transpose()?,
            nqn: raw
                .nqn
                .as_ref()
                .map(|v| parse_nqn(v.get_ref()).map_err(|m| at(Some(v.span()), "nqn".into(), m)))
                .transpose()?,
            model: raw.model.as_ref().map(|v| v.get_ref().clone()),
            ready_timeout: duration("ready_timeout", &raw.ready_timeout)?,
            format_duration: duration("format_duration", &raw.format_duration)?,
            nssr: raw.nssr.as_ref().map(|v| *v.get_ref()),
            handshake_timeout: duration("handshake_timeout", &raw.handshake_timeout)?,
            message_timeout: duration("message_timeout", &raw.message_timeout)?,
            stop_timeout: duration("stop_timeout", &raw.stop_timeout)?,
            nvm_capacity: raw
                .nvm_capacity
                .as_ref()
                .map(|v| size("nvm_capacity", v))
                .transpose()?,
            sanitize_rate: raw
                .sanitize_rate
                .as_ref()
                .map(|v| size("sanitize_rate", v))
                .transpose()?,
            self_test_rate: raw
                .self_test_rate
                .as_ref()
                .map(|v| size("self_test_rate", v))
                .transpose()?,
            qos: match &raw.qos {
                Some(t) => qos("qos", t, true, &qos_groups)?,
                None => QosSpec::default(),
            },
            ..ServeConfig::default()
        };
        if let Some(v) = &raw.doorbells {
            cfg.doorbells = Some(v.get_ref().parse().map_err(
                |e: vnvme_controller::UnknownDoorbellMode| {
                    at(Some(v.span()), "doorbells".into(), e.to_string())
                },
            )?);
        }
        if let Some(v) = &raw.interrupts {
            cfg.interrupts = Some(v.get_ref().parse().map_err(
                |e: vnvme_device::UnknownInterrupts| {
                    at(Some(v.span()), "interrupts".into(), e.to_string())
                },
            )?);
        }
        let ranged = |field: &str, span: Range<usize>, value: u64, lo: u64, hi: u64| {
            if (lo..=hi).contains(&value) {
                Ok(())
            } else {
                Err(at(
                    Some(span),
                    field.to_string(),
                    format!("{value} is out of range {lo}..={hi}"),
                ))
            }
        };
        if let Some(v) = &raw.max_io_queues {
            ranged(
                "max_io_queues",
                v.span(),
                u64::from(*v.get_ref()),
                1,
                u64::from(MAX_IO_QUEUES),
            )?;
            cfg.max_io_queues = Some(*v.get_ref());
        }
        if let Some(v) = &raw.msix_vectors {
            ranged(
                "msix_vectors",
                v.span(),
                u64::from(*v.get_ref()),
                1,
                u64::from(MAX_MSIX_VECTORS),
            )?;
            cfg.msix_vectors = Some(*v.get_ref());
        }
        if let Some(v) = &raw.workers {
            ranged("workers", v.span(), *v.get_ref(), 1, MAX_WORKERS)?;
            cfg.workers = Some(*v.get_ref());
        }
        if let Some(v) = &raw.max_dma_maps {
            ranged(
                "max_dma_maps",
                v.span(),
                *v.get_ref(),
                1,
                vnvme_vfio_user::MAX_FD_DMA_MAPS as u64,
            )?;
            cfg.max_dma_maps = Some(*v.get_ref());
        }
        if let Some(v) = &raw.max_dma_size {
            let bytes = size("max_dma_size", v)?;
            if bytes == 0 {
                return Err(at(
                    Some(v.span()),
                    "max_dma_size".into(),
                    "must be more than 0".into(),
                ));
            }
            cfg.max_dma_size = Some(bytes);
        }
        for (field, v, parsed) in [
            (
                "handshake_timeout",
                &raw.handshake_timeout,
                cfg.handshake_timeout,
            ),
            ("message_timeout", &raw.message_timeout, cfg.message_timeout),
            ("stop_timeout", &raw.stop_timeout, cfg.stop_timeout),
        ] {
            if let (Some(v), Some(Duration::ZERO)) = (v, parsed) {
                return Err(at(
                    Some(v.span()),
                    field.into(),
                    "must be more than 0".into(),
                ));
            }
        }
        if let Some(v) = &raw.sockets {
            let list = v.get_ref();
            let mut seen = std::collections::HashSet::new();
            for path in list {
                if path.is_empty() || !seen.insert(path) {
                    return Err(at(
                        Some(v.span()),
                        "sockets".into(),
                        format!("{path:?} is empty or named twice: each controller needs its own socket"),
                    ));
                }
            }
            cfg.sockets = list.iter().map(PathBuf::from).collect();
        }
        if let Some(v) = &raw.socket_mode {
            let mode = crate::socket::parse_mode(v.get_ref());
            cfg.socket_mode = Some(mode.map_err(|m| at(Some(v.span()), "socket_mode".into(), m))?);
        }
        if let Some(v) = &raw.socket_group {
            let text = match v.get_ref() {
                SizeValue::Bytes(n) => n.to_string(),
                SizeValue::Text(t) => t.clone(),
            };
            crate::socket::access::resolve_group(&text)
                .map_err(|m| at(Some(v.span()), "socket_group".into(), m))?;
            cfg.socket_group = Some(text);
        }
        if let Some(v) = &raw.max_namespaces {
            ranged(
                "max_namespaces",
                v.span(),
                u64::from(*v.get_ref()),
                0,
                u64::from(MAX_NAMESPACES),
            )?;
            cfg.max_namespaces = Some(*v.get_ref());
        }
        for (i, ns) in raw.namespaces.iter().enumerate() {
            let field = |name: &str| format!("namespaces[{i}].{name}");
            let backend = match (&ns.backend, &ns.path) {
                (None, None) => Backend::Ram,
                (Some(b), None) if b.get_ref() != "file" => b
                    .get_ref()
                    .parse()
                    .map_err(|m| at(Some(b.span()), field("backend"), m))?,
                (Some(b), None) => {
                    return Err(at(
                        Some(b.span()),
                        field("backend"),
                        "the file backend needs path = \"...\"".into(),
                    ))
                }
                (None | Some(_), Some(p)) => {
                    if let Some(b) = ns.backend.as_ref().filter(|b| b.get_ref() != "file") {
                        return Err(at(
                            Some(b.span()),
                            field("backend"),
                            format!("path is only for backend = \"file\", not '{}'", b.get_ref()),
                        ));
                    }
                    Backend::File(p.get_ref().into())
                }
            };
            let bytes = match &ns.size {
                Some(v) => size(&field("size"), v)?,
                None if matches!(backend, Backend::File(_) | Backend::Nbd(_)) => 0,
                None => {
                    return Err(at(
                        None,
                        format!("namespaces[{i}]"),
                        "size is missing (e.g. size = \"1G\")".into(),
                    ))
                }
            };
            let mut spec = NamespaceSpec::new(bytes, backend);
            if let Some(v) = &ns.format {
                check_format_index(*v.get_ref())
                    .map_err(|m| at(Some(v.span()), field("format"), m))?;
                spec.format = Some(*v.get_ref());
            }
            if let Some(v) = &ns.pi {
                let pi_type = parse_pi_type(&v.get_ref().to_string())
                    .map_err(|m| at(Some(v.span()), field("pi"), m))?;
                check_pi_fits(spec.format.unwrap_or(DEFAULT_FORMAT_INDEX))
                    .map_err(|m| at(Some(v.span()), field("pi"), m))?;
                spec.protection = Some(Protection {
                    pi_type,
                    first: false,
                });
            }
            if let Some(v) = &ns.pil {
                let first =
                    parse_pil(v.get_ref()).map_err(|m| at(Some(v.span()), field("pil"), m))?;
                match &mut spec.protection {
                    Some(p) => p.first = first,
                    None => {
                        return Err(at(
                            Some(v.span()),
                            field("pil"),
                            "pil needs pi = 1, 2 or 3".into(),
                        ))
                    }
                }
            }
            if let Some(v) = &ns.ready {
                check(&field("ready"), v, &|t| parse_duration(t).map(drop))?;
                spec.readiness = Readiness::After(parse_duration(v.get_ref()).unwrap_or_default());
            }
            if let Some(v) = &ns.never_ready {
                if *v.get_ref() {
                    if ns.ready.is_some() {
                        return Err(at(
                            Some(v.span()),
                            field("never_ready"),
                            "a namespace cannot have both ready and never_ready".into(),
                        ));
                    }
                    spec.readiness = Readiness::Never;
                }
            }
            if let Some(v) = &ns.attached {
                spec.attached = *v.get_ref();
            }
            let mut z = ZonedOptions {
                zoned: ns.zoned.as_ref().is_some_and(|v| *v.get_ref()),
                ..ZonedOptions::default()
            };
            if let Some(v) = &ns.zone_size {
                z.zone_size = Some(size(&field("zone_size"), v)?);
            }
            if let Some(v) = &ns.zone_capacity {
                z.zone_capacity = Some(size(&field("zone_capacity"), v)?);
            }
            z.max_open = ns.max_open_zones.as_ref().map(|v| *v.get_ref());
            z.max_active = ns.max_active_zones.as_ref().map(|v| *v.get_ref());
            z.read_only_zones = ns.read_only_zones.as_ref().map(|v| *v.get_ref());
            z.extension_size = ns.zone_extension_size.as_ref().map(|v| *v.get_ref());
            let given = z.zone_size.is_some()
                || z.zone_capacity.is_some()
                || z.max_open.is_some()
                || z.max_active.is_some()
                || z.read_only_zones.is_some()
                || z.extension_size.is_some();
            if given {
                z.first = Some("a zone setting".into());
            }
            let zoned_span = ns.zoned.as_ref().map(Spanned::span);
            spec.zoned = z.build().map_err(|m| {
                at(
                    zoned_span,
                    field("zoned"),
                    m.replace(": add ,zoned", ": add zoned = true"),
                )
            })?;
            if let Some(v) = &ns.volatile_cache {
                if *v.get_ref() && spec.backend != Backend::Ram {
                    return Err(at(
                        Some(v.span()),
                        field("volatile_cache"),
                        "a volatile write cache that power loss empties is for ram namespaces"
                            .into(),
                    ));
                }
                spec.volatile_cache = *v.get_ref();
            }
            for (key, v) in [
                ("nguid", &ns.nguid),
                ("eui64", &ns.eui64),
                ("uuid", &ns.uuid),
            ] {
                if let Some(v) = v {
                    if let Some(Err(m)) = spec.ids.set(key, v.get_ref()) {
                        return Err(at(Some(v.span()), field(key), m));
                    }
                }
            }
            if let Some(t) = &ns.qos {
                spec.qos = qos(&field("qos"), t, true, &qos_groups)?;
            }
            let span = ns.size.as_ref().map(Spanned::span);
            spec.validate().map_err(|m| at(span, field("size"), m))?;
            cfg.namespaces.push(spec);
        }
        for (i, f) in raw.fault.iter().enumerate() {
            let spec = f
                .get_ref()
                .to_spec()
                .map_err(|m| at(Some(f.span()), format!("fault[{i}]"), m))?;
            let controller = f.get_ref().target();
            cfg.faults.push(ConfiguredFault { controller, spec });
        }
        cfg.qos_groups = qos_groups;
        Ok(cfg)
    }

    /// The device options: the file's values, except where the command
    /// line gave a value other than the default (a flag repeating the
    /// default cannot be told apart from no flag, so the file wins then).
    pub fn apply(&self, cli: &DeviceOptions) -> DeviceOptions {
        let d = DeviceOptions::default();
        fn pick<T: Clone + PartialEq>(cli: &T, default: &T, file: &Option<T>) -> T {
            match file {
                Some(f) if cli == default => f.clone(),
                _ => cli.clone(),
            }
        }
        DeviceOptions {
            serial: cli.serial.clone().or(self.serial.clone()),
            nqn: cli.nqn.clone().or(self.nqn.clone()),
            model: pick(&cli.model, &d.model, &self.model),
            doorbells: pick(&cli.doorbells, &d.doorbells, &self.doorbells),
            max_io_queues: pick(&cli.max_io_queues, &d.max_io_queues, &self.max_io_queues),
            msix_vectors: cli.msix_vectors.or(self.msix_vectors),
            interrupts: pick(&cli.interrupts, &d.interrupts, &self.interrupts),
            workers: pick(&cli.workers, &d.workers, &self.workers),
            polling: cli.polling.clone(),
            ready_timeout: cli.ready_timeout.or(self.ready_timeout),
            max_namespaces: pick(&cli.max_namespaces, &d.max_namespaces, &self.max_namespaces),
            nvm_capacity: cli.nvm_capacity.or(self.nvm_capacity),
            format_duration: cli.format_duration.or(self.format_duration),
            sanitize_rate: cli.sanitize_rate.or(self.sanitize_rate),
            self_test_rate: cli.self_test_rate.or(self.self_test_rate),
            nssr: cli.nssr || self.nssr == Some(true),
        }
    }
}

#[cfg(test)]
mod tests;
