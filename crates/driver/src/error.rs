//! Driver errors.

use std::time::Duration;

use vnvme_spec::{AdminOpcode, NvmOpcode, Status};

use crate::access::AccessError;
use crate::prp::PrpError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("device access failed")]
    Access(#[from] AccessError),
    #[error("controller did not {what} within {timeout:?}")]
    ReadyTimeout {
        what: &'static str,
        timeout: Duration,
    },
    #[error("controller fatal status (CSTS.CFS) set while waiting to {0}")]
    ControllerFatal(&'static str),
    #[error("controller is not supported: {0}")]
    Unsupported(String),
    #[error("admin command {opcode} failed: {status}")]
    AdminCommand { opcode: AdminOpcode, status: Status },
    #[error("I/O command {opcode} on queue {qid} failed: {status}")]
    IoCommand {
        qid: u16,
        opcode: NvmOpcode,
        status: Status,
    },
    #[error("{what} (queue {qid}, command {cid}) timed out after {timeout:?}")]
    CommandTimeout {
        what: String,
        qid: u16,
        cid: u16,
        timeout: Duration,
    },
    #[error("no completion on queue {qid} within {timeout:?}")]
    WaitTimeout { qid: u16, timeout: Duration },
    #[error("queue {0} has no free command slot")]
    QueueFull(u16),
    #[error("building the data pointer")]
    Prp(#[from] PrpError),
    #[error("transfer of {len} bytes does not fit a {buffer}-byte buffer")]
    BufferTooSmall { len: usize, buffer: usize },
    #[error("transfer of {len} bytes exceeds the controller's maximum of {max} bytes (MDTS)")]
    TransferTooLarge { len: usize, max: usize },
    #[error("opcode {opcode:#04x} transfers {expected}, but the buffer is for {given}")]
    WrongDirection {
        opcode: u8,
        expected: &'static str,
        given: &'static str,
    },
    #[error("registered buffer {index} does not exist ({count} registered)")]
    NoSuchBuffer { index: usize, count: usize },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("namespace {0} is not active or was skipped at initialisation")]
    NoSuchNamespace(u32),
    #[error("I/O queue {0} does not exist")]
    NoSuchQueue(u16),
    #[error("I/O queue {0} was already taken")]
    QueueTaken(u16),
    #[error("I/O queue {0} belongs to a controller instance that has been reset")]
    StaleQueue(u16),
    #[error("protection information check failed")]
    Protection(#[from] crate::pi::PiError),
    #[error("waiting for an interrupt")]
    Interrupt(#[source] std::io::Error),
}

impl Error {
    /// The NVMe status, if the device completed the command with an error.
    pub fn status(&self) -> Option<Status> {
        match self {
            Error::AdminCommand { status, .. } | Error::IoCommand { status, .. } => Some(*status),
            _ => None,
        }
    }
}
