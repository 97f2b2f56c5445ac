//! No error is dropped without a word: outside tests, every
//! `map_err(|_| ..)` has a comment in the lines just above it that says why
//! the cause carries nothing (or the cause is chained instead).

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            // Test folders (`src/tests/`, `tests/`, `benches/`) may drop causes.
            if !matches!(name.as_str(), "tests" | "benches" | "target" | "corpus") {
                sources(&path, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            out.push(path);
        }
    }
}

/// `file:line` of each `map_err(|_|` with no `//` comment in the three
/// lines above it (or on its own line), outside a file's unit tests.
fn uncommented(text: &str) -> Vec<usize> {
    let code = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if !line.contains("map_err(|_|") {
            continue;
        }
        let commented = lines[i.saturating_sub(3)..=i]
            .iter()
            .any(|l| l.trim_start().starts_with("//") || l.contains(" // "));
        if !commented {
            out.push(i + 1);
        }
    }
    out
}

#[test]
fn every_dropped_error_says_why() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    sources(&root.join("crates"), &mut files);
    sources(&root.join("fuzz/src"), &mut files);
    assert!(files.len() > 200, "only {} files", files.len());
    let mut bad = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for line in uncommented(&text) {
            bad.push(format!("{}:{line}", file.display()));
        }
    }
    assert!(
        bad.is_empty(),
        "map_err(|_| ..) drops an error with no comment saying why (chain it, or say why it carries nothing):\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_check_sees_an_uncommented_drop() {
    let text = "fn f() {\n    let a = x.map_err(|_| E)?;\n    // The value says it all.\n    let b = y.map_err(|_| E)?;\n}\n#[cfg(test)]\nmod tests {\n    fn g() { z.map_err(|_| E); }\n}\n";
    assert_eq!(uncommented(text), [2]);
}
