//! The NBD wire protocol, as far as vnvme speaks it (nbd's `doc/proto.md`):
//! the fixed newstyle handshake with `NBD_OPT_GO`, and the transmission
//! phase with simple replies only (structured replies are never asked
//! for, so a server must not send them).
//!
//! Everything here reads from a server that may be wrong or hostile: each
//! length it sends is checked against a bound before anything is
//! allocated, and every surprise is a [`ProtocolError`] naming what was
//! wrong, never a panic.

use std::io::{self, Read, Write};

/// "NBDMAGIC", the first eight bytes a server sends.
const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": a newstyle server's second magic, and every option's.
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of an option reply.
const REP_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub(super) const REQUEST_MAGIC: u32 = 0x2560_9513;
pub(super) const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// Handshake flags (server) and client flags.
const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
const FLAG_NO_ZEROES: u16 = 1 << 1;
const CLIENT_FIXED_NEWSTYLE: u32 = 1 << 0;
const CLIENT_NO_ZEROES: u32 = 1 << 1;

// Options and replies.
const OPT_ABORT: u32 = 2;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const REP_ERR_BIT: u32 = 1 << 31;
const INFO_EXPORT: u16 = 0;
const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flags of an export.
pub(super) mod tflag {
    pub const READ_ONLY: u16 = 1 << 1;
    pub const SEND_FLUSH: u16 = 1 << 2;
    pub const SEND_FUA: u16 = 1 << 3;
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
}

/// Command types and flags of the transmission phase.
pub(super) mod cmd {
    pub const READ: u16 = 0;
    pub const WRITE: u16 = 1;
    pub const DISC: u16 = 2;
    pub const FLUSH: u16 = 3;
    pub const WRITE_ZEROES: u16 = 6;
    pub const FLAG_FUA: u16 = 1 << 0;
}

/// Bytes of an option reply's payload vnvme reads at most: an export's
/// information is 12 bytes, an error message a line of text. A longer one
/// is a broken or hostile server.
const MAX_OPTION_REPLY: u32 = 64 << 10;

/// Option replies to `NBD_OPT_GO` read at most before `NBD_REP_ACK`: a
/// server that streams information forever never gets the export.
const MAX_OPTION_REPLIES: usize = 64;

/// Largest payload of one read or write when the server states none: the
/// protocol says a client should not exceed 32 MiB then.
pub(super) const DEFAULT_MAX_PAYLOAD: u32 = 32 << 20;

/// What a server did that the protocol does not allow.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("transport failed")]
    Io(#[source] io::Error),
    #[error("it is not an NBD server (greeting {0:#018x})")]
    NotNbd(u64),
    #[error(
        "it speaks only the oldstyle or non-fixed newstyle handshake, which vnvme does not support"
    )]
    OldStyle,
    #[error("option reply with bad magic {0:#018x}")]
    BadReplyMagic(u64),
    #[error("option reply for option {got}, expected {expected}")]
    WrongOption { got: u32, expected: u32 },
    #[error("option reply of {0} bytes, more than the {MAX_OPTION_REPLY} allowed")]
    ReplyTooLong(u32),
    #[error("malformed reply: {0}")]
    Malformed(&'static str),
    #[error("more than {MAX_OPTION_REPLIES} option replies without an acknowledgement")]
    TooManyReplies,
    #[error("export '{export}' refused ({reason}){message}")]
    Refused {
        export: String,
        reason: &'static str,
        message: String,
    },
    #[error("no export information before the acknowledgement")]
    NoExportInfo,
    #[error("reply with bad magic {0:#010x}")]
    BadMagic(u32),
    #[error("structured reply, which vnvme never asked for")]
    Structured,
    #[error("reply to cookie {0:#x}, which no request in flight has")]
    UnknownCookie(u64),
}

impl From<io::Error> for ProtocolError {
    fn from(e: io::Error) -> Self {
        ProtocolError::Io(e)
    }
}

/// What `NBD_OPT_GO` told about the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportInfo {
    /// Bytes.
    pub size: u64,
    /// Transmission flags ([`tflag`]).
    pub flags: u16,
    /// Largest read or write payload the server accepts.
    pub max_payload: u32,
}

impl ExportInfo {
    pub fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }
}

fn read_u16(r: &mut impl Read) -> io::Result<u16> {
    let mut b = [0; 2];
    r.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

/// Runs the fixed newstyle handshake on `stream` and enters the
/// transmission phase of `export`.
pub fn handshake(
    stream: &mut (impl Read + Write),
    export: &str,
) -> Result<ExportInfo, ProtocolError> {
    let magic = read_u64(stream)?;
    if magic != NBD_MAGIC {
        return Err(ProtocolError::NotNbd(magic));
    }
    if read_u64(stream)? != IHAVEOPT {
        return Err(ProtocolError::OldStyle);
    }
    let server_flags = read_u16(stream)?;
    if server_flags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(ProtocolError::OldStyle);
    }
    let mut client_flags = CLIENT_FIXED_NEWSTYLE;
    if server_flags & FLAG_NO_ZEROES != 0 {
        client_flags |= CLIENT_NO_ZEROES;
    }
    stream.write_all(&client_flags.to_be_bytes())?;
    stream.write_all(&go_option(export))?;
    stream.flush()?;
    let result = read_go_replies(stream, export);
    if matches!(result, Err(ProtocolError::Refused { .. })) {
        // Leave politely: the server may log an abrupt close as an error.
        let _ = stream.write_all(&option_header(OPT_ABORT, 0));
    }
    result
}

fn option_header(option: u32, len: u32) -> [u8; 16] {
    let mut h = [0; 16];
    h[..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
    h[8..12].copy_from_slice(&option.to_be_bytes());
    h[12..].copy_from_slice(&len.to_be_bytes());
    h
}

/// `NBD_OPT_GO` for `export`, asking for its block size limits too.
fn go_option(export: &str) -> Vec<u8> {
    let name = export.as_bytes();
    // The URI parser bounds export names far below 4 GiB.
    let name_len = u32::try_from(name.len()).unwrap_or(u32::MAX);
    let mut body = Vec::with_capacity(name.len() + 8);
    body.extend_from_slice(&name_len.to_be_bytes());
    body.extend_from_slice(name);
    body.extend_from_slice(&1u16.to_be_bytes());
    body.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    let body_len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    let mut msg = option_header(OPT_GO, body_len).to_vec();
    msg.extend_from_slice(&body);
    msg
}

fn read_go_replies(r: &mut impl Read, export: &str) -> Result<ExportInfo, ProtocolError> {
    let mut export_info: Option<(u64, u16)> = None;
    let mut max_payload = DEFAULT_MAX_PAYLOAD;
    for _ in 0..MAX_OPTION_REPLIES {
        let magic = read_u64(r)?;
        if magic != REP_MAGIC {
            return Err(ProtocolError::BadReplyMagic(magic));
        }
        let option = read_u32(r)?;
        if option != OPT_GO {
            return Err(ProtocolError::WrongOption {
                got: option,
                expected: OPT_GO,
            });
        }
        let kind = read_u32(r)?;
        let len = read_u32(r)?;
        if len > MAX_OPTION_REPLY {
            return Err(ProtocolError::ReplyTooLong(len));
        }
        let mut payload = vec![0; len as usize];
        r.read_exact(&mut payload)?;
        match kind {
            REP_ACK => {
                let (size, flags) = export_info.ok_or(ProtocolError::NoExportInfo)?;
                return Ok(ExportInfo {
                    size,
                    flags,
                    max_payload,
                });
            }
            REP_INFO => match parse_info(&payload)? {
                Info::Export { size, flags } => export_info = Some((size, flags)),
                Info::BlockSize { max } => max_payload = max.min(DEFAULT_MAX_PAYLOAD),
                Info::Other => {}
            },
            k if k & REP_ERR_BIT != 0 => {
                return Err(ProtocolError::Refused {
                    export: export.to_owned(),
                    reason: refusal_reason(k),
                    message: refusal_message(&payload),
                })
            }
            // Unknown non-error replies may be ignored (proto.md).
            _ => {}
        }
    }
    Err(ProtocolError::TooManyReplies)
}

enum Info {
    Export { size: u64, flags: u16 },
    BlockSize { max: u32 },
    Other,
}

fn parse_info(p: &[u8]) -> Result<Info, ProtocolError> {
    let field = |at: usize, len: usize| {
        p.get(at..at + len)
            .ok_or(ProtocolError::Malformed("information reply too short"))
    };
    let kind = u16::from_be_bytes(field(0, 2)?.try_into().unwrap_or_default());
    Ok(match kind {
        INFO_EXPORT => Info::Export {
            size: u64::from_be_bytes(field(2, 8)?.try_into().unwrap_or_default()),
            flags: u16::from_be_bytes(field(10, 2)?.try_into().unwrap_or_default()),
        },
        INFO_BLOCK_SIZE => {
            let max = u32::from_be_bytes(field(10, 4)?.try_into().unwrap_or_default());
            if max < 4096 {
                return Err(ProtocolError::Malformed(
                    "maximum block size below 4096 bytes, the largest LBA size",
                ));
            }
            Info::BlockSize { max }
        }
        _ => Info::Other,
    })
}

fn refusal_reason(kind: u32) -> &'static str {
    match kind & !REP_ERR_BIT {
        1 => "option unsupported: the server needs NBD_OPT_GO (nbd 3.15, qemu 2.11, nbdkit 1.2 or newer)",
        2 => "forbidden by the server's policy",
        3 => "invalid request",
        5 => "the server requires TLS, which vnvme does not speak",
        6 => "no such export: check the export name in the URI",
        7 => "the server is shutting down",
        8 => "the server requires block size negotiation",
        _ => "error",
    }
}

/// The server's message, as text fit for a log line.
fn refusal_message(payload: &[u8]) -> String {
    let text: String = String::from_utf8_lossy(payload)
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    if text.is_empty() {
        String::new()
    } else {
        format!(": {text}")
    }
}

/// The 28-byte header of a request.
pub(super) fn request(kind: u16, flags: u16, cookie: u64, offset: u64, len: u32) -> [u8; 28] {
    let mut h = [0; 28];
    h[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    h[4..6].copy_from_slice(&flags.to_be_bytes());
    h[6..8].copy_from_slice(&kind.to_be_bytes());
    h[8..16].copy_from_slice(&cookie.to_be_bytes());
    h[16..24].copy_from_slice(&offset.to_be_bytes());
    h[24..].copy_from_slice(&len.to_be_bytes());
    h
}

/// A simple reply's header: the error (0 for success) and the cookie.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Reply {
    pub error: u32,
    pub cookie: u64,
}

pub(super) fn parse_reply(h: &[u8; 16]) -> Result<Reply, ProtocolError> {
    let word = |at: usize| u32::from_be_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
    match word(0) {
        SIMPLE_REPLY_MAGIC => Ok(Reply {
            error: word(4),
            cookie: (u64::from(word(8)) << 32) | u64::from(word(12)),
        }),
        STRUCTURED_REPLY_MAGIC => Err(ProtocolError::Structured),
        magic => Err(ProtocolError::BadMagic(magic)),
    }
}

/// An NBD error number as an I/O error. The protocol's values are Linux
/// errno values; an unknown one stays a number.
pub(super) fn reply_error(error: u32) -> io::Error {
    match i32::try_from(error) {
        Ok(e @ (1 | 5 | 12 | 22 | 28 | 75 | 95 | 108)) => io::Error::from_raw_os_error(e),
        _ => io::Error::other(format!("NBD server answered error {error}")),
    }
}
