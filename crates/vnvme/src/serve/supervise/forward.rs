//! The supervised server's side: forwards to the supervisor every fd a
//! successor would need, as the client's fds change (called between two
//! vfio-user messages by the server loop, only when supervised).

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use vnvme_blockdev::BlockDevice;
use vnvme_device::NvmeDevice;
use vnvme_vfio_user::handover::{ClientChange, ClientParts, Marked};

use super::keeper::{Keeper, SlotClient};
use super::notes::{self, Note};
use crate::upgrade::manifest::{HandedCrash, HandedSocket, Manifest};
use crate::upgrade::SuccessorEvent;

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
    /// The serial of the client this process adopted (restored after a
    /// crash, or handed over by an upgrade), which it keeps: the slots
    /// written before its first checkpoint are this client's.
    adopted: Option<u64>,
}

/// The supervisor's socketpair and what was sent on it, and the crash
/// area's keeper.
#[derive(Debug)]
pub struct Forwarder {
    sock: OwnedFd,
    sent: Mutex<Sent>,
    keeper: Option<Arc<Keeper>>,
    /// The crash area's memfd, for an upgrade's new process.
    area: Option<OwnedFd>,
    /// The supervisor's pid, for an upgrade's new process.
    supervisor_pid: u32,
}

impl Forwarder {
    /// Forwards on `sock` to the supervisor `supervisor_pid`; keeps the
    /// crash state in `area` with `keeper` (absent: a supervisor that made
    /// no crash area); `adopted`: the serial of the client adopted, if any.
    pub fn new(
        sock: OwnedFd,
        keeper: Option<(Arc<Keeper>, OwnedFd)>,
        supervisor_pid: u32,
        adopted: Option<u64>,
    ) -> Self {
        let (keeper, area) = keeper.unzip();
        Self {
            sock,
            sent: Mutex::new(Sent {
                adopted,
                ..Sent::default()
            }),
            keeper,
            area,
            supervisor_pid,
        }
    }
}

impl Forwarder {
    /// Sends the memfds of the `ram` namespaces among `backends` (by
    /// NSID), before the server is ready: the supervisor hands them to the
    /// server it starts after a crash, which maps them.
    pub fn memories(&self, backends: &[(u32, Arc<dyn BlockDevice>)]) -> std::io::Result<()> {
        for (nsid, fd) in crate::upgrade::ram::memfds(backends) {
            self.send(&Note::Ram { nsid }, Some(fd))?;
        }
        Ok(())
    }
}

/// An id unique among those of one supervisor's children (this process's
/// id and a count): a new client's serial, so a crash area slot names its
/// client; a marked message's fds', so the crash area's mark names them.
fn new_id() -> u64 {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    (u64::from(std::process::id()) << 32) | (COUNT.fetch_add(1, Ordering::Relaxed) + 1)
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
            ClientChange::Irqs => {
                if let Some(k) = &self.keeper {
                    k.touch();
                }
                self.irqs(device)
            }
            ClientChange::Gone => {
                sent.files.clear();
                if let Some(k) = &self.keeper {
                    k.clear_client();
                }
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

    fn checkpoint(&self, device: &NvmeDevice) {
        if let Some(k) = &self.keeper {
            k.checkpoint(device);
        }
    }

    fn handling(&self, msg: Option<Marked<'_>>) {
        let Some(k) = &self.keeper else {
            return;
        };
        let Some(mut m) = msg else {
            crate::control::hold::at_clear();
            k.handling(None, 0);
            return;
        };
        let mut fds_id = 0;
        if m.redo.is_some() && !m.fds.is_empty() {
            match self.message_fds(m.fds) {
                Some(id) => fds_id = id,
                // The supervisor does not hold them: a crash while it is
                // marked ends the connection.
                None => m.redo = None,
            }
        }
        k.handling(Some(m), fds_id);
        crate::control::hold::at_mark(m.msg_id, m.command);
    }

    fn reply_pipe(&self) -> Option<Arc<vnvme_vfio_user::ReplyPipe>> {
        self.keeper.as_ref()?.replies()
    }

    fn keep_paused(
        &self,
        device: &NvmeDevice,
        state: &vnvme_controller::SavedState,
    ) -> Result<(), String> {
        match &self.keeper {
            Some(k) => k
                .keep_paused(device, state)
                .map_err(|e| format!("keeping the crash state for the upgrade: {e}; try again")),
            None => Ok(()),
        }
    }

    fn hand_on(
        &self,
        manifest: &mut Manifest,
        pass: &mut dyn FnMut(BorrowedFd<'_>) -> Result<i32, String>,
    ) -> Result<(), String> {
        manifest.supervisor = Some(HandedSocket {
            fd: pass(self.sock.as_fd())?,
        });
        manifest.supervisor_pid = Some(self.supervisor_pid);
        if let Some(area) = &self.area {
            let replies = match self.keeper.as_ref().and_then(|k| k.replies()) {
                Some(pipe) => {
                    let (rx, tx) = pipe.fds();
                    Some([pass(rx)?, pass(tx)?])
                }
                None => None,
            };
            manifest.crash = Some(HandedCrash {
                fd: pass(area.as_fd())?,
                client: None,
                replies,
                serial: self.keeper.as_ref().and_then(|k| k.serial()),
            });
        }
        Ok(())
    }

    fn successor(&self, event: SuccessorEvent<'_>) {
        let note = match event {
            SuccessorEvent::Started(pid) => Note::Successor { pid },
            SuccessorEvent::Failed => Note::SuccessorFailed,
            SuccessorEvent::TookOver { pid, exe } => Note::HandedOver {
                pid,
                exe: exe.to_string(),
            },
        };
        if let Err(e) = self.send(&note, None) {
            tracing::error!("telling the supervisor of the upgrade ({note:?}) failed: {e}");
        }
    }
}

impl Forwarder {
    /// Sends the fds of the message about to be marked, under a new id
    /// (see `crash_area::handling`); `None` if they could not be.
    fn message_fds(&self, fds: &[OwnedFd]) -> Option<u64> {
        let mut sent = self.sent.lock();
        if sent.broken {
            return None;
        }
        let id = new_id();
        for (index, fd) in fds.iter().enumerate() {
            let note = Note::MessageFd {
                id,
                index,
                of: fds.len(),
            };
            if let Err(e) = self.send(&note, Some(fd.as_fd())) {
                sent.broken = true;
                tracing::error!(
                    "forwarding a message's fds to the supervisor failed: {e}; a crash of this \
                     process from now on loses the client"
                );
                return None;
            }
        }
        Some(id)
    }

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
        // The first client is the adopted one, if any.
        let serial = sent.adopted.take().unwrap_or_else(new_id);
        if let Some(k) = &self.keeper {
            k.set_client(SlotClient {
                serial,
                max_xfer: parts.max_xfer,
                maps: Vec::new(),
                function: device.function_state(),
            });
        }
        self.send(
            &Note::Client {
                max_xfer: parts.max_xfer,
                serial,
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
        let mut keys = Vec::with_capacity(parts.files.len());
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
            keys.push(key);
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
        if let Some(k) = &self.keeper {
            // The maps name their files by the supervisor's ids.
            let maps = parts
                .maps
                .iter()
                .map(|m| {
                    let mut m = m.clone();
                    m.file = m
                        .file
                        .and_then(|i| keys.get(i))
                        .and_then(|key| sent.files.get(key))
                        .map(|&id| id as usize);
                    m
                })
                .collect();
            k.set_maps(maps);
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
