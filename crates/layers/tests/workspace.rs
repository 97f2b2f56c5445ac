//! Every crate of the workspace (and the fuzz crate) imports without
//! circles between its modules, in any folder.

use std::path::Path;

use vnvme_layers::Crate;

#[test]
fn no_crate_has_an_import_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut roots: Vec<_> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path().join("src"))
        .collect();
    roots.push(root.join("fuzz/src"));
    let mut checked = 0;
    let mut found = Vec::new();
    for src in roots {
        for file in ["lib.rs", "main.rs"] {
            let path = src.join(file);
            if !path.exists() {
                continue;
            }
            let krate = Crate::read(&path).unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
            // The scan sees modules and imports (an empty graph would pass).
            checked += krate.modules().count();
            found.extend(
                krate
                    .circles()
                    .iter()
                    .map(|c| format!("{}: {c}", path.display())),
            );
        }
    }
    assert!(checked > 200, "only {checked} modules found");
    assert!(
        found.is_empty(),
        "{} import circles:\n{}",
        found.len(),
        found.join("\n")
    );
}
