//! Maps without an fd: DMA_READ/DMA_WRITE round trips to the client, each
//! at most `max_xfer` bytes and bounded by [`REMOTE_DMA_TIMEOUT`].

use std::time::Instant;

use zerocopy::IntoBytes;

use vnvme_memory::GuestAddress;

use super::{DmaError, REMOTE_DMA_TIMEOUT};
use crate::conn::{Conn, Wanted};
use crate::wire::{cmd, flags, read_prefix, DmaAccess, Header};

/// One DMA_READ round trip for `buf.len() <= max_xfer` bytes.
pub(super) fn remote_read(conn: &Conn, addr: u64, buf: &mut [u8]) -> Result<(), DmaError> {
    let fail = DmaError::Unmapped {
        addr: GuestAddress(addr),
        len: buf.len() as u64,
    };
    let req = DmaAccess {
        address: addr,
        count: buf.len() as u64,
    };
    let reply = remote_call(conn, cmd::DMA_READ, &[req.as_bytes()], fail)?;
    let data = reply.get(size_of::<DmaAccess>()..).ok_or(fail)?;
    let data = data.get(..buf.len()).ok_or(fail)?;
    buf.copy_from_slice(data);
    Ok(())
}

/// One DMA_WRITE round trip for `data.len() <= max_xfer` bytes.
pub(super) fn remote_write(conn: &Conn, addr: u64, data: &[u8]) -> Result<(), DmaError> {
    let fail = DmaError::Unmapped {
        addr: GuestAddress(addr),
        len: data.len() as u64,
    };
    let req = DmaAccess {
        address: addr,
        count: data.len() as u64,
    };
    // QEMU replies with the header only; libvfio-user echoes address/count.
    remote_call(conn, cmd::DMA_WRITE, &[req.as_bytes(), data], fail).map(|_| ())
}

fn remote_call(
    conn: &Conn,
    command: u16,
    parts: &[&[u8]],
    fail: DmaError,
) -> Result<Vec<u8>, DmaError> {
    let msg_id = conn.next_msg_id();
    let header = Header {
        msg_id,
        command,
        msg_size: 0,
        flags: flags::TYPE_COMMAND,
        error: 0,
    };
    conn.expect_reply(msg_id);
    if let Err(e) = conn.send(&header, parts, &[]) {
        conn.forget_reply(msg_id);
        tracing::debug!(error = %e, command, "sending a DMA request failed");
        return Err(fail);
    }
    let deadline = Instant::now() + REMOTE_DMA_TIMEOUT;
    match conn.wait(&Wanted::Reply(msg_id), Some(deadline)) {
        Ok(Some(reply)) => {
            if reply.header.is_error() {
                tracing::debug!(
                    command,
                    errno = reply.header.error,
                    "client failed a DMA request"
                );
                return match reply.header.error as i32 {
                    libc::EPERM | libc::EACCES => match fail {
                        DmaError::Unmapped { addr, len }
                        | DmaError::Permission { addr, len }
                        | DmaError::Broken { addr, len } => Err(DmaError::Permission { addr, len }),
                    },
                    _ => Err(fail),
                };
            }
            if read_prefix::<DmaAccess>(&reply.payload).is_none() && command == cmd::DMA_READ {
                return Err(fail);
            }
            Ok(reply.payload)
        }
        Ok(None) => {
            conn.forget_reply(msg_id);
            tracing::warn!(command, "client did not answer a DMA request in time");
            Err(fail)
        }
        Err(e) => {
            conn.forget_reply(msg_id);
            tracing::debug!(error = %e, command, "DMA request failed");
            Err(fail)
        }
    }
}
