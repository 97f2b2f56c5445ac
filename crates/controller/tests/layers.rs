//! The controller's modules import each other without circles, and only
//! downwards in [`LAYERS`] (docs/architecture.md, "Inside the controller",
//! draws the same rows): every path a module writes (`use`, code, macro bodies), followed
//! through re-exports (`use crate::Controller` is an import of
//! `controller`), names a module in its own row or below. A module and its
//! own submodules count as one row; inside a module's folder its submodules
//! must not form a circle either. The scan is `vnvme-layers` (its own tests
//! plant each kind of hidden import); it checks every crate for circles.

use std::path::Path;

use vnvme_layers::Crate;

/// The controller's top-level modules, top row first.
const LAYERS: &[&[&str]] = &[
    &["controller"],
    &["saved_state"],
    &["worker"],
    &["admin", "io"],
    &["command"],
    &["inflight"],
    &["io_request"],
    &["state"],
    &["interrupts", "crash_record"],
    &["queue"],
    &["doorbell"],
    &["subsystem", "background"],
    &["namespace"],
    &["reporting", "features"],
    &["config", "regs"],
    &["vendor", "sgl"],
    &["prp"],
    &["stats"],
    &[
        "memory",
        "backend_error",
        "irq_batch",
        "keep_alive",
        "streams",
        "lifecycle",
        "protection",
        "zoned",
        "faults",
        "qos",
        "saved_check",
        "thread_slot",
    ],
];

#[test]
fn controller_modules_import_without_circles() {
    let krate = Crate::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"))
        .unwrap_or_else(|e| panic!("reading the controller's source: {e:?}"));
    assert!(krate.modules().count() > 20);
    // The scan sees real imports (else an empty graph would pass).
    assert!(krate.imports_from("worker", "queue"));
    let circles = krate.circles();
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    let upward = krate.layer_violations(LAYERS);
    assert!(upward.is_empty(), "{}", upward.join("\n"));
}
