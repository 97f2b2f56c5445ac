//! The zoned namespace options of `--ns`:
//! `zoned[,zone-size=SIZE][,zone-cap=SIZE][,max-open=N][,max-active=N][,ro-zones=N][,zone-ext=BYTES]`.

use vnvme_controller::ZonedConfig;

use crate::size::parse_size;

/// The zoned options, as `--ns`'s help writes them (see
/// [`crate::ns_syntax`]): [`ZonedOptions::take`] takes no other key.
pub const ZONED_OPTIONS: &[&str] = &[
    "zoned",
    "zone-size=SIZE",
    "zone-cap=SIZE",
    "max-open=N",
    "max-active=N",
    "ro-zones=N",
    "zone-ext=BYTES",
];

/// Zone size when `zoned` names none.
pub const DEFAULT_ZONE_SIZE: u64 = 64 << 20;

/// The zoned options of one namespace, as they come.
#[derive(Debug, Default)]
pub struct ZonedOptions {
    pub zoned: bool,
    pub zone_size: Option<u64>,
    pub zone_capacity: Option<u64>,
    pub max_open: Option<u32>,
    pub max_active: Option<u32>,
    pub read_only_zones: Option<u32>,
    /// Zone descriptor extension size in bytes (ZDES × 64).
    pub extension_size: Option<u32>,
    /// The first zone option given, for the error if `zoned` is missing.
    pub first: Option<String>,
}

fn count(key: &str, value: &str) -> Result<u32, String> {
    value
        .parse()
        .map_err(|e| format!("{key}={value}: not a number of zones: {e}"))
}

impl ZonedOptions {
    /// Takes `option` (`zoned`, or `key=value`) if it is a zoned option:
    /// `None` if it is not one.
    pub fn take(&mut self, option: &str) -> Option<Result<(), String>> {
        if option == "zoned" {
            self.zoned = true;
            return Some(Ok(()));
        }
        let (key, value) = option.split_once('=')?;
        let r = match key {
            "zone-size" => parse_size(value).map(|v| self.zone_size = Some(v)),
            "zone-cap" => parse_size(value).map(|v| self.zone_capacity = Some(v)),
            "max-open" => count(key, value).map(|v| self.max_open = Some(v)),
            "max-active" => count(key, value).map(|v| self.max_active = Some(v)),
            "ro-zones" => count(key, value).map(|v| self.read_only_zones = Some(v)),
            "zone-ext" => parse_size(value).and_then(|v| {
                // Past u32 is the conversion's only failure: the message says it.
                let v = u32::try_from(v).map_err(|_| format!("zone-ext={value}: too large"))?;
                self.extension_size = Some(v);
                Ok(())
            }),
            _ => return None,
        };
        self.first.get_or_insert_with(|| key.to_owned());
        Some(r)
    }

    /// The zones asked for: `None` for a conventional namespace.
    pub fn build(self) -> Result<Option<ZonedConfig>, String> {
        if !self.zoned {
            return match self.first {
                Some(key) => Err(format!("{key} is for zoned namespaces: add ,zoned")),
                None => Ok(None),
            };
        }
        let mut c = ZonedConfig::new(self.zone_size.unwrap_or(DEFAULT_ZONE_SIZE));
        c.zone_capacity = self.zone_capacity.unwrap_or(c.zone_size);
        c.max_open = self.max_open;
        // An open zone is active: the active limit is at least the open one.
        c.max_active = self.max_active.or(self.max_open);
        c.read_only_zones = self.read_only_zones.unwrap_or(0);
        c.extension_size = self.extension_size.unwrap_or(0);
        c.validate().map_err(|e| e.to_string())?;
        Ok(Some(c))
    }
}
