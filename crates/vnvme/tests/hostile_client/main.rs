//! Hostile vfio-user clients against `vnvme serve`'s server over a real
//! socket: the client process (QEMU, SPDK's host, anything that can open the
//! socket) is a trust boundary of its own. Each case asserts the reply (an
//! errno, or a clean close where the stream cannot continue) and that a
//! well-behaved client then attaches and runs Identify and I/O; the cases
//! that need signals or an exact fd count run `vnvme serve` as a process.

mod door;
mod file_io;
#[path = "../hostile_guest/guest.rs"]
mod guest;
mod irqs;
mod limits;
mod memory;
mod messages;
mod peer;
mod process;
mod stop;
