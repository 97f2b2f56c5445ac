//! The sockets `vnvme serve` listens on and the tools connect to: made
//! with their final mode and group, or taken from a launcher (socket
//! activation); connected to with errors that say what stands in the way.

pub mod access;
pub mod bind;
pub mod connect;
pub mod listen;

pub use access::{parse_mode, Access};
pub use bind::{bind, SocketFile};
pub use connect::{connect, ConnectError, Target};
pub use listen::{Listening, Plan};
