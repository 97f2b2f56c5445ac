//! Saved states a controller must refuse: saved while running or with a
//! command in flight, truncated, corrupt, of another version, of another
//! configuration, or with hostile values under a valid checksum.

use super::*;

/// A state of `h` after a few commands (I/O queue 1, a write, shadow
/// doorbells, an AER outstanding), paused.
fn busy_host() -> (Run, Arc<RamDevice>, SavedState) {
    let (h, b2) = host();
    let mut a = run(h);
    for op in [
        Op::CreatePair { qid: 1, size: 16 },
        Op::Dbbuf,
        Op::Write {
            qid: 1,
            nsid: 1,
            slba: 8,
            nlb: 2,
            seed: 7,
        },
        Op::HostId { id: 1 },
        Op::Register {
            qid: 1,
            rrega: 0,
            crkey: 0,
            nrkey: 1,
        },
        Op::ZoneAppend {
            qid: 1,
            zone: 3,
            nlb: 2,
            seed: 1,
        },
        Op::Aer,
    ] {
        a.apply(&op);
    }
    a.h.ctrl.pause();
    let saved = a.h.ctrl.save_state().unwrap();
    (a, b2, saved)
}

fn restore(
    saved: &SavedState,
    config: ControllerConfig,
    b2: &RamDevice,
) -> Result<Controller, StateError> {
    let b1 = Arc::new(RamDevice::new(NS_BLOCKS * 512));
    Controller::restore(
        config,
        namespaces(b1, copy_of(b2)),
        saved,
        Arc::new(VecMemory::new(MEM_SIZE)),
        Arc::new(CountingIrq::default()),
    )
}

#[test]
fn saving_a_running_controller_is_refused_until_paused() {
    let (h, _) = host();
    let err = h.ctrl.save_state().unwrap_err();
    assert!(matches!(err, StateError::NotPaused), "{err}");
    h.ctrl.pause();
    assert!(h.ctrl.save_state().is_ok());
    h.ctrl.resume().unwrap();
    assert!(matches!(h.ctrl.save_state(), Err(StateError::NotPaused)));
}

#[test]
fn every_truncation_of_a_state_is_refused_without_panic() {
    let (_a, _, saved) = busy_host();
    let bytes = saved.encode();
    for len in 0..bytes.len() {
        let err = SavedState::decode(&bytes[..len]).unwrap_err();
        assert!(
            matches!(
                err,
                StateError::Truncated { .. } | StateError::Length { .. }
            ),
            "{len} bytes: {err}"
        );
    }
    let mut longer = bytes.clone();
    longer.push(b' ');
    assert!(matches!(
        SavedState::decode(&longer),
        Err(StateError::Length { .. })
    ));
}

#[test]
fn a_flipped_bit_anywhere_is_refused() {
    let (_a, _, saved) = busy_host();
    let bytes = saved.encode();
    // Every byte of the header, and a spread of the body's.
    let step = (bytes.len() / 500).max(1);
    for at in (0..HEADER_LEN_USIZE).chain((HEADER_LEN_USIZE..bytes.len()).step_by(step)) {
        let mut bad = bytes.clone();
        bad[at] ^= 0x10;
        let err = SavedState::decode(&bad).unwrap_err();
        let named = err.to_string();
        assert!(!named.is_empty(), "byte {at}");
    }
}

const HEADER_LEN_USIZE: usize = crate::HEADER_LEN;

#[test]
fn another_format_version_is_refused_by_name() {
    let (_a, _, saved) = busy_host();
    for version in [0u32, crate::FORMAT_VERSION + 1, u32::MAX] {
        let mut bytes = saved.encode();
        bytes[8..12].copy_from_slice(&version.to_le_bytes());
        let err = SavedState::decode(&bytes).unwrap_err();
        assert!(
            matches!(err, StateError::UnsupportedVersion { found, .. } if found == version),
            "{err}"
        );
        let text = err.to_string();
        assert!(
            text.contains(&version.to_string()) && text.contains("1 to 3"),
            "{text}"
        );
    }
}

#[test]
fn a_bad_magic_or_checksum_is_refused() {
    let (_a, _, saved) = busy_host();
    let mut bytes = saved.encode();
    bytes[0] = b'X';
    assert!(matches!(
        SavedState::decode(&bytes),
        Err(StateError::BadMagic)
    ));
    let mut bytes = saved.encode();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    assert!(matches!(
        SavedState::decode(&bytes),
        Err(StateError::Checksum { .. })
    ));
}

/// `saved` with `change` made to its body, sealed again (a hostile state
/// with a valid checksum).
fn tampered(
    saved: &SavedState,
    change: impl FnOnce(&mut serde_json::Value),
) -> Result<SavedState, StateError> {
    let mut json: serde_json::Value = serde_json::from_str(&saved.to_json_pretty()).unwrap();
    change(&mut json);
    let body = serde_json::to_vec(&json).unwrap();
    let mut bytes = saved.encode()[..crate::HEADER_LEN].to_vec();
    bytes[16..24].copy_from_slice(&(body.len() as u64).to_le_bytes());
    bytes[24..32].copy_from_slice(&vnvme_crc::crc64_nvme(&body).to_le_bytes());
    bytes.extend_from_slice(&body);
    SavedState::decode(&bytes)
}

/// A change made to a state's body.
type Change = Box<dyn FnOnce(&mut serde_json::Value)>;

#[test]
fn hostile_values_with_a_valid_checksum_are_refused_at_restore() {
    let (_a, b2, saved) = busy_host();
    assert!(
        restore(&saved, config(), &b2).is_ok(),
        "the untouched state restores"
    );
    let cases: Vec<(&str, Change)> = vec![
        (
            "SQ queue id out of range",
            Box::new(|j| j["queues"]["sqs"][1]["qid"] = 200.into()),
        ),
        (
            "CQ queue id out of range",
            Box::new(|j| j["queues"]["cqs"][1]["qid"] = 9.into()),
        ),
        (
            "SQ tail beyond its size",
            Box::new(|j| j["queues"]["sqs"][1]["tail"] = 16.into()),
        ),
        (
            "CQ size beyond MQES",
            Box::new(|j| j["queues"]["cqs"][1]["size"] = 65.into()),
        ),
        (
            "SQ on a missing CQ",
            Box::new(|j| j["queues"]["sqs"][1]["cqid"] = 3.into()),
        ),
        (
            "vector beyond MSI-X",
            Box::new(|j| j["queues"]["cqs"][1]["iv"] = 9.into()),
        ),
        (
            "admin SQ not at ASQ",
            Box::new(|j| j["queues"]["sqs"][0]["base"] = 0.into()),
        ),
        (
            "doorbell of no queue",
            Box::new(|j| j["doorbells"]["registers"][0]["index"] = 15.into()),
        ),
        (
            "doorbell past its queue",
            Box::new(|j| j["doorbells"]["registers"][2]["value"] = 99.into()),
        ),
        (
            "too many AERs",
            Box::new(|j| j["reporting"]["aer_cids"] = vec![1, 2, 3, 4, 5].into()),
        ),
        (
            "namespace size",
            Box::new(|j| j["subsystem"]["namespaces"][0]["backend_size"] = 4096.into()),
        ),
        (
            "unknown format",
            Box::new(|j| j["subsystem"]["namespaces"][0]["format_index"] = 99.into()),
        ),
        (
            "zone state",
            Box::new(|j| j["subsystem"]["namespaces"][1]["zones"]["zones"][0][0] = 0x77.into()),
        ),
        (
            "zones written",
            Box::new(|j| {
                j["subsystem"]["namespaces"][1]["zones"]["zones"][0][1] = 1_000_000.into()
            }),
        ),
        (
            "reservations",
            Box::new(|j| j["subsystem"]["namespaces"][0]["reservations"]["text"] = "junk".into()),
        ),
        (
            "firmware slot",
            Box::new(|j| j["subsystem"]["firmware"]["active"] = 3.into()),
        ),
        (
            "sanitize position without one in progress",
            Box::new(|j| {
                j["background"]["sanitize"]["run"] = serde_json::json!({
                    "op": {"method": "block-erase", "ndas": false, "ause": false, "cdw10": 2},
                    "key": 1, "done": 0
                })
            }),
        ),
        (
            "sanitize in progress without its position",
            Box::new(|j| j["background"]["sanitize"]["status"] = 2.into()),
        ),
        (
            "sanitize overwriting in 0 passes",
            Box::new(|j| {
                j["background"]["sanitize"]["status"] = 2.into();
                j["background"]["sanitize"]["run"] = serde_json::json!({
                    "op": {"method": {"overwrite": {"pattern": 0, "passes": 0, "invert": false}},
                           "ndas": false, "ause": false, "cdw10": 3},
                    "key": 1, "done": 0
                })
            }),
        ),
        (
            "attached to CNTLID 0",
            Box::new(|j| j["subsystem"]["namespaces"][0]["attached_to"] = vec![0, 1].into()),
        ),
        (
            "attachment disagreeing with attached",
            Box::new(|j| j["subsystem"]["namespaces"][0]["attached_to"] = vec![2].into()),
        ),
        (
            "ANA state unknown",
            Box::new(|j| {
                j["subsystem"]["ana"] =
                    serde_json::json!({"change_count": 1, "states": [[1, 1, "degraded", 1]]})
            }),
        ),
        (
            "ANA change counted after the log's",
            Box::new(|j| {
                j["subsystem"]["ana"] =
                    serde_json::json!({"change_count": 1, "states": [[1, 1, "inaccessible", 2]]})
            }),
        ),
        ("CAP", Box::new(|j| j["regs"]["cap"] = 0.into())),
        (
            "granted queues",
            Box::new(|j| j["features"]["nsqa_z"] = 100.into()),
        ),
        (
            "vectors",
            Box::new(|j| j["interrupts"]["coalescing_disabled"] = vec![9].into()),
        ),
    ];
    for (what, change) in cases {
        let state = tampered(&saved, change).expect("a well-formed body decodes");
        let err = restore(&state, config(), &b2).expect_err(what);
        assert!(matches!(err, StateError::Invalid(_)), "{what}: {err}");
        let mut text = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(s) = source {
            text += &format!(": {s}");
            source = s.source();
        }
        assert!(text.len() > 40, "{what}: a reason is given: {text}");
    }
    // Malformed bodies are refused at decode.
    let err = tampered(&saved, |j| j["queues"] = "nothing".into()).unwrap_err();
    assert!(
        matches!(
            err,
            StateError::Body {
                version: crate::FORMAT_VERSION,
                ..
            }
        ),
        "{err}"
    );
    let err = tampered(&saved, |j| j["surprise"] = 1.into()).unwrap_err();
    assert!(matches!(err, StateError::Body { .. }), "{err}");
}

#[test]
fn a_state_of_another_configuration_is_refused() {
    let (_a, b2, saved) = busy_host();
    let fewer = ControllerConfig {
        max_io_queues: 2,
        ..config()
    };
    let bigger = ControllerConfig {
        mqes_z: 255,
        ..config()
    };
    let vectors = ControllerConfig {
        msix_vectors: 4,
        ..config()
    };
    for (what, config) in [("queues", fewer), ("MQES", bigger), ("vectors", vectors)] {
        let err = restore(&saved, config, &b2).expect_err(what);
        assert!(matches!(err, StateError::Invalid(_)), "{what}: {err}");
    }
    let small = RamDevice::new(NS_BLOCKS * 256);
    let err = restore(&saved, config(), &small).expect_err("a smaller namespace 2");
    assert!(matches!(err, StateError::Invalid(_)), "{err}");
}

#[test]
fn a_command_in_flight_keeps_the_state_from_being_saved() {
    use vnvme_blockdev::held::{HeldRam, Release};
    let held = Arc::new(HeldRam::new(NS_BLOCKS * 512, Release::Test));
    let mut h = Host::enabled_on(config(), held.clone());
    h.create_pair(1, 16);
    h.push(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0));
    h.ring_sq(1);
    let deadline = Instant::now() + Duration::from_secs(5);
    while held.held() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    h.ctrl.pause();
    let err = h.ctrl.save_state().unwrap_err();
    assert!(matches!(err, StateError::Busy(_)), "{err}");
    assert!(err.to_string().contains("in flight"), "{err}");
    h.ctrl.resume().unwrap();
    held.release_newest_first();
}
