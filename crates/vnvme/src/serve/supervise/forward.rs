//! The supervised server's side: forwards to the supervisor every fd a
//! successor would need, as the client's fds change (called between two
//! vfio-user messages by the server loop, only when supervised).

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use parking_lot::Mutex;
use vnvme_device::NvmeDevice;
use vnvme_vfio_user::handover::{ClientChange, ClientParts};

use super::notes::{self, Note};

/// Which file a DMA fd is, as the vfio-user `DmaLedger` tells them apart
/// (a read-only fd cannot stand for a writable one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FileKey {
    dev: u64,
    ino: u64,
    writable: bool,
}

#[derive(Debug, Default)]
struct Sent {
    /// The files the supervisor holds for the client, by the id it knows.
    files: HashMap<FileKey, u64>,
    next_id: u64,
    /// A send failed (the supervisor is gone): nothing more is sent.
    broken: bool,
}

/// The supervisor's socketpair and what was sent on it.
#[derive(Debug)]
pub struct Forwarder {
    sock: OwnedFd,
    sent: Mutex<Sent>,
}

impl Forwarder {
    pub fn new(sock: OwnedFd) -> Self {
        Self {
            sock,
            sent: Mutex::new(Sent::default()),
        }
    }
}

impl crate::upgrade::ClientWatch for Forwarder {
    /// Forwards what `change` changed.
    fn changed(&self, device: &NvmeDevice, change: ClientChange<'_>) {
        let mut sent = self.sent.lock();
        if sent.broken {
            return;
        }
        let result = match change {
            ClientChange::Negotiated(parts) => self.client(&mut sent, device, &parts),
            ClientChange::Maps(parts) => self.files(&mut sent, &parts),
            ClientChange::Irqs => self.irqs(device),
            ClientChange::Gone => {
                sent.files.clear();
                self.send(&Note::Gone, None)
            }
        };
        if let Err(e) = result {
            sent.broken = true;
            tracing::error!(
                "forwarding fds to the supervisor failed: {e}; a crash of this process from \
                 now on loses the client"
            );
        }
    }
}

impl Forwarder {
    fn send(&self, note: &Note, fd: Option<BorrowedFd<'_>>) -> std::io::Result<()> {
        notes::send(self.sock.as_fd(), note, fd)
    }

    fn client(
        &self,
        sent: &mut Sent,
        device: &NvmeDevice,
        parts: &ClientParts<'_>,
    ) -> std::io::Result<()> {
        sent.files.clear();
        self.send(
            &Note::Client {
                max_xfer: parts.max_xfer,
            },
            Some(parts.conn),
        )?;
        if let Some(fd) = device.doorbell_fd() {
            self.send(&Note::Doorbells, Some(fd))?;
        }
        self.files(sent, parts)?;
        self.irqs(device)
    }

    /// Sends the files new since the last call, and drops the ones gone.
    fn files(&self, sent: &mut Sent, parts: &ClientParts<'_>) -> std::io::Result<()> {
        let mut now = HashMap::new();
        for fd in &parts.files {
            let st = rustix::fs::fstat(fd)?;
            let writable = rustix::fs::fcntl_getfl(fd)
                .is_ok_and(|f| f & rustix::fs::OFlags::ACCMODE == rustix::fs::OFlags::RDWR);
            let key = FileKey {
                dev: st.st_dev,
                ino: st.st_ino,
                writable,
            };
            now.insert(key, *fd);
        }
        let gone: Vec<FileKey> = sent
            .files
            .keys()
            .filter(|k| !now.contains_key(k))
            .copied()
            .collect();
        for key in gone {
            if let Some(id) = sent.files.remove(&key) {
                self.send(&Note::DropFile { id }, None)?;
            }
        }
        for (key, fd) in now {
            if sent.files.contains_key(&key) {
                continue;
            }
            let id = sent.next_id;
            sent.next_id += 1;
            self.send(&Note::File { id }, Some(fd))?;
            sent.files.insert(key, id);
        }
        Ok(())
    }

    fn irqs(&self, device: &NvmeDevice) -> std::io::Result<()> {
        let irqs = device.irq_fds()?;
        self.send(&Note::IrqsCleared, None)?;
        for (index, fd) in irqs.vectors.iter().enumerate() {
            if let Some(fd) = fd {
                self.send(&Note::Vector { index }, Some(fd.as_fd()))?;
            }
        }
        if let Some(fd) = &irqs.intx {
            self.send(&Note::Intx, Some(fd.as_fd()))?;
        }
        Ok(())
    }
}
