//! Namespace descriptions from the command line: RAM (`SIZE[:null|ram]`), a
//! file or block device (`PATH:file`, its size, or `SIZE:file=PATH`,
//! created or extended to SIZE) or an NBD export (`nbd=URI`, its size, or
//! `SIZE:nbd=URI`, its first SIZE bytes), then options after commas; the
//! forms and options are listed, with their help, in [`crate::ns_syntax`],
//! and the parser takes no option that is not listed there. `,zoned` and its
//! options (see [`crate::zoned_options`]) make it a zoned namespace. A file
//! or NBD namespace without `format=` takes the sector size its image was
//! made for (see [`crate::image_format`]).

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use vnvme_blockdev::BlockDevice;
use vnvme_controller::{
    NamespaceConfig, NamespaceIds, PiType, Protection, Readiness, ZonedConfig,
    DEFAULT_FORMAT_INDEX, LBA_FORMATS,
};

use crate::duration::parse_duration;
use crate::identity::{absolute, host_ids, parse_id};
use crate::ns_syntax::{is_option, unknown_option, unknown_storage};
use crate::qos::QosSpec;
use crate::size::parse_size;
use crate::zoned_options::ZonedOptions;

/// The storage behind a namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// Reads return zeroes, writes are dropped.
    Null,
    /// Kept in memory for the life of the server.
    Ram,
    /// A regular file or a block device, on io_uring, locked while served.
    File(PathBuf),
    /// An export of an NBD server: `nbd://HOST[:PORT]/EXPORT` or
    /// `nbd+unix:///EXPORT?socket=PATH`.
    Nbd(String),
}

impl FromStr for Backend {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "null" => Ok(Backend::Null),
            "ram" => Ok(Backend::Ram),
            "file" => Err("the file backend needs a path: PATH:file or SIZE:file=PATH".into()),
            "nbd" => Err("the nbd backend needs a URI: nbd=URI or SIZE:nbd=URI".into()),
            other => {
                if let Some(uri) = other.strip_prefix("nbd=") {
                    // Checked now, so a typo fails at the command line.
                    uri.parse::<vnvme_blockdev::NbdUri>()
                        .map_err(|e| e.to_string())?;
                    return Ok(Backend::Nbd(uri.into()));
                }
                match other.strip_prefix("file=") {
                    Some("") => {
                        Err("the file backend needs a path: PATH:file or SIZE:file=PATH".into())
                    }
                    None => Err(unknown_storage(other)),
                    Some(path) => Ok(Backend::File(path.into())),
                }
            }
        }
    }
}

impl Backend {
    /// The forms of [`NS_FORMS`](crate::ns_syntax::NS_FORMS) that give
    /// this backend. No default arm: a new backend names its forms here,
    /// and the tests find them in that list and in the help.
    pub fn forms(&self) -> &'static [&'static str] {
        match self {
            Backend::Null | Backend::Ram => &["SIZE[:null|ram]"],
            Backend::File(_) => &["PATH:file", "SIZE:file=PATH"],
            Backend::Nbd(_) => &["nbd=URI", "SIZE:nbd=URI"],
        }
    }
}

/// A namespace as given on the command line or in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceSpec {
    /// Bytes; 0 for a file or nbd backend means the file's or export's
    /// own size.
    pub size: u64,
    pub backend: Backend,
    /// When it becomes ready after each controller enable.
    pub readiness: Readiness,
    /// Attached at start (a detached namespace is allocated but inactive).
    pub attached: bool,
    /// Index into [`LBA_FORMATS`] given by `format=`; `None`: the image's
    /// (a `file` or `nbd` namespace, see [`crate::image_format`]), else
    /// [`DEFAULT_FORMAT_INDEX`].
    pub format: Option<u8>,
    /// Protection information type and place (`pi=`, `pil=`), if any.
    pub protection: Option<Protection>,
    /// A zoned namespace: its zones (`None`: conventional).
    pub zoned: Option<ZonedConfig>,
    /// A `ram` namespace with a volatile write cache: writes are durable
    /// once flushed, and a power-loss fault drops the others.
    pub volatile_cache: bool,
    /// Identifiers given (`nguid=`, `eui64=`, `uuid=`) instead of the
    /// derived ones (see [`crate::identity`]).
    pub ids: IdChoice,
    /// IOPS and bandwidth limits and group (`iops=`, `qos-group=`...; see
    /// [`crate::qos`]).
    pub qos: QosSpec,
}

/// The namespace identifiers a configuration sets; each `None` keeps the
/// derived one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IdChoice {
    pub nguid: Option<[u8; 16]>,
    pub eui64: Option<[u8; 8]>,
    pub uuid: Option<[u8; 16]>,
}

impl IdChoice {
    /// Parses and sets `key` (nguid, eui64 or uuid) to `value`; `None` if
    /// `key` is none of them.
    pub fn set(&mut self, key: &str, value: &str) -> Option<Result<(), String>> {
        let r = match key {
            "nguid" => parse_id(key, value).map(|v| self.nguid = Some(v)),
            "eui64" => parse_id(key, value).map(|v| self.eui64 = Some(v)),
            "uuid" => parse_id(key, value).map(|v| self.uuid = Some(v)),
            _ => return None,
        };
        Some(r)
    }

    /// `base` with the identifiers chosen here in place of its own.
    pub fn apply(&self, base: NamespaceIds) -> NamespaceIds {
        NamespaceIds {
            nguid: self.nguid.unwrap_or(base.nguid),
            eui64: self.eui64.unwrap_or(base.eui64),
            uuid: self.uuid.unwrap_or(base.uuid),
        }
    }

    fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

impl NamespaceSpec {
    /// A ready, attached namespace in the image's format or of 4 KiB blocks.
    pub fn new(size: u64, backend: Backend) -> Self {
        Self {
            size,
            backend,
            readiness: Readiness::Immediate,
            attached: true,
            format: None,
            protection: None,
            zoned: None,
            volatile_cache: false,
            ids: IdChoice::default(),
            qos: QosSpec::default(),
        }
    }

    /// The identifiers its backend gives it: a file's (from its absolute
    /// path on this host) or an NBD export's (from its URI), which keep
    /// their identity wherever they are served. `None` for `ram` and
    /// `null`: the controller derives theirs from its serial number.
    fn backend_ids(&self) -> Option<NamespaceIds> {
        match &self.backend {
            Backend::File(path) => Some(host_ids(&format!("file {}", absolute(path).display()))),
            Backend::Nbd(uri) => Some(host_ids(&format!("nbd {uri}"))),
            Backend::Null | Backend::Ram => None,
        }
    }

    /// Its identifiers: the ones chosen, the others its backend's or else `derived`'s. `None`:
    /// leave them to the controller (a `ram` or `null` namespace with no
    /// identifier chosen).
    pub fn ids(&self, derived: impl FnOnce() -> NamespaceIds) -> Option<NamespaceIds> {
        match self.backend_ids() {
            Some(base) => Some(self.ids.apply(base)),
            None if self.ids.is_empty() => None,
            None => Some(self.ids.apply(derived())),
        }
    }

    /// Creates the backend; a file can fail (missing, too small, not
    /// writable, locked by another vnvme), and an NBD export (unreachable,
    /// refused, read-only, too small).
    pub fn open(&self) -> anyhow::Result<Arc<dyn BlockDevice>> {
        Ok(match &self.backend {
            Backend::Null => Arc::new(vnvme_blockdev::NullDevice::new(self.size)),
            Backend::Ram => {
                use anyhow::Context as _;
                let dev = vnvme_blockdev::RamDevice::create(self.size)
                    .context("a ram namespace's memory")?;
                Arc::new(dev.with_volatile_cache(self.volatile_cache))
            }
            Backend::File(path) => {
                let size = (self.size != 0).then_some(self.size);
                Arc::new(vnvme_blockdev::FileDevice::open(path, size)?)
            }
            Backend::Nbd(uri) => {
                let size = (self.size != 0).then_some(self.size);
                Arc::new(vnvme_blockdev::NbdDevice::open(uri, size)?)
            }
        })
    }

    /// The format given, or else for an image (a `file` or `nbd` backend)
    /// the one its partition table was written for, or else the default.
    /// The choice is logged with its reason.
    pub fn format_for(&self, device: &dyn BlockDevice) -> anyhow::Result<u8> {
        let image = match &self.backend {
            Backend::File(path) => path.display().to_string(),
            Backend::Nbd(uri) => uri.clone(),
            Backend::Null | Backend::Ram => return Ok(self.format.unwrap_or(DEFAULT_FORMAT_INDEX)),
        };
        if let Some(index) = self.format {
            return Ok(index);
        }
        let layout = crate::image_format::detect(device).map_err(|e| {
            anyhow::anyhow!(
                "reading the start of {image} to find its sector size: {e} (give format=N to \
                 choose the LBA format)"
            )
        })?;
        let index = layout.format_index();
        let data_size = LBA_FORMATS
            .get(usize::from(index))
            .map_or(0, |f| f.data_size);
        tracing::info!(
            "{image}: {}: LBA format {index} ({data_size}-byte blocks; format=N chooses another)",
            layout.describe()
        );
        Ok(index)
    }

    /// The backend, opened, and the LBA format to serve it in.
    pub fn open_formatted(&self) -> anyhow::Result<(Arc<dyn BlockDevice>, u8)> {
        let device = self.open()?;
        let index = self.format_for(&*device)?;
        Ok((device, index))
    }

    /// The controller's configuration of this namespace as `nsid`, for the
    /// controller with serial number `serial`. A file namespace keeps its
    /// reservations (with PTPL) in `IMAGE.reservations`.
    pub fn config(&self, nsid: u32, serial: &str) -> anyhow::Result<NamespaceConfig> {
        let (device, index) = self.open_formatted()?;
        let mut c = NamespaceConfig::new(nsid, 4096, device)
            .with_format(index)
            .with_readiness(self.readiness)
            .with_attached(self.attached)
            .with_protection(self.protection)
            .with_zoned(self.zoned);
        // A choice of one identifier keeps the others the controller would
        // have derived.
        c.ids = self.ids(|| NamespaceIds::for_controller(serial, nsid));
        if let Backend::File(path) = &self.backend {
            let mut name = path.as_os_str().to_owned();
            name.push(".reservations");
            c.reservation_file = Some(name.into());
        }
        Ok(c)
    }

    /// Checks the size (a non-zero multiple of 4096) and the format index.
    pub fn validate(&self) -> Result<(), String> {
        let file_sized =
            self.size == 0 && matches!(self.backend, Backend::File(_) | Backend::Nbd(_));
        if !file_sized && (self.size < 4096 || !self.size.is_multiple_of(4096)) {
            return Err(format!(
                "namespace size {} must be a non-zero multiple of 4096 bytes",
                self.size
            ));
        }
        if let Some(index) = self.format {
            check_format_index(index)?;
        }
        match self.protection {
            // Protection needs a format with metadata: never an image's.
            Some(_) => check_pi_fits(self.format.unwrap_or(DEFAULT_FORMAT_INDEX)),
            None => Ok(()),
        }
    }
}

/// Protection information needs a format whose metadata holds its tuple.
pub fn check_pi_fits(index: u8) -> Result<(), String> {
    let fits = |f: &vnvme_controller::LbaFormatSpec| f.metadata_size >= f.guard.pi_size();
    if LBA_FORMATS.get(usize::from(index)).is_some_and(fits) {
        return Ok(());
    }
    let list: Vec<String> = (0..)
        .zip(LBA_FORMATS)
        .filter(|(_, f)| fits(f))
        .map(|(i, f)| format!("{i}: {}+{}", f.data_size, f.metadata_size))
        .collect();
    Err(format!(
        "protection information needs a format with metadata (pi= with format={}; formats \
         that hold it: {})",
        index,
        list.join(", ")
    ))
}

/// A PI type: `1`, `2` or `3` (End-to-end Data Protection Type 1 to 3).
pub fn parse_pi_type(text: &str) -> Result<PiType, String> {
    text.parse()
        .ok()
        .and_then(PiType::from_pit)
        .ok_or_else(|| format!("pi '{text}' is not a protection information type: use 1, 2 or 3"))
}

/// Where the PI lies in the metadata: `first` or `last` bytes.
pub fn parse_pil(text: &str) -> Result<bool, String> {
    match text {
        "first" => Ok(true),
        "last" => Ok(false),
        _ => Err(format!(
            "pil '{text}' is not a protection information location: use first or last"
        )),
    }
}

/// An LBA format index must name an entry of [`LBA_FORMATS`].
pub fn check_format_index(index: u8) -> Result<(), String> {
    if usize::from(index) < LBA_FORMATS.len() {
        return Ok(());
    }
    let list: Vec<String> = LBA_FORMATS
        .iter()
        .enumerate()
        .map(|(i, f)| format!("{i}: {}+{}", f.data_size, f.metadata_size))
        .collect();
    Err(format!(
        "LBA format {index} does not exist (formats: {})",
        list.join(", ")
    ))
}

impl FromStr for NamespaceSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = s.split(',');
        let head = parts.next().unwrap_or_default();
        let mut spec = if let Some(path) = head.strip_suffix(":file") {
            if parse_size(path).is_ok() {
                // `1G:file`: a size, not a path (a file named so: `./1G:file`).
                return Err(format!(
                    "'{head}': the file backend needs a path: PATH:file or SIZE:file=PATH"
                ));
            }
            // PATH:file: the size is the file's, known once it is opened.
            NamespaceSpec::new(0, Backend::File(path.into()))
        } else if head.starts_with("nbd=") {
            // nbd=URI: the size is the export's, known once connected.
            NamespaceSpec::new(0, head.parse()?)
        } else {
            let (size, backend) = match head.split_once(':') {
                Some((size, backend)) => (size, backend.parse()?),
                None => (head, Backend::Ram),
            };
            NamespaceSpec::new(parse_size(size)?, backend)
        };
        let (mut pi, mut pil) = (None, None);
        let mut zoned = ZonedOptions::default();
        for option in parts {
            // Only the options the help lists (crate::ns_syntax).
            if !is_option(option) {
                return Err(unknown_option(option));
            }
            if let Some(r) = zoned.take(option) {
                r?;
                continue;
            }
            if let Some(r) = spec.qos.take_ns_option(option) {
                r?;
                continue;
            }
            if let Some(r) = option
                .split_once('=')
                .and_then(|(key, value)| spec.ids.set(key, value))
            {
                r?;
                continue;
            }
            match option.split_once('=') {
                Some(("pi", t)) => pi = Some(parse_pi_type(t)?),
                Some(("pil", l)) => pil = Some(parse_pil(l)?),
                Some(("ready", d)) => spec.readiness = Readiness::After(parse_duration(d)?),
                Some(("format", n)) => {
                    spec.format =
                        Some(n.parse().map_err(|e| {
                            format!("format '{n}' is not an LBA format index: {e}")
                        })?);
                }
                None if option == "never-ready" => spec.readiness = Readiness::Never,
                None if option == "detached" => spec.attached = false,
                None if option == "vwc" => spec.volatile_cache = true,
                // A listed key in another form (`vwc=1`).
                _ => return Err(unknown_option(option)),
            }
        }
        spec.protection = match (pi, pil) {
            (Some(pi_type), first) => Some(Protection {
                pi_type,
                // PIL 0 of Format NVM: the last bytes.
                first: first.unwrap_or(false),
            }),
            (None, Some(_)) => return Err("pil= needs pi=1, 2 or 3".into()),
            (None, None) => None,
        };
        spec.zoned = zoned.build()?;
        if spec.volatile_cache && spec.backend != Backend::Ram {
            return Err(
                "vwc (a volatile write cache that power loss empties) is for ram namespaces".into(),
            );
        }
        spec.validate()?;
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn namespace_specs_parse() {
        assert_eq!(
            "1G:null".parse(),
            Ok(NamespaceSpec::new(1 << 30, Backend::Null))
        );
        assert_eq!(
            "64M".parse(),
            Ok(NamespaceSpec::new(64 << 20, Backend::Ram))
        );
    }

    #[test]
    fn namespace_spec_options_parse() {
        let spec: NamespaceSpec = "1G:null,ready=250ms,detached,format=1".parse().unwrap();
        assert_eq!(spec.size, 1 << 30);
        assert_eq!(spec.backend, Backend::Null);
        assert_eq!(spec.readiness, Readiness::After(Duration::from_millis(250)));
        assert!(!spec.attached);
        assert_eq!(spec.format, Some(1));
        let spec: NamespaceSpec = "64M,never-ready".parse().unwrap();
        assert_eq!(spec.readiness, Readiness::Never);
        assert!(spec.attached);
        assert_eq!(spec.format, None);
        let spec: NamespaceSpec = "64M,vwc".parse().unwrap();
        assert!(spec.volatile_cache);
        assert!("64M:null,vwc".parse::<NamespaceSpec>().is_err());
        let spec: NamespaceSpec = "64M,ready=5s".parse().unwrap();
        assert_eq!(spec.readiness, Readiness::After(Duration::from_secs(5)));
    }

    #[test]
    fn files_have_their_own_ids_and_ram_takes_the_controllers() {
        let file = |p: &str| NamespaceSpec::new(0, Backend::File(p.into())).backend_ids();
        let a = file("/srv/a.img").unwrap();
        assert_eq!(a.shared_with(&file("/srv/b.img").unwrap()), None);
        assert_eq!(file("/srv/a.img"), Some(a));
        assert_eq!(
            NamespaceSpec::new(1 << 20, Backend::Ram).backend_ids(),
            None
        );
        assert_eq!(
            NamespaceSpec::new(1 << 20, Backend::Null).backend_ids(),
            None
        );
    }

    #[test]
    fn chosen_identifiers_replace_the_derived_ones() {
        let spec: NamespaceSpec =
            "64M,nguid=00112233-4455-6677-8899-aabbccddeeff,eui64=02:00:00:00:00:00:00:2a"
                .parse()
                .unwrap();
        let c = spec.config(1, "S").unwrap();
        let ids = c.ids.unwrap();
        assert_eq!(ids.nguid[..3], [0x00, 0x11, 0x22]);
        assert_eq!(ids.eui64, [2, 0, 0, 0, 0, 0, 0, 0x2a]);
        let derived = NamespaceIds::for_controller("S", 1);
        assert_eq!(
            ids.uuid, derived.uuid,
            "the UUID not chosen: the derived one"
        );
        // Nothing chosen on ram: the controller derives them all.
        assert_eq!(
            "64M"
                .parse::<NamespaceSpec>()
                .unwrap()
                .config(1, "S")
                .unwrap()
                .ids,
            None
        );
        let e = "64M,uuid=1234".parse::<NamespaceSpec>().unwrap_err();
        assert!(
            e.contains("uuid '1234' must be 32 hexadecimal digits"),
            "{e}"
        );
    }

    #[test]
    fn protection_options_parse_and_need_metadata() {
        let spec: NamespaceSpec = "1M,format=4,pi=2,pil=first".parse().unwrap();
        let want = Protection {
            pi_type: PiType::Type2,
            first: true,
        };
        assert_eq!(spec.protection, Some(want));
        let c = spec.config(1, "S").unwrap();
        assert_eq!((c.format_index, c.protection), (4, Some(want)));
        let spec: NamespaceSpec = "1M,format=6,pi=3".parse().unwrap();
        assert_eq!(
            spec.protection.map(|p| p.first),
            Some(false),
            "last by default"
        );
        for (bad, says) in [
            ("1M,pi=1", "formats that hold it: 1: 512+8"),
            (
                "1M,format=4,pi=4",
                "pi '4' is not a protection information type",
            ),
            ("1M,format=4,pi=1,pil=middle", "pil 'middle'"),
            ("1M,format=4,pil=first", "pil= needs pi="),
        ] {
            let err = bad.parse::<NamespaceSpec>().unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn namespace_spec_becomes_controller_config() {
        let c = "1M:ram,format=1,detached,ready=1s"
            .parse::<NamespaceSpec>()
            .unwrap()
            .config(7, "S")
            .unwrap();
        assert_eq!((c.nsid, c.lba_size, c.format_index), (7, 512, 1));
        assert!(!c.attached);
        assert_eq!(c.readiness, Readiness::After(Duration::from_secs(1)));
    }

    #[test]
    fn file_namespace_specs_parse() {
        let spec: NamespaceSpec = "/var/lib/ns1.img:file".parse().unwrap();
        assert_eq!(
            spec,
            NamespaceSpec::new(0, Backend::File("/var/lib/ns1.img".into()))
        );
        let spec: NamespaceSpec = "1G:file=/tmp/a:b.img,ready=1s".parse().unwrap();
        assert_eq!(spec.size, 1 << 30);
        assert_eq!(spec.backend, Backend::File("/tmp/a:b.img".into()));
        assert_eq!(spec.readiness, Readiness::After(Duration::from_secs(1)));
        for bad in ["1G:file", "1G:file="] {
            let err = bad.parse::<NamespaceSpec>().unwrap_err();
            assert!(err.contains("PATH:file or SIZE:file=PATH"), "{bad}: {err}");
        }
    }

    #[test]
    fn nbd_namespace_specs_parse() {
        let uri = "nbd+unix:///disk?socket=/run/nbd.sock";
        let spec: NamespaceSpec = format!("nbd={uri},ready=1s").parse().unwrap();
        assert_eq!(spec.size, 0, "the export's size");
        assert_eq!(spec.backend, Backend::Nbd(uri.into()));
        assert_eq!(spec.readiness, Readiness::After(Duration::from_secs(1)));
        let spec: NamespaceSpec = "1G:nbd=nbd://host:10809/vm1".parse().unwrap();
        assert_eq!(spec.size, 1 << 30);
        assert_eq!(spec.backend, Backend::Nbd("nbd://host:10809/vm1".into()));
        for (bad, why) in [
            ("1G:nbd", "needs a URI"),
            ("nbd=/tmp/sock", "no scheme"),
            ("1G:nbd=nbds://h/e", "TLS is not supported"),
        ] {
            let err = bad.parse::<NamespaceSpec>().unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn nbd_namespace_open_errors_name_the_server() {
        let spec: NamespaceSpec = "nbd=nbd+unix:///x?socket=/nonexistent/vnvme.sock"
            .parse()
            .unwrap();
        let err = format!("{:#}", spec.open().unwrap_err());
        assert!(
            err.contains("cannot open NBD export 'x' at /nonexistent/vnvme.sock"),
            "{err}"
        );
    }

    #[test]
    fn file_namespace_open_errors_name_the_path() {
        let spec: NamespaceSpec = "/nonexistent/vnvme-ns.img:file".parse().unwrap();
        let err = format!("{:#}", spec.open().unwrap_err());
        assert!(
            err.contains("/nonexistent/vnvme-ns.img does not exist"),
            "{err}"
        );
    }

    /// A file `name` in a fresh temporary folder, with `head` at its start
    /// and `len` bytes long (no file when `head` is `None`).
    fn image(name: &str, head: Option<&[u8]>, len: u64) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("vnvme-ns-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("disk.img");
        if let Some(head) = head {
            std::fs::write(&path, head).unwrap();
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(len)
                .unwrap();
        }
        path
    }

    fn with_signature(at: usize, signature: &[u8]) -> Vec<u8> {
        let mut head = vec![0u8; 8192];
        head[at..at + signature.len()].copy_from_slice(signature);
        head
    }

    #[test]
    fn a_file_namespace_takes_the_sector_size_of_its_image() {
        let gpt512 = image("gpt512", Some(&with_signature(512, b"EFI PART")), 1 << 20);
        let gpt4k = image("gpt4k", Some(&with_signature(4096, b"EFI PART")), 1 << 20);
        let format_of = |spec: String| {
            let spec: NamespaceSpec = spec.parse().unwrap();
            spec.config(1, "S").unwrap().format_index
        };
        assert_eq!(
            format_of(format!("{}:file", gpt512.display())),
            0,
            "512 + 0"
        );
        assert_eq!(
            format_of(format!("{}:file", gpt4k.display())),
            3,
            "4096 + 0"
        );
        // format= wins over what the image says.
        assert_eq!(format_of(format!("{}:file,format=3", gpt512.display())), 3);
        assert_eq!(format_of(format!("{}:file,format=0", gpt4k.display())), 0);
        // A new file, and a zeroed one: the default.
        let new = image("new", None, 0);
        assert_eq!(
            format_of(format!("1M:file={}", new.display())),
            DEFAULT_FORMAT_INDEX
        );
        assert_eq!(
            format_of(format!("{}:file", new.display())),
            DEFAULT_FORMAT_INDEX
        );
        // ram and null namespaces are never read.
        assert_eq!(format_of("1M:ram".into()), DEFAULT_FORMAT_INDEX);
        for p in [gpt512, gpt4k, new] {
            let _ = std::fs::remove_dir_all(p.parent().unwrap());
        }
    }

    #[test]
    fn a_short_image_is_refused_with_its_size_not_read() {
        // A hostile or truncated image shorter than a sector.
        let short = image("short", Some(b"EFI PART"), 100);
        let spec: NamespaceSpec = format!("{}:file", short.display()).parse().unwrap();
        let err = format!("{:#}", spec.config(1, "S").unwrap_err());
        assert!(err.contains("is 100 bytes"), "{err}");
        let _ = std::fs::remove_dir_all(short.parent().unwrap());
    }

    #[test]
    fn zoned_namespace_specs_parse() {
        let spec: NamespaceSpec = "1G:ram,zoned,zone-size=64M,zone-cap=48M,max-open=4,max-active=6"
            .parse()
            .unwrap();
        let z = spec.zoned.unwrap();
        assert_eq!((z.zone_size, z.zone_capacity), (64 << 20, 48 << 20));
        assert_eq!((z.max_open, z.max_active), (Some(4), Some(6)));
        let z = "256M,max-open=2,zoned"
            .parse::<NamespaceSpec>()
            .unwrap()
            .zoned
            .unwrap();
        assert_eq!(
            (z.zone_size, z.max_open, z.max_active),
            (64 << 20, Some(2), Some(2))
        );
        let c = "256M,zoned,zone-size=1M"
            .parse::<NamespaceSpec>()
            .unwrap()
            .config(2, "S")
            .unwrap();
        assert_eq!(c.zoned.map(|z| z.zone_size), Some(1 << 20));
        assert_eq!("64M".parse::<NamespaceSpec>().unwrap().zoned, None);
        let z = "256M:ram,zoned,zone-size=16M,zone-ext=64"
            .parse::<NamespaceSpec>()
            .unwrap()
            .zoned
            .unwrap();
        assert_eq!(
            (z.extension_size, ZonedConfig::new(1).extension_size),
            (64, 0)
        );
    }

    #[test]
    fn bad_zoned_specs_are_explained() {
        let err = |s: &str| s.parse::<NamespaceSpec>().unwrap_err();
        assert!(err("1G,zone-size=64M").contains("zone-size is for zoned namespaces: add ,zoned"));
        assert!(err("1G,zoned,zone-size=48M").contains("power of two"));
        assert!(err("1G,zoned,zone-cap=128M").contains("zone capacity"));
        assert!(err("1G,zoned,zone-ext=100").contains("multiple of 64"));
        assert!(err("1G,zone-ext=64").contains("add ,zoned"));
        assert!(err("1G,zoned,max-open=5,max-active=4")
            .contains("max-open 5 is more than max-active 4"));
        assert!(err("1G,zoned,max-open=many").contains("max-open=many: not a number"));
    }

    #[test]
    fn bad_namespace_specs_are_explained() {
        assert!("1G:disk"
            .parse::<NamespaceSpec>()
            .unwrap_err()
            .contains("unknown backend"));
        assert!("1000"
            .parse::<NamespaceSpec>()
            .unwrap_err()
            .contains("multiple of 4096"));
        assert!("1G,ready=soon"
            .parse::<NamespaceSpec>()
            .unwrap_err()
            .contains("invalid duration 'soon'"));
        assert!("1G,format=9"
            .parse::<NamespaceSpec>()
            .unwrap_err()
            .contains("LBA format 9 does not exist"));
        assert!("1G,fast"
            .parse::<NamespaceSpec>()
            .unwrap_err()
            .contains("unknown namespace option 'fast'"));
    }
}
