//! `vnvme bench upgrade`: a served controller upgraded under verified I/O
//! by the bench, which reports each handover and the stall it caused.

use std::process::Command;

#[test]
fn every_upgrade_round_reports_its_handover_and_loses_nothing() {
    let dir = std::env::temp_dir().join(format!("vnvme-bench-upgrade-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("upgrade.json");
    let out = Command::new(env!("CARGO_BIN_EXE_vnvme"))
        .args([
            "bench",
            "upgrade",
            "--modes",
            "shadow,adaptive",
            "--upgrades",
            "2",
        ])
        .args([
            "--interval",
            "0.4",
            "--qd",
            "8",
            "--backend",
            "file",
            "--verify",
        ])
        .args(["--size", "16M", "--json", json.to_str().unwrap()])
        .output()
        .expect("running vnvme");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let rounds = doc["rounds"].as_array().unwrap();
    // Per mode: the baseline, then one round per upgrade.
    let seen: Vec<(String, u64)> = rounds
        .iter()
        .map(|r| {
            (
                r["mode"].as_str().unwrap().to_string(),
                r["upgrade"].as_u64().unwrap(),
            )
        })
        .collect();
    let want: Vec<(String, u64)> = ["shadow", "adaptive"]
        .iter()
        .flat_map(|m| (0..=2).map(move |u| (m.to_string(), u)))
        .collect();
    assert_eq!(seen, want, "{stdout}");
    for r in rounds {
        assert!(r["ios"].as_u64().unwrap() > 0, "{r}");
        assert_eq!(r["errors"], 0, "{r}");
        assert_eq!(r["verify_errors"], 0, "{r}");
        let upgraded = r["upgrade"].as_u64().unwrap() > 0;
        assert_eq!(r["handover_ms"].as_f64().is_some(), upgraded, "{r}");
        for phase in ["drain", "save", "pass", "restore"] {
            assert_eq!(r["phases_ms"][phase].as_f64().is_some(), upgraded, "{r}");
        }
    }
    assert!(stdout.contains("shadow: stall"), "{stdout}");
}

/// A `ram` namespace is handed over too (its memfd): every read across 2
/// upgrades matches the last write of its block, written before or after.
#[test]
fn a_ram_namespace_is_upgraded_under_verified_io() {
    let dir = std::env::temp_dir().join(format!("vnvme-bench-upgrade-ram-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("upgrade.json");
    let out = Command::new(env!("CARGO_BIN_EXE_vnvme"))
        .args(["bench", "upgrade", "--modes", "shadow", "--upgrades", "2"])
        .args([
            "--interval",
            "0.4",
            "--qd",
            "8",
            "--backend",
            "ram",
            "--verify",
        ])
        .args(["--size", "16M", "--json", json.to_str().unwrap()])
        .output()
        .expect("running vnvme");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let rounds = doc["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 3, "{stdout}");
    for r in rounds {
        assert!(r["ios"].as_u64().unwrap() > 0, "{r}");
        assert_eq!(r["errors"], 0, "{r}");
        assert_eq!(r["verify_errors"], 0, "{r}");
    }
}
