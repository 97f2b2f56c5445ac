//! NBD URIs, as libnbd and qemu write them (the NBD URI standard,
//! nbd's `doc/uri.md`): `nbd://HOST[:PORT][/EXPORT]` over TCP and
//! `nbd+unix:///[EXPORT]?socket=PATH` over a UNIX socket. TLS (`nbds`)
//! and vsock are refused with a reason.

use std::fmt;
use std::path::PathBuf;

/// The IANA port of NBD.
pub const DEFAULT_PORT: u16 = 10809;

/// Longest export name accepted (the protocol allows 4 KiB).
const MAX_EXPORT_NAME: usize = 4096;

/// Where an NBD server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// A host name or address and a port.
    Tcp { host: String, port: u16 },
    /// A UNIX socket.
    Unix(PathBuf),
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Tcp { host, port } if host.contains(':') => write!(f, "[{host}]:{port}"),
            Address::Tcp { host, port } => write!(f, "{host}:{port}"),
            Address::Unix(path) => write!(f, "{}", path.display()),
        }
    }
}

/// A parsed NBD URI: the server and the export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdUri {
    pub address: Address,
    pub export: String,
}

/// Why a string is not an NBD URI vnvme can use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{uri}' is not a usable NBD URI: {reason} (use nbd://HOST[:PORT]/EXPORT or nbd+unix:///EXPORT?socket=PATH)")]
pub struct UriError {
    pub uri: String,
    pub reason: String,
}

impl std::str::FromStr for NbdUri {
    type Err = UriError;

    fn from_str(uri: &str) -> Result<Self, UriError> {
        parse(uri).map_err(|reason| UriError {
            uri: uri.to_owned(),
            reason,
        })
    }
}

fn parse(uri: &str) -> Result<NbdUri, String> {
    let (scheme, rest) = uri.split_once("://").ok_or("it has no scheme".to_owned())?;
    let (authority_path, query) = match rest.split_once('?') {
        Some((a, q)) => (a, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match authority_path.find('/') {
        Some(at) => authority_path.split_at(at),
        None => (authority_path, ""),
    };
    let export = decode(path.strip_prefix('/').unwrap_or(path))?;
    if export.len() > MAX_EXPORT_NAME {
        return Err(format!(
            "the export name is longer than {MAX_EXPORT_NAME} bytes"
        ));
    }
    let mut socket = None;
    for pair in query.into_iter().flat_map(|q| q.split('&')) {
        match pair.split_once('=') {
            Some(("socket", path)) if !path.is_empty() => socket = Some(decode(path)?),
            _ => return Err(format!("unknown query parameter '{pair}'")),
        }
    }
    let address = match scheme {
        "nbd" => {
            if socket.is_some() {
                return Err("socket= is for nbd+unix://".into());
            }
            tcp_address(authority)?
        }
        "nbd+unix" => {
            if !authority.is_empty() {
                return Err("nbd+unix:// takes no host: nbd+unix:///EXPORT?socket=PATH".into());
            }
            Address::Unix(
                socket
                    .ok_or("nbd+unix:// needs ?socket=PATH".to_owned())?
                    .into(),
            )
        }
        "nbds" | "nbds+unix" => {
            return Err("TLS is not supported: use nbd:// on a trusted network, or nbd+unix://, or a TLS tunnel".into())
        }
        other => return Err(format!("unsupported scheme '{other}'")),
    };
    Ok(NbdUri { address, export })
}

fn tcp_address(authority: &str) -> Result<Address, String> {
    // Credentials (user@) mean nothing to NBD.
    if authority.contains('@') {
        return Err("a user name is not allowed".into());
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or("unclosed '[' in the host".to_owned())?;
        (host, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err("nbd:// needs a host".into());
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p
            .parse()
            .ok()
            .filter(|&p| p != 0)
            .ok_or(format!("port '{p}' is not a number from 1 to 65535"))?,
    };
    Ok(Address::Tcp {
        host: host.to_owned(),
        port,
    })
}

/// Percent-decoding of a URI component.
fn decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or(format!("bad percent escape in '{s}'"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out)
        .map_err(|e| format!("'{s}' decodes to invalid UTF-8: {}", e.utf8_error()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(host: &str, port: u16, export: &str) -> NbdUri {
        NbdUri {
            address: Address::Tcp {
                host: host.into(),
                port,
            },
            export: export.into(),
        }
    }

    #[test]
    fn tcp_uris_parse_with_default_port_and_export() {
        assert_eq!("nbd://h".parse(), Ok(tcp("h", 10809, "")));
        assert_eq!("nbd://h:1234/disk".parse(), Ok(tcp("h", 1234, "disk")));
        assert_eq!("nbd://[::1]:99/a%20b".parse(), Ok(tcp("::1", 99, "a b")));
        assert_eq!(
            "nbd://10.0.0.1/x/y".parse(),
            Ok(tcp("10.0.0.1", 10809, "x/y"))
        );
    }

    #[test]
    fn unix_uris_need_a_socket() {
        let u: NbdUri = "nbd+unix:///disk?socket=/run/nbd.sock".parse().unwrap();
        assert_eq!(u.address, Address::Unix("/run/nbd.sock".into()));
        assert_eq!(u.export, "disk");
        let u: NbdUri = "nbd+unix://?socket=/tmp/s".parse().unwrap();
        assert_eq!(u.export, "");
        assert!("nbd+unix:///disk"
            .parse::<NbdUri>()
            .unwrap_err()
            .reason
            .contains("needs ?socket=PATH"));
    }

    #[test]
    fn bad_uris_are_explained() {
        for (bad, why) in [
            ("/tmp/sock", "no scheme"),
            ("nbds://h/e", "TLS is not supported"),
            ("http://h/e", "unsupported scheme 'http'"),
            ("nbd://h:0/e", "port '0'"),
            ("nbd://h:99999/e", "port '99999'"),
            ("nbd://:1/e", "needs a host"),
            ("nbd://h/e?socket=/s", "socket= is for nbd+unix"),
            ("nbd+unix://h/e?socket=/s", "takes no host"),
            ("nbd://h/e?tls=on", "unknown query parameter"),
            ("nbd://h/%zz", "bad percent escape"),
            ("nbd://u@h/e", "user name"),
        ] {
            let err = bad.parse::<NbdUri>().unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
            assert!(err.contains("nbd+unix:///EXPORT?socket=PATH"), "{err}");
        }
    }
}
