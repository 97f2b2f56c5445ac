//! The saved-state decoder and restore (docs/state-format.md) fed hostile
//! states: raw bytes (the envelope's checks), a body sealed with a valid
//! header and checksum (the body's parser and every part's checks), and a
//! real state's body with bytes changed (deep into the restore). A state
//! must be refused with an error or restored; never a panic or a hang.

use std::sync::{Arc, OnceLock};

use arbitrary::Arbitrary;
use vnvme_blockdev::RamDevice;
use vnvme_controller::testing::{CountingIrq, VecMemory};
use vnvme_controller::{
    Controller, ControllerConfig, NamespaceConfig, SavedState, ZonedConfig, HEADER_LEN,
};

const MEM: usize = 1 << 20;
const NS_BYTES: u64 = 1 << 20;

#[derive(Arbitrary, Debug)]
pub enum Input {
    /// Bytes as they come: header and body.
    Raw(Vec<u8>),
    /// A body, sealed with a valid header.
    Body(Vec<u8>),
    /// A real state's body with bytes replaced at offsets, sealed again.
    Edited(Vec<(u16, u8)>),
}

fn config() -> ControllerConfig {
    ControllerConfig {
        max_io_queues: 4,
        msix_vectors: 5,
        mqes_z: 63,
        ..Default::default()
    }
}

fn namespaces() -> Vec<NamespaceConfig> {
    let zoned = ZonedConfig::new(64 << 10);
    vec![
        NamespaceConfig::new(1, 512, Arc::new(RamDevice::new(NS_BYTES))),
        NamespaceConfig::new(2, 512, Arc::new(RamDevice::new(NS_BYTES))).with_zoned(Some(zoned)),
    ]
}

/// The body of an enabled controller's state, made once.
fn base_body() -> &'static [u8] {
    static BODY: OnceLock<Vec<u8>> = OnceLock::new();
    BODY.get_or_init(|| {
        let ctrl = Controller::new(config(), namespaces()).expect("the fuzz configuration");
        ctrl.attach(
            Arc::new(VecMemory::new(MEM)),
            Arc::new(CountingIrq::default()),
        );
        for (off, v) in [(0x24u64, 0x001F_001Fu64), (0x28, 0x1000), (0x30, 0x2000)] {
            ctrl.mmio_write(off, &v.to_le_bytes());
        }
        ctrl.mmio_write(0x14, &0x0046_0001u32.to_le_bytes());
        ctrl.pause();
        let state = ctrl.save_state().expect("a paused controller saves");
        state
            .encode()
            .get(HEADER_LEN..)
            .unwrap_or_default()
            .to_vec()
    })
}

/// `body` behind a valid header of this format version.
fn seal(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&vnvme_controller::MAGIC);
    out.extend_from_slice(&vnvme_controller::FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(HEADER_LEN as u32).to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&vnvme_crc::crc64_nvme(body).to_le_bytes());
    out.extend_from_slice(body);
    out
}

pub fn run(input: Input) {
    let bytes = match input {
        Input::Raw(b) => b,
        Input::Body(b) => seal(&b),
        Input::Edited(edits) => {
            let mut body = base_body().to_vec();
            let len = body.len().max(1);
            for (at, v) in edits {
                if let Some(b) = body.get_mut(usize::from(at) % len) {
                    *b = v;
                }
            }
            seal(&body)
        }
    };
    let Ok(state) = SavedState::decode(&bytes) else {
        return;
    };
    let restored = Controller::restore(
        config(),
        namespaces(),
        &state,
        Arc::new(VecMemory::new(MEM)),
        Arc::new(CountingIrq::default()),
    );
    if let Ok(ctrl) = restored {
        // A restored controller answers register reads and a reset.
        let mut b = [0u8; 4];
        ctrl.mmio_read(0x1C, &mut b);
        ctrl.reset();
    }
}
