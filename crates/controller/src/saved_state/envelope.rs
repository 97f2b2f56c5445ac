//! The envelope around a saved state's body (docs/state-format.md,
//! "Envelope"): a fixed 32-byte little-endian header, then the body.
//!
//! | bytes  | field                                                  |
//! |--------|--------------------------------------------------------|
//! | 0..8   | magic `VNVMESTA`                                       |
//! | 8..12  | format version (u32)                                   |
//! | 12..16 | header length (u32, 32)                                |
//! | 16..24 | body length in bytes (u64)                             |
//! | 24..32 | CRC-64/NVME of the body (u64)                          |
//!
//! The version is checked before anything else of the body is read: a
//! body of another version is never parsed as this one's.

use super::error::StateError;
use super::StateBody;

pub const MAGIC: [u8; 8] = *b"VNVMESTA";
/// The format this code writes. 2: a namespace's attachment to every
/// controller of the subsystem (`attached_to`) and the subsystem's ANA
/// states (`subsystem.ana`). 3: the completions owed (`queues.owed`,
/// `--supervise`), which a reader of format 2 would drop unseen.
pub const FORMAT_VERSION: u32 = 3;
/// The oldest format this code reads. Formats 1 and 2 need no
/// conversion: a format 2 body is format 3's without `queues.owed` (none
/// owed), a format 1 body also without `attached_to` and `ana`, which
/// read as absent (attached to the saved controller only, as `attached`
/// says; every ANA group optimized), what a format 1 state meant.
pub const OLDEST_READABLE_VERSION: u32 = 1;
pub const HEADER_LEN: usize = 32;

fn checksum(body: &[u8]) -> u64 {
    vnvme_crc::crc64_nvme(body)
}

pub(super) fn encode(body: &StateBody) -> Vec<u8> {
    // Serialising plain structs of numbers, strings and maps cannot fail.
    let json = serde_json::to_vec(body).unwrap_or_default();
    let mut out = Vec::with_capacity(HEADER_LEN + json.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(HEADER_LEN as u32).to_le_bytes());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&checksum(&json).to_le_bytes());
    out.extend_from_slice(&json);
    out
}

fn le<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    bytes
        .get(at..at + N)
        .and_then(|b| b.try_into().ok())
        .unwrap_or([0; N])
}

pub(super) fn decode(bytes: &[u8]) -> Result<StateBody, StateError> {
    if bytes.get(..MAGIC.len()).is_some_and(|m| m != MAGIC) {
        return Err(StateError::BadMagic);
    }
    if bytes.len() < HEADER_LEN {
        return Err(StateError::Truncated {
            len: bytes.len(),
            need: HEADER_LEN,
        });
    }
    let version = u32::from_le_bytes(le(bytes, 8));
    if !(OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(StateError::UnsupportedVersion {
            found: version,
            oldest: OLDEST_READABLE_VERSION,
            newest: FORMAT_VERSION,
        });
    }
    let header_len = u32::from_le_bytes(le(bytes, 12));
    if header_len as usize != HEADER_LEN {
        return Err(StateError::HeaderLength(header_len));
    }
    let declared = u64::from_le_bytes(le(bytes, 16));
    let stored = u64::from_le_bytes(le(bytes, 24));
    let body = bytes.get(HEADER_LEN..).unwrap_or_default();
    if declared != body.len() as u64 {
        return Err(StateError::Length {
            declared,
            actual: body.len() as u64,
        });
    }
    let computed = checksum(body);
    if computed != stored {
        return Err(StateError::Checksum { stored, computed });
    }
    serde_json::from_slice(body).map_err(|source| StateError::Body { version, source })
}
