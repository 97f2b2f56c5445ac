//! NVMe data structures shared by the controller and the driver.
//!
//! No I/O and no `unsafe`: registers and command dwords are bitfield
//! structs, queue entries and
//! identify/log structures are `zerocopy` structs with little-endian fields
//! (alignment 1, so a structure can be read from any byte offset of guest
//! memory), and opcodes and statuses are open newtypes: a value the guest
//! sends that we do not know is kept as it is, never a panic.
//!
//! Section numbers cite NVM Express Base Specification 2.0 unless noted.
#![forbid(unsafe_code)]

/// `From` both ways between a bitfield dword type and the little-endian
/// `U32` of a command or completion, so that call sites read
/// `Cdw10Identify::from(cmd.cdw10)`; inlined, so a field read costs what a
/// hand-written shift and mask did. Defined before the modules that use it.
macro_rules! dword {
    ($($t:ty),* $(,)?) => {$(
        impl From<zerocopy::little_endian::U32> for $t {
            #[inline]
            fn from(dw: zerocopy::little_endian::U32) -> Self {
                Self::from_bits(dw.get())
            }
        }

        impl From<$t> for zerocopy::little_endian::U32 {
            #[inline]
            fn from(dw: $t) -> Self {
                zerocopy::little_endian::U32::new(dw.into_bits())
            }
        }
    )*};
}

pub mod ana;
pub mod cdw;
pub mod command;
pub mod directive;
pub mod event_idx;
pub mod feature;
pub mod identify;
pub mod log;
mod log_page_id;
pub mod opcode;
pub mod pi;
pub mod range;
pub mod regs;
pub mod reservation;
pub mod sgl;
pub mod status;
pub mod zns;

pub use command::{Command, Completion};
pub use opcode::{AdminOpcode, NvmOpcode};
pub use status::Status;
