//! The scan on small made-up crates: each way an import can hide.

use super::Crate;

fn circles(files: &[(&str, &str)]) -> Vec<String> {
    Crate::from_files("src/lib.rs", files)
        .unwrap()
        .circles()
        .iter()
        .map(|c| format!("{}: {}", c.folder, c.units.join(" -> ")))
        .collect()
}

#[test]
fn a_circle_through_use_super_and_code_paths_is_found() {
    let found = circles(&[
        ("src/lib.rs", "mod a; mod b; mod c;"),
        ("src/a.rs", "use crate::b::X;"),
        ("src/b.rs", "pub struct X; use super::c::Y;"),
        ("src/c.rs", "pub struct Y; fn f() { crate::a::g() }"),
    ]);
    assert_eq!(found, [": a -> b -> c -> a"]);
}

#[test]
fn an_import_through_a_crate_root_re_export_is_seen() {
    let files = [
        (
            "src/lib.rs",
            "mod controller; mod queue; pub use controller::Controller;",
        ),
        (
            "src/controller.rs",
            "pub struct Controller; use crate::queue::Q;",
        ),
        ("src/queue.rs", "pub struct Q; use crate::Controller;"),
    ];
    let krate = Crate::from_files("src/lib.rs", &files).unwrap();
    assert!(
        krate.imports_from("queue", "controller"),
        "{:?}",
        krate.imports()
    );
    let layers: &[&[&str]] = &[&["controller"], &["queue"]];
    let bad = krate.layer_violations(layers);
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(bad[0].starts_with("queue imports controller"), "{bad:?}");
    assert_eq!(circles(&files), [": controller -> queue -> controller"]);
}

#[test]
fn re_exports_are_followed_through_folders_globs_and_renames() {
    let files = [
        ("src/lib.rs", "mod a; mod b; mod c; mod d;"),
        ("src/a/mod.rs", "mod inner; pub use inner::*;"),
        ("src/a/inner.rs", "pub fn deep() {}"),
        (
            "src/b.rs",
            "use crate::a as alias; fn f() { alias::deep() }",
        ),
        ("src/c.rs", "pub use crate::b as again;"),
        ("src/d.rs", "fn f() { crate::c::again::x(); }"),
    ];
    let krate = Crate::from_files("src/lib.rs", &files).unwrap();
    assert!(krate.imports_from("b", "a::inner"), "{:?}", krate.imports());
    assert!(krate.imports_from("d", "b"), "{:?}", krate.imports());
}

#[test]
fn a_circle_inside_a_folder_is_found() {
    let found = circles(&[
        ("src/lib.rs", "mod admin;"),
        (
            "src/admin/mod.rs",
            "mod identify; mod format; pub use format::Lbaf; pub struct Ctx;",
        ),
        // Through the parent's re-export, and from a macro body.
        ("src/admin/identify.rs", "use super::{Ctx, Lbaf};"),
        (
            "src/admin/format.rs",
            "pub struct Lbaf; fn f() { debug!(\"{}\", super::identify::g()); }",
        ),
    ]);
    assert_eq!(found, ["admin: format -> identify -> format"]);
}

#[test]
fn a_circle_through_a_submodule_is_a_circle_of_its_units() {
    // a::c -> b -> a (its parent): units a and b import each other.
    let found = circles(&[
        ("src/lib.rs", "mod a; mod b;"),
        ("src/a.rs", "mod c; pub struct T;"),
        ("src/a/c.rs", "use crate::b::U;"),
        ("src/b.rs", "pub struct U; use crate::a::T;"),
    ]);
    assert_eq!(found, [": a -> b -> a"]);
}

#[test]
fn parents_children_tests_comments_and_other_crates_are_no_imports() {
    let files = [
        (
            "src/lib.rs",
            "mod a; mod b; #[cfg(test)] mod tests; #[cfg(any(test, feature = \"testing\"))] mod testing;",
        ),
        // Its own submodule, another crate, std, and a doc link.
        (
            "src/a.rs",
            "mod sub; use sub::S; use other_crate::b::X; /// [`crate::b`]\nfn f() -> std::io::Result<()> { Ok(()) }",
        ),
        ("src/a/sub.rs", "pub struct S; use super::super::a::f;"),
        (
            "src/b.rs",
            "use crate::a::f;\n#[cfg(test)]\nmod tests { use crate::b; }\n#[cfg(test)]\nfn g() { crate::b::h() }",
        ),
        // Test-only modules are never read.
        ("src/tests.rs", "this is not rust"),
    ];
    let krate = Crate::from_files("src/lib.rs", &files).unwrap();
    let imports: Vec<String> = krate
        .imports()
        .iter()
        .map(|i| format!("{} -> {}", i.from, i.to))
        .collect();
    assert_eq!(
        imports,
        ["a -> a::sub", "a::sub -> a", "b -> a"],
        "{:?}",
        krate.imports()
    );
    assert!(krate.circles().is_empty());
}

#[test]
fn a_module_in_no_row_of_the_layers_is_reported() {
    let krate = Crate::from_files(
        "src/lib.rs",
        &[
            ("src/lib.rs", "mod a; mod new;"),
            ("src/a.rs", ""),
            ("src/new.rs", ""),
        ],
    )
    .unwrap();
    let layers: &[&[&str]] = &[&["a"]];
    assert_eq!(
        krate.layer_violations(layers),
        ["module new is in no row of the layers"]
    );
}

#[test]
fn a_missing_module_file_is_an_error() {
    let err = Crate::from_files("src/lib.rs", &[("src/lib.rs", "mod gone;")]).unwrap_err();
    assert_eq!(err.to_string(), "module file src/gone.rs not found");
}
