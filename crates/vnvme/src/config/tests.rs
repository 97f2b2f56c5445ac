//! The config file: every key, its errors, and the example in the docs.

use super::*;
use vnvme_controller::PiType;

const EXAMPLE: &str = r#"serial = "VNVME0042"
model = "vnvme slow-start"
doorbells = "trap"
max_io_queues = 8
msix_vectors = 4
workers = 2
ready_timeout = "3s"
max_namespaces = 8
nvm_capacity = "2G"
format_duration = "100ms"
sanitize_rate = "64M"
self_test_rate = 1048576
nssr = true

[[namespaces]]
size = "1G"
backend = "null"

[[namespaces]]
size = 1048576
ready = "250ms"
format = 0

[[namespaces]]
size = "64M"
never_ready = true
attached = false
"#;

fn err(text: &str) -> String {
    ServeConfig::parse("config.toml", text)
        .unwrap_err()
        .to_string()
}

#[test]
fn protection_keys_parse_and_are_checked() {
    let text = "[[namespaces]]\nsize = \"1M\"\nformat = 6\npi = 2\npil = \"first\"\n";
    let c = ServeConfig::parse("config.toml", text).unwrap();
    let want = Protection {
        pi_type: PiType::Type2,
        first: true,
    };
    assert_eq!(c.namespaces[0].protection, Some(want));
    let no_room = err("[[namespaces]]\nsize = \"1M\"\npi = 1\n");
    assert!(
        no_room.contains("config.toml:3: namespaces[0].pi: protection information needs"),
        "{no_room}"
    );
    let bad = err("[[namespaces]]\nsize = \"1M\"\nformat = 4\npi = 5\n");
    assert!(bad.contains("namespaces[0].pi: pi '5'"), "{bad}");
    let alone = err("[[namespaces]]\nsize = \"1M\"\nformat = 4\npil = \"last\"\n");
    assert!(alone.contains("pil needs pi"), "{alone}");
}

#[test]
fn example_file_parses() {
    let c = ServeConfig::parse("config.toml", EXAMPLE).unwrap();
    assert_eq!(c.serial.as_deref(), Some("VNVME0042"));
    assert_eq!(c.model.as_deref(), Some("vnvme slow-start"));
    assert_eq!(c.doorbells, Some(DoorbellMode::Trap));
    assert_eq!(
        (c.max_io_queues, c.msix_vectors, c.workers),
        (Some(8), Some(4), Some(2))
    );
    assert_eq!(c.ready_timeout, Some(Duration::from_secs(3)));
    assert_eq!(c.max_namespaces, Some(8));
    assert_eq!(c.nvm_capacity, Some(2 << 30));
    assert_eq!(c.format_duration, Some(Duration::from_millis(100)));
    assert_eq!(c.sanitize_rate, Some(64 << 20));
    assert_eq!(c.self_test_rate, Some(1 << 20));
    assert_eq!(c.nssr, Some(true));
    assert_eq!(c.namespaces.len(), 3);
    assert_eq!(c.namespaces[0], NamespaceSpec::new(1 << 30, Backend::Null));
    let ns = &c.namespaces[1];
    assert_eq!((ns.size, ns.format), (1 << 20, Some(0)));
    assert_eq!(ns.readiness, Readiness::After(Duration::from_millis(250)));
    let ns = &c.namespaces[2];
    assert_eq!(ns.readiness, Readiness::Never);
    assert!(!ns.attached);
}

#[test]
fn interrupts_key_picks_msi_and_names_the_kinds_when_wrong() {
    let c = ServeConfig::parse("config.toml", "interrupts = \"msi\"\n").unwrap();
    assert_eq!(c.interrupts, Some(Interrupts::Msi));
    assert_eq!(
        c.apply(&DeviceOptions::default()).interrupts,
        Interrupts::Msi
    );
    let e = err("serial = \"x\"\ninterrupts = \"intx\"\n");
    assert!(
        e.starts_with("config.toml:2: interrupts: unknown interrupt kind"),
        "{e}"
    );
    assert!(e.contains("msix | msi"), "{e}");
}

#[test]
fn identities_are_checked_where_they_are_written() {
    let text = "nqn = \"nqn.2024-01.com.example:a\"\n[[namespaces]]\nsize = \"1M\"\n\
                uuid = \"5d1e7a2c-3f4b-4e8e-9a61-0c2b7d9fe310\"\n";
    let c = ServeConfig::parse("config.toml", text).unwrap();
    assert_eq!(c.nqn.as_deref(), Some("nqn.2024-01.com.example:a"));
    assert_eq!(c.namespaces[0].ids.uuid.map(|u| u[0]), Some(0x5d));
    let e = err("serial = \"a serial number much too long\"\n");
    assert!(
        e.starts_with("config.toml:1: serial: serial 'a serial"),
        "{e}"
    );
    let e = err("nqn = \"disk1\"\n");
    assert!(
        e.starts_with("config.toml:1: nqn: NQN 'disk1' must start with 'nqn.'"),
        "{e}"
    );
    let e = err("[[namespaces]]\nsize = \"1M\"\nnguid = \"0\"\n");
    assert!(
        e.starts_with("config.toml:3: namespaces[0].nguid: nguid '0' must be 32"),
        "{e}"
    );
}

#[test]
fn nbd_namespace_takes_the_exports_size_unless_given() {
    let text = "[[namespaces]]\nbackend = \"nbd=nbd://storage:10809/vm1\"\n";
    let c = ServeConfig::parse("config.toml", text).unwrap();
    let uri = "nbd://storage:10809/vm1".to_string();
    assert_eq!(c.namespaces[0], NamespaceSpec::new(0, Backend::Nbd(uri)));
    assert!(err("[[namespaces]]\nbackend = \"nbd=nbds://h/e\"\n").contains("TLS is not supported"));
}

#[test]
fn command_line_overrides_the_file_where_it_differs_from_the_default() {
    let c = ServeConfig::parse("config.toml", EXAMPLE).unwrap();
    let cli = DeviceOptions {
        max_io_queues: 2,
        ..DeviceOptions::default()
    };
    let o = c.apply(&cli);
    assert_eq!(o.max_io_queues, 2, "flag wins");
    assert_eq!(
        o.serial.as_deref(),
        Some("VNVME0042"),
        "file wins over a default"
    );
    assert_eq!(o.msix_vectors, Some(4));
    assert_eq!(o.doorbells, DoorbellMode::Trap);
    assert_eq!(o.ready_timeout, Some(Duration::from_secs(3)));
    assert_eq!(o.nvm_capacity, Some(2 << 30));
}

#[test]
fn invalid_duration_names_line_and_field() {
    let text = EXAMPLE.replace("ready = \"250ms\"", "ready = \"soon\"");
    assert_eq!(
            err(&text),
            "config.toml:21: namespaces[1].ready: invalid duration 'soon': use a number with a unit, e.g. 250ms, 5s or 1m"
        );
}

#[test]
fn type_and_unknown_field_errors_name_line_and_field() {
    let e = err("max_io_queues = \"many\"\n");
    assert!(e.starts_with("config.toml:1: max_io_queues: "), "{e}");
    assert!(e.contains("invalid type"), "{e}");
    let e = err("[[namespaces]]\nsize = \"1G\"\n\n[[namespaces]]\nsize = \"1G\"\nspeed = 3\n");
    assert!(e.starts_with("config.toml:6: namespaces[1].speed: "), "{e}");
    assert!(e.contains("unknown field `speed`"), "{e}");
    let e = err("[[namespaces]]\nsize = \"1G\"\nattached = \"no\"\n");
    assert!(
        e.starts_with("config.toml:3: namespaces[0].attached: "),
        "{e}"
    );
    let e = err("serial = \"x\"\nmax_io_queues = \n");
    assert!(e.starts_with("config.toml:2: "), "{e}");
}

#[test]
fn client_limits_and_deadlines_parse_and_are_checked() {
    let c = ServeConfig::parse(
            "config.toml",
            "max_dma_maps = 64\nmax_dma_size = \"64G\"\nhandshake_timeout = \"2s\"\nmessage_timeout = \"500ms\"\nstop_timeout = \"3s\"\n",
        )
        .unwrap();
    assert_eq!(c.max_dma_maps, Some(64));
    assert_eq!(c.max_dma_size, Some(64 << 30));
    assert_eq!(c.handshake_timeout, Some(Duration::from_secs(2)));
    assert_eq!(c.message_timeout, Some(Duration::from_millis(500)));
    assert_eq!(c.stop_timeout, Some(Duration::from_secs(3)));
    assert_eq!(
        err("max_dma_maps = 20000\n"),
        "config.toml:1: max_dma_maps: 20000 is out of range 1..=16384"
    );
    assert_eq!(
        err("max_dma_size = 0\n"),
        "config.toml:1: max_dma_size: must be more than 0"
    );
    assert_eq!(
        err("\nmessage_timeout = \"0s\"\n"),
        "config.toml:2: message_timeout: must be more than 0"
    );
    assert_eq!(
        err("stop_timeout = \"0\"\n"),
        "config.toml:1: stop_timeout: must be more than 0"
    );
}

#[test]
fn semantic_errors_name_line_and_field() {
    assert_eq!(
        err("workers = 2\nmax_io_queues = 0\n"),
        "config.toml:2: max_io_queues: 0 is out of range 1..=255"
    );
    assert!(err("doorbells = \"fast\"\n")
        .starts_with("config.toml:1: doorbells: unknown doorbell mode"));
    assert!(err("[[namespaces]]\nsize = \"1G\"\nformat = 9\n")
        .starts_with("config.toml:3: namespaces[0].format: LBA format 9 does not exist"));
    assert!(err("[[namespaces]]\nsize = \"lots\"\n")
        .starts_with("config.toml:2: namespaces[0].size: 'lots' is not a size"));
    assert!(err("[[namespaces]]\nsize = 1000\n")
        .starts_with("config.toml:2: namespaces[0].size: namespace size 1000 must be"));
    assert!(err("[[namespaces]]\nbackend = \"ram\"\n").contains("namespaces[0]: size is missing"));
    assert!(err("[[namespaces]]\nsize = \"1G\"\nbackend = \"disk\"\n")
        .starts_with("config.toml:3: namespaces[0].backend: unknown backend 'disk'"));
    assert!(
        err("[[namespaces]]\nsize = \"1G\"\nready = \"1s\"\nnever_ready = true\n")
            .starts_with("config.toml:4: namespaces[0].never_ready: ")
    );
    assert!(err("ready_timeout = \"5\"\n")
        .starts_with("config.toml:1: ready_timeout: invalid duration '5'"));
}

#[test]
fn zoned_namespaces_parse_and_are_checked() {
    let text = "[[namespaces]]\nsize = \"1G\"\nzoned = true\nzone_size = \"32M\"\nmax_open_zones = 4\nzone_extension_size = 128\n";
    let c = ServeConfig::parse("config.toml", text).unwrap();
    let z = c.namespaces[0].zoned.unwrap();
    assert_eq!(
        (z.zone_size, z.max_open, z.max_active, z.extension_size),
        (32 << 20, Some(4), Some(4), 128)
    );
    assert!(err("[[namespaces]]\nsize = \"1G\"\nzone_size = \"32M\"\n")
        .contains("namespaces[0].zoned: a zone setting is for zoned namespaces: add zoned = true"));
    assert!(
        err("[[namespaces]]\nsize = \"1G\"\nzoned = true\nzone_size = \"48M\"\n").starts_with(
            "config.toml:3: namespaces[0].zoned: zone size 50331648 must be a power of two"
        )
    );
}

fn many(text: &str) -> Result<ServeFile, String> {
    ServeFile::parse("serve.toml", text).map_err(|e| e.to_string())
}

const TWO: &str = r#"workers = 2

[[controllers]]
socket = "/run/vnvme-a.sock"
control = "/run/vnvme-a.ctl"
serial = "DISK-A"
doorbells = "shadow"
[[controllers.namespaces]]
size = "1G"
[[controllers.fault]]
kind = "status"
nsid = 1
opcodes = ["read"]
status = "unrecovered-read-error"
probability = 0.5

[[controllers]]
socket = "/run/vnvme-b.sock"
[[controllers.namespaces]]
size = "64M"
[[controllers.namespaces]]
size = "32M"
backend = "null"
"#;

#[test]
fn controllers_tables_are_each_a_whole_controller() {
    let ServeFile::Many {
        workers,
        controllers,
    } = many(TWO).unwrap()
    else {
        panic!("not several controllers");
    };
    assert_eq!(workers, Some(2));
    assert_eq!(controllers.len(), 2);
    let (a, b) = (&controllers[0], &controllers[1]);
    assert_eq!(a.socket, std::path::PathBuf::from("/run/vnvme-a.sock"));
    assert_eq!(a.control.as_deref(), Some(Path::new("/run/vnvme-a.ctl")));
    assert_eq!(a.config.serial.as_deref(), Some("DISK-A"));
    assert_eq!(a.config.doorbells, Some(DoorbellMode::Shadow));
    assert_eq!(a.config.namespaces.len(), 1);
    assert_eq!(a.config.faults.len(), 1);
    assert_eq!(b.control, None);
    assert_eq!(b.config.namespaces.len(), 2);
    assert_eq!(b.config.namespaces[1].backend, Backend::Null);
    // A file without [[controllers]] is one controller, as before.
    assert!(matches!(many(EXAMPLE).unwrap(), ServeFile::One(_)));
    // ... and the one-controller reader refuses several.
    assert!(ServeConfig::parse("serve.toml", TWO)
        .unwrap_err()
        .to_string()
        .contains("several controllers"));
}

#[test]
fn controllers_errors_name_the_table_and_field() {
    let bad_size = TWO.replace("size = \"32M\"", "size = \"lots\"");
    let e = many(&bad_size).unwrap_err();
    assert!(
        e.starts_with("serve.toml:22: controllers[1].namespaces[1].size: "),
        "{e}"
    );
    let bad_doorbells = TWO.replace("\"shadow\"", "\"sometimes\"");
    let e = many(&bad_doorbells).unwrap_err();
    assert!(
        e.starts_with("serve.toml:7: controllers[0].doorbells: "),
        "{e}"
    );
    // An unknown key: serde's error, placed by field_at.
    let unknown = TWO.replace("probability = 0.5", "probability = 0.5\nbogus = 1");
    let e = many(&unknown).unwrap_err();
    assert!(e.contains("controllers[0].fault[0]"), "{e}");
}

#[test]
fn controllers_without_socket_or_with_the_same_one_are_refused() {
    let e = many("[[controllers]]\nserial = \"A\"\n").unwrap_err();
    assert!(
        e.starts_with("serve.toml:1: controllers[0]: socket is missing"),
        "{e}"
    );
    let same = TWO.replace("/run/vnvme-b.sock", "/run/vnvme-a.sock");
    let e = many(&same).unwrap_err();
    assert!(
        e.contains("controllers[1].socket: /run/vnvme-a.sock is also controllers[0].socket"),
        "{e}"
    );
    let control_is_a_socket = TWO.replace("/run/vnvme-a.ctl", "/run/vnvme-b.sock");
    let e = many(&control_is_a_socket).unwrap_err();
    assert!(e.contains("controllers[1].socket"), "{e}");
    let serial = TWO.replace(
        "socket = \"/run/vnvme-b.sock\"",
        "socket = \"/run/vnvme-b.sock\"\nserial = \"DISK-A\"",
    );
    let e = many(&serial).unwrap_err();
    assert!(
        e.contains("controllers[1].serial: 'DISK-A' is also controllers[0]'s serial"),
        "{e}"
    );
}

#[test]
fn controller_keys_at_the_top_level_with_controllers_are_refused() {
    let e = many(&format!("doorbells = \"trap\"\n{TWO}")).unwrap_err();
    assert!(
        e.starts_with("serve.toml:1: doorbells: with [[controllers]], doorbells belongs inside"),
        "{e}"
    );
    let e = many(&TWO.replace("serial = \"DISK-A\"", "workers = 3")).unwrap_err();
    assert!(
        e.contains("controllers[0].workers: workers is process-wide"),
        "{e}"
    );
    let e = many(&TWO.replace("workers = 2", "workers = 0")).unwrap_err();
    assert!(
        e.starts_with("serve.toml:1: workers: 0 is out of range"),
        "{e}"
    );
    let e = many("socket = \"/run/x.sock\"\n").unwrap_err();
    assert!(
        e.contains("socket is a key of [[controllers]] tables; for one controller give --socket"),
        "{e}"
    );
    let e = many("[[controllers]]\nsocket = \"a\"\n[[controllers.controllers]]\nsocket = \"b\"\n")
        .unwrap_err();
    assert!(e.contains("do not nest"), "{e}");
}
