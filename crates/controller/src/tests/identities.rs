//! Namespace identifiers (NGUID, EUI-64, UUID) and the controller's
//! serial number: unique between controllers, kept by Format NVM, new for
//! every namespace created, and a configuration that repeats one refused.

use super::namespaces::{mgmt_config, ram_ns};
use super::*;
use crate::config::{ConfigError, NamespaceIds};

/// EUI-64, NGUID and UUID of `nsid` from its descriptor list (CNS 03h),
/// checked against Identify Namespace's.
fn ids_of(h: &mut Host, nsid: u32) -> NamespaceIds {
    let id = h.identify_ns(0x00, nsid);
    let d = h.identify_page(0x03, nsid);
    assert_eq!(
        (d[0], d[1], d[12], d[13], d[32], d[33]),
        (1, 8, 2, 16, 3, 16)
    );
    let ids = NamespaceIds {
        eui64: d[4..12].try_into().unwrap(),
        nguid: d[16..32].try_into().unwrap(),
        uuid: d[36..52].try_into().unwrap(),
    };
    assert_eq!((id.eui64, id.nguid), (ids.eui64, ids.nguid), "nsid {nsid}");
    ids
}

fn serial(s: &str) -> ControllerConfig {
    ControllerConfig {
        serial: s.into(),
        ..mgmt_config(4 << 20)
    }
}

#[test]
fn controllers_with_other_serials_report_other_namespace_ids() {
    let mut a = Host::with_namespaces(serial("VNVME-A"), vec![ram_ns(1, 1 << 20)]);
    let mut b = Host::with_namespaces(serial("VNVME-B"), vec![ram_ns(1, 1 << 20)]);
    let mut a_again = Host::with_namespaces(serial("VNVME-A"), vec![ram_ns(1, 1 << 20)]);
    for h in [&mut a, &mut b, &mut a_again] {
        h.enable();
    }
    let (ia, ib) = (ids_of(&mut a, 1), ids_of(&mut b, 1));
    assert_eq!(ia.shared_with(&ib), None, "{ia:02x?} {ib:02x?}");
    assert_eq!(
        ids_of(&mut a_again, 1),
        ia,
        "the same configuration, the same ids"
    );
}

#[test]
fn configured_ids_are_reported_and_kept_by_format() {
    let given = NamespaceIds::from_name("given");
    let mut h = Host::with_namespaces(
        serial("S"),
        vec![ram_ns(1, 1 << 20).with_ids(given), ram_ns(2, 1 << 20)],
    );
    h.enable();
    assert_eq!(ids_of(&mut h, 1), given);
    let derived = ids_of(&mut h, 2);
    assert_eq!(derived, NamespaceIds::for_controller("S", 2));
    // Format NVM to 512-byte blocks: another namespace layout, the same one.
    assert_eq!(h.format(2, 0).status(), Status::SUCCESS);
    assert_eq!(h.identify_ns(0x00, 2).format_index(), 0);
    assert_eq!(ids_of(&mut h, 2), derived);
}

#[test]
fn a_namespace_created_in_a_deleted_ones_nsid_gets_new_ids() {
    let mut h = Host::with_namespaces(serial("S"), vec![ram_ns(1, 1 << 20)]);
    h.enable();
    let mut seen = vec![ids_of(&mut h, 1)];
    for _ in 0..3 {
        let c = h.create_ns(256, 256, 0);
        assert_eq!((c.status(), c.dw0.get()), (Status::SUCCESS, 2));
        assert_eq!(h.attach(2, true).status(), Status::SUCCESS);
        let ids = ids_of(&mut h, 2);
        for old in &seen {
            assert_eq!(ids.shared_with(old), None);
        }
        seen.push(ids);
        assert_eq!(h.attach(2, false).status(), Status::SUCCESS);
        assert_eq!(h.delete_ns(2).status(), Status::SUCCESS);
    }
}

#[test]
fn two_namespaces_with_one_identifier_are_refused() {
    let one = NamespaceIds::from_name("one");
    let other = NamespaceIds::from_name("other");
    for (second, what) in [
        (
            NamespaceIds {
                nguid: one.nguid,
                ..other
            },
            "NGUID",
        ),
        (
            NamespaceIds {
                eui64: one.eui64,
                ..other
            },
            "EUI-64",
        ),
        (
            NamespaceIds {
                uuid: one.uuid,
                ..other
            },
            "UUID",
        ),
    ] {
        let e = Controller::new(
            config(),
            vec![
                ram_ns(1, 1 << 20).with_ids(one),
                ram_ns(3, 1 << 20).with_ids(second),
            ],
        )
        .unwrap_err();
        assert!(
            matches!(e, ConfigError::DuplicateId { nsid: 3, other: 1, id } if id == what),
            "{e}"
        );
        assert!(e.to_string().contains(what), "{e}");
    }
}

#[test]
fn the_operator_cannot_add_a_namespace_with_a_taken_identifier() {
    let given = NamespaceIds::from_name("given");
    let mut h = Host::with_namespaces(serial("S"), vec![ram_ns(1, 1 << 20).with_ids(given)]);
    h.enable();
    let backend = Arc::new(RamDevice::new(1 << 20));
    let e = h
        .ctrl
        .namespace_add(backend.clone(), 0, None, true, Some(given))
        .unwrap_err();
    assert!(
        e.to_string().contains("namespace 1 has the same NGUID"),
        "{e}"
    );
    let nsid = h.ctrl.namespace_add(backend, 0, None, true, None).unwrap();
    assert_eq!(ids_of(&mut h, nsid).shared_with(&given), None);
}
