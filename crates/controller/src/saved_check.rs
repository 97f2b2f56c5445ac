//! Why a part of a saved controller state (docs/state-format.md) cannot
//! be restored: a value out of its range, one that differs from what the
//! configuration gives, or parts that contradict each other. Every part's
//! `restore` checks its own values with these before it changes anything
//! a worker could see, so a corrupt or hostile state is refused, never
//! applied in part or allowed to panic.

/// A saved state's values do not fit this controller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidState {
    #[error("{what} is {value}, out of range (at most {max})")]
    OutOfRange { what: String, value: u64, max: u64 },
    #[error("{what} was {saved} when saved, the configuration gives {configured}")]
    Mismatch {
        what: String,
        saved: String,
        configured: String,
    },
    #[error("{0}")]
    Inconsistent(String),
}

/// `value` if it is at most `max`, else [`InvalidState::OutOfRange`].
pub(crate) fn at_most(what: impl Into<String>, value: u64, max: u64) -> Result<u64, InvalidState> {
    if value <= max {
        Ok(value)
    } else {
        Err(InvalidState::OutOfRange {
            what: what.into(),
            value,
            max,
        })
    }
}

/// Ok if `saved == configured`, else [`InvalidState::Mismatch`].
pub(crate) fn same<T: PartialEq + std::fmt::Debug>(
    what: impl Into<String>,
    saved: T,
    configured: T,
) -> Result<(), InvalidState> {
    if saved == configured {
        Ok(())
    } else {
        Err(InvalidState::Mismatch {
            what: what.into(),
            saved: format!("{saved:?}"),
            configured: format!("{configured:?}"),
        })
    }
}

/// [`InvalidState::Inconsistent`] from a sentence.
pub(crate) fn inconsistent(why: impl Into<String>) -> InvalidState {
    InvalidState::Inconsistent(why.into())
}

/// Bytes as one lower-case hexadecimal string in the saved form (log
/// entries, captures, host identifiers): half the size of a JSON array of
/// numbers and readable next to a hex dump. `#[serde(with = "hex")]`.
pub(crate) mod hex {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        let mut out = String::with_capacity(bytes.len() * 2);
        for b in bytes {
            out.push_str(&format!("{b:02x}"));
        }
        s.serialize_str(&out)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        if !s.len().is_multiple_of(2) {
            return Err(D::Error::custom("a hex string of odd length"));
        }
        (0..s.len())
            .step_by(2)
            .map(|i| {
                s.get(i..i + 2)
                    .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                    .ok_or_else(|| D::Error::custom("a non-hex digit in a hex string"))
            })
            .collect()
    }
}

/// `bytes` as a fixed-size array, or [`InvalidState::Mismatch`] naming
/// `what` if its length differs.
pub(crate) fn array<const N: usize>(what: &str, bytes: &[u8]) -> Result<[u8; N], InvalidState> {
    // TryFromSliceError carries nothing: the lengths below say what was wrong.
    <[u8; N]>::try_from(bytes).map_err(|_| InvalidState::Mismatch {
        what: format!("the length of {what}"),
        saved: bytes.len().to_string(),
        configured: N.to_string(),
    })
}

/// `bytes` read as a `T` (a log entry, a feature's data structure), or
/// [`InvalidState::Mismatch`] naming `what` if the length differs.
pub(crate) fn record<T: zerocopy::FromBytes>(what: &str, bytes: &[u8]) -> Result<T, InvalidState> {
    // zerocopy's size error says only that the length is wrong: the
    // lengths below say by how much.
    T::read_from_bytes(bytes).map_err(|_| InvalidState::Mismatch {
        what: format!("the length of {what}"),
        saved: bytes.len().to_string(),
        configured: std::mem::size_of::<T>().to_string(),
    })
}
