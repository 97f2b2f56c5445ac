//! Who a served controller and its namespaces are to hosts when the
//! configuration does not say: a serial number (and so a subsystem NQN)
//! and namespace identifiers unique to this server, the same at every
//! start.
//!
//! Hosts tell devices apart by them. Linux keeps one controller per
//! subsystem NQN and CNTLID ("Duplicate cntlid ... rejecting") and clears
//! namespace identifiers it sees twice ("clearing duplicate IDs"), after
//! which `/dev/disk/by-id` may name the wrong disk. So no default is a
//! constant: each is derived from the host's machine-id and what makes a
//! server unique on that host, its socket path; a file namespace's from
//! its file, which keeps its identity wherever it is served.
//! `--serial`, `--nqn` and the namespace options `nguid=`, `eui64=` and
//! `uuid=` override them.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use vnvme_controller::NamespaceIds;

/// Serial numbers are 20 ASCII characters (Identify Controller SN).
const SERIAL_LEN: usize = 20;
/// What a derived serial number starts with; the rest is hexadecimal.
const SERIAL_PREFIX: &str = "VNVME-";

/// Where a controller is served: the part of its default identity that
/// tells it from the host's other controllers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    place: String,
}

impl Origin {
    /// A controller served on the vfio-user socket at `path` (made
    /// absolute, so `./v.sock` and `/run/x/v.sock` are one place).
    pub fn socket(path: &Path) -> Self {
        Self {
            place: format!("socket {}", absolute(path).display()),
        }
    }

    /// The controller of `vnvme bench` and the tools, in the process that
    /// drives it: nothing else on the host sees it.
    pub fn embedded() -> Self {
        Self {
            place: "embedded".into(),
        }
    }

    /// The serial number a controller served here gets by default:
    /// `VNVME-` and 14 hexadecimal digits.
    pub fn serial(&self) -> String {
        let ids = NamespaceIds::from_name(&format!("serial {} {}", machine_id(), self.place));
        let mut serial = SERIAL_PREFIX.to_string();
        for b in ids.uuid {
            if serial.len() >= SERIAL_LEN {
                break;
            }
            serial.push_str(&format!("{b:02X}"));
        }
        serial.truncate(SERIAL_LEN);
        serial
    }
}

/// The identifiers of the namespace named `name` on this host (a file's
/// absolute path, an NBD export's URI): its own wherever it is served.
pub fn host_ids(name: &str) -> NamespaceIds {
    NamespaceIds::from_name(&format!("namespace {} {name}", machine_id()))
}

/// `path` with symbolic links and `..` resolved where it exists (a socket
/// not bound yet: its folder), else as given, made absolute.
pub fn absolute(path: &Path) -> PathBuf {
    if let Ok(p) = path.canonicalize() {
        return p;
    }
    let folder = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    match (folder.canonicalize(), path.file_name()) {
        (Ok(folder), Some(name)) => folder.join(name),
        _ => std::path::absolute(path).unwrap_or_else(|_| path.to_owned()),
    }
}

/// The host's identity: systemd's machine-id (also D-Bus's), else the
/// host name, with a warning, as then two hosts may derive the same
/// identities.
fn machine_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        for file in ["/etc/machine-id", "/var/lib/dbus/machine-id"] {
            if let Ok(text) = std::fs::read_to_string(file) {
                let id = text.trim();
                if !id.is_empty() {
                    return id.to_string();
                }
            }
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        tracing::warn!(
            "no /etc/machine-id: default serial numbers and namespace identifiers derive from the \
             host name '{}' (systemd-machine-id-setup makes one; or give --serial)",
            host.trim()
        );
        format!("hostname {}", host.trim())
    })
}

/// Checks a serial number: 1 to 20 printable ASCII characters.
pub fn parse_serial(text: &str) -> Result<String, String> {
    if text.is_empty()
        || text.len() > SERIAL_LEN
        || !text.bytes().all(|b| (0x20..0x7f).contains(&b))
    {
        return Err(format!(
            "serial '{text}' must be 1 to {SERIAL_LEN} printable ASCII characters"
        ));
    }
    Ok(text.to_string())
}

/// Checks an NVM subsystem NQN: `nqn.` then at most 223 bytes in all of
/// printable ASCII (NVMe Base 2.0 §4.5 NVMe Qualified Names).
pub fn parse_nqn(text: &str) -> Result<String, String> {
    if !text.starts_with("nqn.")
        || text.len() > 223
        || !text.bytes().all(|b| (0x21..0x7f).contains(&b))
    {
        return Err(format!(
            "NQN '{text}' must start with 'nqn.' and be at most 223 printable ASCII characters \
             without spaces, e.g. nqn.2024-01.com.example:disk1"
        ));
    }
    Ok(text.to_string())
}

/// Reads `N` bytes written as `2 * N` hexadecimal digits (dashes and
/// colons between them ignored); zero is refused, as it means "none".
pub fn parse_id<const N: usize>(what: &str, text: &str) -> Result<[u8; N], String> {
    let digits: Vec<u8> = text.bytes().filter(|b| !matches!(b, b'-' | b':')).collect();
    let bad = || {
        format!(
            "{what} '{text}' must be {} hexadecimal digits (dashes allowed), not all zero",
            2 * N
        )
    };
    if digits.len() != 2 * N {
        return Err(bad());
    }
    let nibble = |d: u8| char::from(d).to_digit(16).ok_or_else(bad);
    let mut out = [0u8; N];
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        *byte =
            u8::try_from(nibble(pair[0])? << 4 | nibble(pair[1])?).map_err(|e| e.to_string())?;
    }
    if out == [0; N] {
        return Err(bad());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_socket_gets_its_own_serial_every_time() {
        let a = Origin::socket(Path::new("/run/vnvme/a.sock"));
        let b = Origin::socket(Path::new("/run/vnvme/b.sock"));
        assert_eq!(a.serial(), a.serial());
        assert_ne!(a.serial(), b.serial());
        assert_ne!(a.serial(), Origin::embedded().serial());
        assert_eq!(a.serial().len(), SERIAL_LEN);
        assert!(a.serial().starts_with(SERIAL_PREFIX));
        assert_eq!(parse_serial(&a.serial()), Ok(a.serial()));
    }

    #[test]
    fn a_relative_socket_path_is_the_same_place_as_its_absolute_one() {
        let cwd = std::env::current_dir().unwrap().canonicalize().unwrap();
        assert_eq!(
            Origin::socket(Path::new("v.sock")),
            Origin::socket(&cwd.join("v.sock"))
        );
    }

    #[test]
    fn ids_parse_from_hex_and_zero_or_bad_digits_are_refused() {
        assert_eq!(
            parse_id::<8>("eui64", "02-00-00-00-00-00-00-2a"),
            Ok([2, 0, 0, 0, 0, 0, 0, 0x2a])
        );
        assert_eq!(
            parse_id::<16>("uuid", "5d1e7a2c-3f4b-4e8e-9a61-0c2b7d9fe310").map(|u| u[0]),
            Ok(0x5d)
        );
        for bad in [
            "",
            "00000000000000000000000000000000",
            "5d1e7a2c",
            "zz1e7a2c3f4b4e8e9a610c2b7d9fe310",
        ] {
            let e = parse_id::<16>("nguid", bad).unwrap_err();
            assert!(e.contains("32 hexadecimal digits"), "{e}");
        }
    }

    #[test]
    fn serials_and_nqns_are_checked() {
        assert!(parse_serial("VNVME0001").is_ok());
        assert!(parse_serial("").is_err());
        assert!(parse_serial("123456789012345678901").is_err());
        assert!(parse_serial("caf\u{e9}").is_err());
        assert!(parse_nqn("nqn.2024-01.com.example:disk1").is_ok());
        assert!(parse_nqn("iqn.2024-01.com.example").is_err());
        assert!(parse_nqn(&format!("nqn.{}", "x".repeat(220))).is_err());
    }
}
