//! The supervisor's table of the client's fds, as the child forwarded them
//! ([`Note`]s): what a successor would be handed after a crash.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;

use super::notes::Note;

/// The client's fds the supervisor holds.
#[derive(Debug, Default)]
pub struct Table {
    /// The connection and its `max_data_xfer_size`.
    pub conn: Option<(OwnedFd, usize)>,
    /// The client's serial (its slots in the crash area carry it).
    pub serial: u64,
    pub doorbells: Option<OwnedFd>,
    /// The files behind the DMA maps, by the child's id.
    pub files: BTreeMap<u64, OwnedFd>,
    /// Per MSI-X (or MSI) vector index, its eventfd.
    pub vectors: BTreeMap<usize, OwnedFd>,
    pub intx: Option<OwnedFd>,
    /// The `ram` namespaces' memfds, by NSID: the server's data, which
    /// every next child is handed, client or not (kept by [`Table::clear`]).
    pub ram: BTreeMap<u32, OwnedFd>,
    /// The fds of the message the child marked last that carried some
    /// (`Note::MessageFd`): its id, how many it has, those received.
    pub message: Option<(u64, usize, Vec<OwnedFd>)>,
}

impl Table {
    /// Applies one note; `Err`: why it does not fit (nothing changed then).
    pub fn apply(&mut self, note: Note, fd: Option<OwnedFd>) -> Result<(), String> {
        let no_fd = || format!("{note:?} came without its fd");
        match note {
            Note::Client { max_xfer, serial } => {
                let fd = fd.ok_or_else(no_fd)?;
                // A restored child tells its client as a new one before
                // it handles the dead child's message again: that
                // message's fds are still needed if it dies first.
                let message = self.message.take();
                self.clear();
                self.conn = Some((fd, max_xfer));
                self.serial = serial;
                self.message = message;
            }
            Note::Doorbells => self.doorbells = Some(fd.ok_or_else(no_fd)?),
            Note::File { id } => {
                let fd = fd.ok_or_else(no_fd)?;
                if self.files.insert(id, fd).is_some() {
                    return Err(format!("file {id} was sent twice"));
                }
            }
            Note::DropFile { id } => {
                if self.files.remove(&id).is_none() {
                    return Err(format!("file {id} is dropped and was never sent"));
                }
            }
            Note::IrqsCleared => {
                self.vectors.clear();
                self.intx = None;
            }
            Note::Vector { index } => {
                self.vectors.insert(index, fd.ok_or_else(no_fd)?);
            }
            Note::Intx => self.intx = Some(fd.ok_or_else(no_fd)?),
            Note::Gone => self.clear(),
            Note::Ram { nsid } => {
                self.ram.insert(nsid, fd.ok_or_else(no_fd)?);
            }
            Note::MessageFd { id, index, of } => {
                let fd = fd.ok_or_else(no_fd)?;
                if self.message.as_ref().is_none_or(|(held, ..)| *held != id) {
                    self.message = Some((id, of, Vec::new()));
                }
                let Some((_, count, fds)) = self.message.as_mut() else {
                    return Err("no message to add an fd to".into());
                };
                if *count != of || fds.len() != index || index >= of {
                    let why = format!(
                        "fd {index} of {of} of message {id}, after {} of {count}",
                        fds.len()
                    );
                    self.message = None;
                    return Err(why);
                }
                fds.push(fd);
            }
            Note::Successor { .. } | Note::SuccessorFailed | Note::HandedOver { .. } => {
                return Err(format!("{note:?} is not about the client"));
            }
        }
        Ok(())
    }

    /// Forgets the client (closing its fds: the supervisor's copy of the
    /// connection is then no longer what keeps it open).
    pub fn clear(&mut self) {
        let ram = std::mem::take(&mut self.ram);
        *self = Self {
            ram,
            ..Self::default()
        };
    }

    /// What it holds, for the log.
    pub fn summary(&self) -> String {
        if self.conn.is_none() {
            return "no client".into();
        }
        format!(
            "a client: its connection, {} DMA files, {} interrupt eventfds{}{}",
            self.files.len(),
            self.vectors.len(),
            if self.intx.is_some() {
                " and INTx's"
            } else {
                ""
            },
            if self.doorbells.is_some() {
                ", the doorbell memfd"
            } else {
                ""
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fd() -> Option<OwnedFd> {
        Some(std::fs::File::open("/dev/null").unwrap().into())
    }

    #[test]
    fn the_ram_memfds_outlive_the_client_and_a_new_one_replaces_the_old() {
        let mut t = Table::default();
        t.apply(Note::Ram { nsid: 2 }, fd()).unwrap();
        t.apply(
            Note::Client {
                max_xfer: 4096,
                serial: 1,
            },
            fd(),
        )
        .unwrap();
        t.apply(Note::Gone, None).unwrap();
        t.clear();
        assert_eq!(t.ram.keys().copied().collect::<Vec<_>>(), [2]);
        t.apply(Note::Ram { nsid: 2 }, fd()).unwrap();
        t.apply(Note::Ram { nsid: 1 }, fd()).unwrap();
        assert_eq!(t.ram.keys().copied().collect::<Vec<_>>(), [1, 2]);
        assert!(t.apply(Note::Ram { nsid: 3 }, None).is_err());
        assert_eq!(t.ram.len(), 2);
    }

    #[test]
    fn notes_build_the_table_and_a_new_client_or_irqs_replace_the_old() {
        let mut t = Table::default();
        assert_eq!(t.summary(), "no client");
        t.apply(
            Note::Client {
                max_xfer: 4096,
                serial: 1,
            },
            fd(),
        )
        .unwrap();
        t.apply(Note::File { id: 0 }, fd()).unwrap();
        t.apply(Note::File { id: 1 }, fd()).unwrap();
        t.apply(Note::Vector { index: 0 }, fd()).unwrap();
        t.apply(Note::IrqsCleared, None).unwrap();
        t.apply(Note::Vector { index: 0 }, fd()).unwrap();
        t.apply(Note::Vector { index: 1 }, fd()).unwrap();
        t.apply(Note::Doorbells, fd()).unwrap();
        t.apply(Note::DropFile { id: 0 }, None).unwrap();
        assert_eq!(
            t.summary(),
            "a client: its connection, 1 DMA files, 2 interrupt eventfds, the doorbell memfd"
        );
        assert!(t.apply(Note::File { id: 1 }, fd()).is_err());
        assert!(t.apply(Note::DropFile { id: 9 }, None).is_err());
        assert!(t.apply(Note::Intx, None).is_err());
        t.apply(
            Note::Client {
                max_xfer: 4096,
                serial: 1,
            },
            fd(),
        )
        .unwrap();
        assert_eq!(
            t.summary(),
            "a client: its connection, 0 DMA files, 0 interrupt eventfds"
        );
        t.apply(Note::Gone, None).unwrap();
        assert_eq!(t.summary(), "no client");
    }

    #[test]
    fn a_messages_fds_are_held_by_id_in_order_and_outlive_a_client_note() {
        let mut t = Table::default();
        let fd_note = |id, index, of| Note::MessageFd { id, index, of };
        t.apply(fd_note(7, 0, 2), fd()).unwrap();
        t.apply(fd_note(7, 1, 2), fd()).unwrap();
        assert!(matches!(&t.message, Some((7, 2, fds)) if fds.len() == 2));
        // A restored child's client note keeps them.
        t.apply(
            Note::Client {
                max_xfer: 4096,
                serial: 2,
            },
            fd(),
        )
        .unwrap();
        assert!(matches!(&t.message, Some((7, 2, fds)) if fds.len() == 2));
        // A new id replaces them; one out of order drops what was held.
        t.apply(fd_note(8, 0, 1), fd()).unwrap();
        assert!(matches!(&t.message, Some((8, 1, fds)) if fds.len() == 1));
        assert!(t.apply(fd_note(9, 1, 2), fd()).is_err());
        assert!(t.message.is_none());
        assert!(t.apply(fd_note(9, 0, 1), None).is_err());
        t.apply(fd_note(9, 0, 1), fd()).unwrap();
        t.apply(Note::Gone, None).unwrap();
        assert!(t.message.is_none());
    }
}
