//! Sanitize (NVMe Base 2.0 §5.24 the command, §8.21 the operation): the
//! NVM subsystem's sanitize state, the Sanitize Status log (81h) it
//! shows, and what each method does to a namespace's medium.
//!
//! Every allocated namespace is sanitized, attached or not. A `null`
//! namespace holds no data (it reads zeroes already): it takes no time.
//! The methods (all three in SANICAP):
//! * Block Erase zeroes every byte, deallocating it;
//! * Crypto Erase changes the media key, modelled as 16 times faster than
//!   a block erase: the data is deallocated;
//! * Overwrite writes the 32-bit pattern over data and metadata, `passes`
//!   times (inverted every other pass with OIPBP), then deallocates.
//!
//! With No-Deallocate After Sanitize (NDAS) nothing is deallocated and
//! reads return zeroes (block erase), what the old data decrypts to under
//! the new key (crypto erase: a keystream), or the last pass's pattern;
//! the medium is not changed further afterwards (SANICAP.NODMMAS = 01b).

use std::hash::{BuildHasher, Hasher};

use parking_lot::Mutex;
use vnvme_blockdev::{BlockDevice, BlockError};
use vnvme_spec::log::sanitize::{sstat, NOT_REPORTED, SPROG_IDLE};
use vnvme_spec::log::SanitizeStatusLog;
use vnvme_spec::Status;
use zerocopy::little_endian::{U16, U32};

use crate::background::{seconds, Task};

mod saved;
pub(crate) use saved::SavedSanitize;

/// Passes of the Overwrite that ETO estimates.
const ETO_PASSES: u64 = 16;
/// How much faster than a block erase a crypto erase goes.
const CRYPTO_SPEEDUP: u64 = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Method {
    BlockErase,
    CryptoErase,
    Overwrite {
        pattern: u32,
        /// 1 to 16.
        passes: u8,
        /// OIPBP: every other pass writes the pattern inverted.
        invert: bool,
    },
}

/// A sanitize operation, as its command asked for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Operation {
    pub method: Method,
    /// No-Deallocate After Sanitize.
    pub ndas: bool,
    /// Allow Unrestricted Sanitize Exit: after a failure, Exit Failure
    /// Mode is allowed.
    pub ause: bool,
    /// The command's CDW10, for the log (SCDW10).
    pub cdw10: u32,
}

impl Operation {
    /// Passes over the medium.
    pub fn passes(&self) -> u8 {
        match self.method {
            Method::Overwrite { passes, .. } => passes,
            _ => 1,
        }
    }

    /// How much faster than the sanitize rate this method goes.
    pub fn speedup(&self) -> u64 {
        match self.method {
            Method::CryptoErase => CRYPTO_SPEEDUP,
            _ => 1,
        }
    }

    /// Sanitizes `len` bytes at `offset` in pass `pass` (from 0); `key`:
    /// the new media key of a crypto erase; `buf`: reused between steps.
    pub fn erase(
        &self,
        backend: &dyn BlockDevice,
        key: u64,
        pass: u8,
        offset: u64,
        len: u64,
        buf: &mut Vec<u8>,
    ) -> Result<(), BlockError> {
        let fill = |buf: &mut Vec<u8>, word: &dyn Fn(u64) -> [u8; 8]| {
            buf.clear();
            // Offsets are multiples of 8: a word's value depends on where
            // it lies, not on how the medium was cut into steps.
            buf.extend((offset / 8..(offset + len).div_ceil(8)).flat_map(word));
            buf.truncate(len as usize);
        };
        match self.method {
            Method::BlockErase if self.ndas => backend.write_zeroes(offset, len),
            Method::CryptoErase if self.ndas => {
                fill(buf, &|i| keystream(key, i).to_le_bytes());
                backend.write(offset, buf)
            }
            Method::BlockErase | Method::CryptoErase => backend.discard(offset, len),
            Method::Overwrite {
                pattern, invert, ..
            } => {
                let p = if invert && pass % 2 == 1 {
                    !pattern
                } else {
                    pattern
                };
                let word = (u64::from(p) << 32 | u64::from(p)).to_le_bytes();
                fill(buf, &|_| word);
                backend.write(offset, buf)
            }
        }
    }

    /// After the last pass: deallocate what the passes wrote (unless
    /// NDAS), and make it durable.
    pub fn finish(&self, backend: &dyn BlockDevice) -> Result<(), BlockError> {
        if matches!(self.method, Method::Overwrite { .. }) && !self.ndas {
            backend.discard(0, backend.size())?;
        }
        backend.flush()
    }
}

/// Word `index` of the keystream under `key` (splitmix64).
fn keystream(key: u64, index: u64) -> u64 {
    let mut z = (key ^ index).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A new media key: a crypto erase's data is not predictable from the
/// last one's.
pub(crate) fn new_key() -> u64 {
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

/// The NVM subsystem's sanitize state (§8.21: idle, processing, failure
/// restricted or not), and the thread of the operation in progress.
#[derive(Debug, Default)]
pub(crate) struct Sanitize {
    state: Mutex<State>,
    pub task: Task,
}

#[derive(Debug, Default)]
struct State {
    /// SSTAT bits 2:0: the most recent operation's status.
    status: u16,
    /// Overwrite passes completed (SSTAT 7:3).
    passes: u8,
    scdw10: u32,
    sprog: u16,
    /// Since an operation failed and until one completes or the host
    /// exits failure mode: whether that exit is allowed (AUSE).
    failure: Option<bool>,
    /// User data writing commands counted when the last operation
    /// completed: while the count stays, no user data has been written
    /// since (SSTAT Global Data Erased).
    erased_at: Option<u64>,
    /// The operation in progress and how far it is: a run stopped by a
    /// pause goes on from there (in this process or, saved, in the next).
    run: Option<Position>,
}

/// Where a sanitize in progress is: its operation, its media key (a crypto
/// erase with NDAS writes a keystream of it) and the bytes done over every
/// pass and namespace, in the order the thread goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Position {
    pub op: Operation,
    pub key: u64,
    pub done: u64,
}

impl Sanitize {
    /// The status of commands the spec does not permit now: Sanitize In
    /// Progress (it ends by itself: DNR clear), Sanitize Failed (until
    /// the host recovers).
    pub fn refusal(&self) -> Option<Status> {
        let s = self.state.lock();
        if s.status == sstat::IN_PROGRESS {
            Some(Status::SANITIZE_IN_PROGRESS.with_dnr(false))
        } else {
            s.failure.map(|_| Status::SANITIZE_FAILED.with_dnr(true))
        }
    }

    /// Starts processing `op`: Sanitize In Progress if one is.
    pub fn begin(&self, op: &Operation) -> Result<(), Status> {
        let mut s = self.state.lock();
        if s.status == sstat::IN_PROGRESS {
            return Err(Status::SANITIZE_IN_PROGRESS.with_dnr(false));
        }
        *s = State {
            status: sstat::IN_PROGRESS,
            scdw10: op.cdw10,
            run: Some(Position {
                op: *op,
                key: new_key(),
                done: 0,
            }),
            ..State::default()
        };
        Ok(())
    }

    /// The operation in progress and where it is, if one is.
    pub fn position(&self) -> Option<Position> {
        let s = self.state.lock();
        s.run.filter(|_| s.status == sstat::IN_PROGRESS)
    }

    /// Exit Failure Mode: true if it left failure mode. A restricted
    /// failure (AUSE clear) is left only by a successful sanitize:
    /// Sanitize Failed. Nothing to exit: nothing done.
    pub fn exit_failure_mode(&self) -> Result<bool, Status> {
        let mut s = self.state.lock();
        if s.status == sstat::IN_PROGRESS {
            return Err(Status::SANITIZE_IN_PROGRESS.with_dnr(false));
        }
        match s.failure {
            Some(true) => {
                s.failure = None;
                Ok(true)
            }
            Some(false) => Err(Status::SANITIZE_FAILED.with_dnr(true)),
            None => Ok(false),
        }
    }

    /// `done` of `total` bytes sanitized: SPROG in 65536ths.
    pub fn progress(&self, done: u64, total: u64) {
        let sprog = (u128::from(done) << 16)
            .checked_div(u128::from(total))
            .unwrap_or(0);
        let mut s = self.state.lock();
        s.sprog = u16::try_from(sprog).unwrap_or(u16::MAX);
        if let Some(run) = &mut s.run {
            run.done = done;
        }
    }

    /// Overwrite passes completed, as a run resumed from a position
    /// counts them.
    pub fn set_passes(&self, passes: u8) {
        self.state.lock().passes = passes;
    }

    /// An Overwrite pass completed.
    pub fn pass_done(&self) {
        let mut s = self.state.lock();
        s.passes = s.passes.saturating_add(1);
    }

    /// The operation ended: completed, or failed (`ause` says how failure
    /// mode may be left); `writes`: the user data writing commands so far.
    pub fn complete(&self, ok: bool, ause: bool, writes: u64) {
        let mut s = self.state.lock();
        s.status = if ok { sstat::COMPLETED } else { sstat::FAILED };
        s.failure = (!ok).then_some(ause);
        s.erased_at = ok.then_some(writes);
        s.run = None;
    }

    /// The Sanitize Status log: `writes` user data writing commands so
    /// far; estimates for `bytes` of medium at `rate` bytes per second.
    pub fn log(&self, writes: u64, bytes: u64, rate: u64) -> Box<SanitizeStatusLog> {
        let s = self.state.lock();
        let mut log = SanitizeStatusLog::new_boxed();
        let in_progress = s.status == sstat::IN_PROGRESS;
        log.sprog = U16::new(if in_progress { s.sprog } else { SPROG_IDLE });
        let gde = if s.erased_at == Some(writes) {
            sstat::GLOBAL_DATA_ERASED
        } else {
            0
        };
        let passes = u16::from(s.passes.min(0x1F)) << sstat::PASSES_SHIFT;
        log.sstat = U16::new(s.status | passes | gde);
        log.scdw10 = U32::new(s.scdw10);
        let estimate = |bytes: u64, rate: u64| {
            let secs = seconds(bytes, rate).unwrap_or(u64::from(NOT_REPORTED));
            U32::new(u32::try_from(secs).unwrap_or(NOT_REPORTED - 1))
        };
        log.eto = estimate(bytes.saturating_mul(ETO_PASSES), rate);
        log.etbe = estimate(bytes, rate);
        log.etce = estimate(bytes, rate.saturating_mul(CRYPTO_SPEEDUP));
        // No further media modification with NDAS: nothing to estimate.
        for t in [
            &mut log.etond,
            &mut log.etbend,
            &mut log.etcend,
            &mut log.etpvds,
        ] {
            *t = U32::new(NOT_REPORTED);
        }
        log
    }
}

#[cfg(test)]
mod tests {
    use vnvme_blockdev::RamDevice;

    use super::*;

    fn op(method: Method, ndas: bool) -> Operation {
        Operation {
            method,
            ndas,
            ause: false,
            cdw10: 0,
        }
    }

    fn read(dev: &RamDevice) -> Vec<u8> {
        let mut v = vec![0; dev.size() as usize];
        dev.read(0, &mut v).unwrap();
        v
    }

    #[test]
    fn overwrite_writes_the_pattern_inverted_every_other_pass() {
        let dev = RamDevice::new(8192);
        let o = op(
            Method::Overwrite {
                pattern: 0x1122_3344,
                passes: 2,
                invert: true,
            },
            true,
        );
        let mut buf = Vec::new();
        o.erase(&dev, 0, 0, 0, 8192, &mut buf).unwrap();
        assert_eq!(
            &read(&dev)[..8],
            &[0x44, 0x33, 0x22, 0x11, 0x44, 0x33, 0x22, 0x11]
        );
        // In two steps, as the thread cuts it.
        o.erase(&dev, 0, 1, 0, 4096, &mut buf).unwrap();
        o.erase(&dev, 0, 1, 4096, 4096, &mut buf).unwrap();
        o.finish(&dev).unwrap();
        let inverted = (!0x1122_3344u32).to_le_bytes();
        assert!(read(&dev).chunks(4).all(|w| w == inverted));
        // Without NDAS the passes end deallocated: zeroes.
        let o = Operation { ndas: false, ..o };
        o.finish(&dev).unwrap();
        assert!(read(&dev).iter().all(|&b| b == 0));
    }

    #[test]
    fn crypto_erase_with_no_deallocate_leaves_a_keystream_that_depends_on_the_key() {
        let dev = RamDevice::new(8192);
        dev.write(0, &[0xAB; 8192]).unwrap();
        let o = op(Method::CryptoErase, true);
        let mut buf = Vec::new();
        o.erase(&dev, 1, 0, 0, 8192, &mut buf).unwrap();
        let first = read(&dev);
        assert!(first.iter().filter(|&&b| b == 0xAB).count() < 256);
        o.erase(&dev, 2, 0, 0, 4096, &mut buf).unwrap();
        assert_ne!(read(&dev)[..4096], first[..4096]);
        // Deallocated without NDAS.
        op(Method::CryptoErase, false)
            .erase(&dev, 1, 0, 0, 8192, &mut buf)
            .unwrap();
        assert!(read(&dev).iter().all(|&b| b == 0));
    }

    #[test]
    fn log_reports_progress_passes_and_global_data_erased() {
        let s = Sanitize::default();
        let log = s.log(0, 1 << 20, 1 << 20);
        assert_eq!(log.sstat.get(), sstat::NEVER_SANITIZED);
        assert_eq!(log.sprog.get(), SPROG_IDLE);
        assert_eq!((log.etbe.get(), log.eto.get(), log.etce.get()), (1, 16, 1));
        let o = op(Method::BlockErase, false);
        s.begin(&Operation { cdw10: 0x32, ..o }).unwrap();
        assert_eq!(
            s.begin(&o),
            Err(Status::SANITIZE_IN_PROGRESS.with_dnr(false))
        );
        s.progress(1, 4);
        let log = s.log(7, 0, 0);
        assert_eq!(
            (log.sprog.get(), log.sstat.get()),
            (0x4000, sstat::IN_PROGRESS)
        );
        assert_eq!(log.scdw10.get(), 0x32);
        assert_eq!(log.etbe.get(), NOT_REPORTED, "unpaced: no estimate");
        s.pass_done();
        s.complete(true, false, 7);
        let log = s.log(7, 0, 0);
        assert_eq!(
            log.sstat.get(),
            sstat::COMPLETED | (1 << sstat::PASSES_SHIFT) | sstat::GLOBAL_DATA_ERASED
        );
        assert_eq!(s.log(8, 0, 0).sstat.get() & sstat::GLOBAL_DATA_ERASED, 0);
    }

    #[test]
    fn failure_mode_is_left_by_exit_only_when_unrestricted() {
        let s = Sanitize::default();
        assert_eq!(s.exit_failure_mode(), Ok(false));
        let o = op(Method::BlockErase, false);
        s.begin(&o).unwrap();
        s.complete(false, false, 0);
        let failed = Status::SANITIZE_FAILED.with_dnr(true);
        assert_eq!(s.refusal(), Some(failed));
        assert_eq!(s.exit_failure_mode(), Err(failed));
        s.begin(&o).unwrap();
        s.complete(false, true, 0);
        assert_eq!(s.exit_failure_mode(), Ok(true));
        assert_eq!(s.refusal(), None);
        assert_eq!(s.log(0, 0, 0).sstat.get(), sstat::FAILED);
    }
}
