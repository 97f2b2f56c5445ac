//! The capabilities a peer announces in its VERSION message (the JSON
//! after the version numbers), read leniently: unknown fields are ignored,
//! known ones must have their type.

use crate::conn::MAX_DATA_XFER_SIZE;
use crate::Errno;

/// The capabilities we use from a VERSION message.
#[derive(Debug)]
pub(crate) struct PeerCaps {
    pub max_msg_fds: usize,
    pub max_data_xfer_size: usize,
}

/// Parses the optional NUL-terminated JSON of a VERSION message. Unknown
/// fields are ignored; malformed JSON, a missing NUL or a known field of the
/// wrong type is EINVAL.
pub(crate) fn parse_version_caps(data: &[u8]) -> Result<PeerCaps, Errno> {
    let mut caps = PeerCaps {
        max_msg_fds: 1,
        max_data_xfer_size: MAX_DATA_XFER_SIZE,
    };
    if data.is_empty() {
        return Ok(caps);
    }
    let nul = data.iter().position(|b| *b == 0).ok_or(libc::EINVAL)?;
    let json = &data[..nul];
    if json.is_empty() {
        return Ok(caps);
    }
    let v: serde_json::Value = serde_json::from_slice(json).map_err(|e| {
        // The peer gets EINVAL; the parser's reason stays here. Debug, not
        // warn: a hostile peer would choose what to log.
        tracing::debug!("VERSION capabilities are not JSON: {e}");
        libc::EINVAL
    })?;
    let obj = v.as_object().ok_or(libc::EINVAL)?;
    let Some(c) = obj.get("capabilities") else {
        return Ok(caps);
    };
    let c = c.as_object().ok_or(libc::EINVAL)?;
    let number = |name: &str| -> Result<Option<u64>, Errno> {
        match c.get(name) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or(libc::EINVAL),
        }
    };
    if let Some(n) = number("max_msg_fds")? {
        caps.max_msg_fds = usize::try_from(n).unwrap_or(usize::MAX);
    }
    if let Some(n) = number("max_data_xfer_size")? {
        if n == 0 {
            return Err(libc::EINVAL);
        }
        caps.max_data_xfer_size = usize::try_from(n)
            .unwrap_or(usize::MAX)
            .min(MAX_DATA_XFER_SIZE);
    }
    number("pgsizes")?;
    number("max_dma_maps")?;
    if let Some(m) = c.get("migration") {
        m.as_object().ok_or(libc::EINVAL)?;
    }
    if let Some(w) = c.get("write_multiple") {
        w.as_bool().ok_or(libc::EINVAL)?;
    }
    Ok(caps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_caps_parse_leniently() {
        let ok = br#"{"capabilities":{"max_msg_fds":16,"max_data_xfer_size":4096,"pgsizes":4096,"max_dma_maps":65535,"migration":{"pgsize":4096},"write_multiple":true,"other":[1]}}"#;
        let mut v = ok.to_vec();
        v.push(0);
        let caps = parse_version_caps(&v).unwrap();
        assert_eq!(caps.max_msg_fds, 16);
        assert_eq!(caps.max_data_xfer_size, 4096);
        assert!(parse_version_caps(b"").is_ok());
        assert!(parse_version_caps(b"\0").is_ok());
        assert!(parse_version_caps(b"{}\0").is_ok());
    }

    #[test]
    fn version_caps_reject_malformed() {
        assert_eq!(
            parse_version_caps(b"{}").unwrap_err(),
            libc::EINVAL,
            "no NUL"
        );
        assert_eq!(parse_version_caps(b"{\0").unwrap_err(), libc::EINVAL);
        assert_eq!(parse_version_caps(b"[1]\0").unwrap_err(), libc::EINVAL);
        assert_eq!(
            parse_version_caps(b"{\"capabilities\":3}\0").unwrap_err(),
            libc::EINVAL
        );
        assert_eq!(
            parse_version_caps(b"{\"capabilities\":{\"max_msg_fds\":\"x\"}}\0").unwrap_err(),
            libc::EINVAL
        );
        assert_eq!(parse_version_caps(b"\xff\xfe\0").unwrap_err(), libc::EINVAL);
    }
}
