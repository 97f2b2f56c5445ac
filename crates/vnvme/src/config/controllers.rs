//! `[[controllers]]`: several controllers in one `vnvme serve` process,
//! served by one set of poll-group threads (`workers` at the top level).
//!
//! Each `[[controllers]]` table is a whole one-controller document (the
//! same keys, its own `[[controllers.namespaces]]` and
//! `[[controllers.fault]]`) plus `socket` (required) and `control`. A file
//! without `[[controllers]]` is one controller, as before.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use toml::Spanned;
use vnvme_controller::MAX_POLL_GROUPS;

use super::position::{field_at, line_of};
use super::{At, ConfigFileError, FileConfig, ServeConfig};

/// What a `--config` file describes.
#[derive(Debug, Clone, PartialEq)]
pub enum ServeFile {
    /// One controller: the file's keys at the top level.
    One(Box<ServeConfig>),
    /// `[[controllers]]` tables, in file order, and the poll-group threads
    /// (`workers`; `None`: the command line's or the default).
    Many {
        workers: Option<u64>,
        controllers: Vec<ControllerEntry>,
    },
}

/// One `[[controllers]]` table.
#[derive(Debug, Clone, PartialEq)]
pub struct ControllerEntry {
    /// Its vfio-user socket.
    pub socket: PathBuf,
    /// Its control socket (`vnvme ctl --control PATH`), if any.
    pub control: Option<PathBuf>,
    pub config: ServeConfig,
}

/// Top-level keys a file with `[[controllers]]` may have.
const PROCESS_KEYS: [&str; 2] = ["workers", "controllers"];

impl ServeFile {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        Ok(Self::parse(&path.display().to_string(), &text)?)
    }

    /// Parses `text`, naming `file` in errors.
    pub fn parse(file: &str, text: &str) -> Result<Self, ConfigFileError> {
        let at = |span: Option<Range<usize>>, field: String, message: String| ConfigFileError {
            file: file.to_string(),
            line: span.map_or(1, |s| line_of(text, s.start)),
            field,
            message,
        };
        let raw: FileConfig = toml::from_str(text).map_err(|e| {
            let span = e.span();
            let field = span
                .clone()
                .map(|s| field_at(text, s.start))
                .unwrap_or_default();
            at(span, field, e.message().trim().to_string())
        })?;
        if raw.controllers.is_empty() {
            only_in_controllers(&raw, &at)?;
            return Ok(ServeFile::One(Box::new(ServeConfig::from_raw(&raw, &at)?)));
        }
        // Every top-level key but these belongs to one controller.
        let table: toml::Table =
            toml::from_str(text).map_err(|e| at(None, String::new(), e.to_string()))?;
        if let Some(key) = table.keys().find(|k| !PROCESS_KEYS.contains(&k.as_str())) {
            return Err(ConfigFileError {
                file: file.to_string(),
                line: top_level_line(text, key),
                field: key.clone(),
                message: format!(
                    "with [[controllers]], {key} belongs inside each [[controllers]] table; \
                     only workers (the poll-group threads) is set at the top level"
                ),
            });
        }
        let workers = match &raw.workers {
            Some(v) if !(1..=MAX_POLL_GROUPS as u64).contains(v.get_ref()) => {
                return Err(at(
                    Some(v.span()),
                    "workers".into(),
                    format!(
                        "{} is out of range 1..={MAX_POLL_GROUPS} (poll-group threads)",
                        v.get_ref()
                    ),
                ))
            }
            v => v.as_ref().map(|v| *v.get_ref()),
        };
        let mut controllers: Vec<ControllerEntry> = Vec::new();
        // Paths already used (made absolute), by what uses them.
        let mut paths: HashMap<PathBuf, String> = HashMap::new();
        let mut serials: HashMap<String, usize> = HashMap::new();
        let mut nqns: HashMap<String, usize> = HashMap::new();
        for (i, c) in raw.controllers.iter().enumerate() {
            let name = format!("controllers[{i}]");
            let at_c = |span: Option<Range<usize>>, field: String, message: String| {
                let field = if field.is_empty() {
                    name.clone()
                } else {
                    format!("{name}.{field}")
                };
                at(span, field, message)
            };
            let t = c.get_ref();
            if let Some(v) = t.controllers.first() {
                return Err(at_c(
                    Some(v.span()),
                    "controllers".into(),
                    "[[controllers]] tables do not nest".into(),
                ));
            }
            if let Some(v) = &t.workers {
                return Err(at_c(
                    Some(v.span()),
                    "workers".into(),
                    "workers is process-wide with [[controllers]]: set it once at the top level \
                     (the poll-group threads that serve every controller)"
                        .into(),
                ));
            }
            if let Some(v) = &t.sockets {
                return Err(at_c(
                    Some(v.span()),
                    "sockets".into(),
                    "sockets (one subsystem, a controller per socket) is a top-level key of a \
                     one-subsystem file, not of [[controllers]] tables"
                        .into(),
                ));
            }
            let Some(socket) = &t.socket else {
                return Err(at_c(
                    Some(c.span()),
                    String::new(),
                    "socket is missing (socket = \"/run/vnvme-disk1.sock\")".into(),
                ));
            };
            let config = ServeConfig::from_raw(t, &at_c)?;
            let mut claim = |v: &Spanned<String>, key: &str| {
                let field = format!("{name}.{key}");
                if v.get_ref().is_empty() {
                    return Err(at(Some(v.span()), field, "must not be empty".into()));
                }
                let path = PathBuf::from(v.get_ref());
                let absolute = std::path::absolute(&path).unwrap_or_else(|_| path.clone());
                if let Some(other) = paths.insert(absolute, field.clone()) {
                    return Err(at(
                        Some(v.span()),
                        field,
                        format!(
                            "{} is also {other}: each controller needs its own",
                            v.get_ref()
                        ),
                    ));
                }
                Ok(path)
            };
            let socket = claim(socket, "socket")?;
            let control = t
                .control
                .as_ref()
                .map(|v| claim(v, "control"))
                .transpose()?;
            for (key, value, seen) in [
                ("serial", &t.serial, &mut serials),
                ("nqn", &t.nqn, &mut nqns),
            ] {
                if let Some(v) = value {
                    if let Some(j) = seen.insert(v.get_ref().clone(), i) {
                        return Err(at_c(
                            Some(v.span()),
                            key.into(),
                            format!(
                                "'{}' is also controllers[{j}]'s {key}: hosts join controllers \
                                 by it, so each needs its own",
                                v.get_ref()
                            ),
                        ));
                    }
                }
            }
            controllers.push(ControllerEntry {
                socket,
                control,
                config,
            });
        }
        Ok(ServeFile::Many {
            workers,
            controllers,
        })
    }
}

/// A one-controller file has no `socket` or `control` key: those name a
/// `[[controllers]]` table's sockets, and flags give one controller's.
fn only_in_controllers(raw: &FileConfig, at: &At<'_>) -> Result<(), ConfigFileError> {
    for (key, flag, v) in [
        ("socket", "--socket", &raw.socket),
        ("control", "--control", &raw.control),
    ] {
        if let Some(v) = v {
            return Err(at(
                Some(v.span()),
                key.into(),
                format!("{key} is a key of [[controllers]] tables; for one controller give {flag}"),
            ));
        }
    }
    Ok(())
}

/// 1-based line of top-level `key` (before the first table), else 1.
fn top_level_line(text: &str, key: &str) -> usize {
    text.lines()
        .take_while(|l| !l.trim_start().starts_with('['))
        .position(|l| {
            l.split_once('=')
                .is_some_and(|(k, _)| k.trim().trim_matches('"') == key)
        })
        .map_or(1, |n| n + 1)
}
