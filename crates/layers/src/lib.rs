//! Dev-only: a crate's modules import each other without circles, and, where
//! a crate keeps a table of layers, only downwards in it.
//!
//! The source is parsed with `syn`, not scanned as text: `use` trees, paths
//! in code and inside macro bodies all count; doc comments and
//! `#[cfg(test)]` code do not. Every path is followed through re-exports to
//! the module that defines the item (`use crate::Controller` is an import of
//! `controller` when the root re-exports it).
//!
//! Circles are looked for in every folder, not only at the crate root: in a
//! module's folder its submodules are the units (each with its own
//! submodules), and an import between two of them is an edge; a module's
//! imports of its own ancestors or descendants are none (a parent and its
//! submodules are one concept). So `admin::identify -> admin::format ->
//! admin::identify` is a circle, and so is `a -> b -> a::c`.
//!
//! `tests/workspace.rs` checks every crate of the workspace; the controller's
//! `tests/layers.rs` also checks its table of layers.
//! `tests/dropped_causes.rs` checks that every `map_err(|_| ..)` outside
//! tests says in a comment why the cause it drops carries nothing.

#![forbid(unsafe_code)]

mod load;
mod resolve;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

pub use load::Key;
use load::Module;
use resolve::Resolver;

/// Reading a crate's source failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("module file {} not found", .0.display())]
    Missing(PathBuf),
    #[error("parsing {}", file.display())]
    Parse {
        file: PathBuf,
        #[source]
        source: syn::Error,
    },
}

/// One module naming another, and where.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Import {
    pub from: Key,
    pub to: Key,
    /// The file and line of the path, and the path as written.
    pub file: PathBuf,
    pub line: usize,
    pub path: String,
}

impl fmt::Display for Import {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} -> {} ({}:{} `{}`)",
            name(&self.from),
            name(&self.to),
            self.file.display(),
            self.line,
            self.path
        )
    }
}

fn name(key: &str) -> &str {
    if key.is_empty() {
        "crate"
    } else {
        key
    }
}

/// A crate's modules and their imports.
#[derive(Debug)]
pub struct Crate {
    modules: BTreeMap<Key, Module>,
    imports: Vec<Import>,
}

impl Crate {
    /// The crate whose root file is `root` (`src/lib.rs`, `src/main.rs`).
    pub fn read(root: &Path) -> Result<Crate, LoadError> {
        let read = |p: &Path| std::fs::read_to_string(p).ok();
        Crate::load(&read, root)
    }

    /// A crate from a table of files (`path -> text`), for tests.
    pub fn from_files(root: &str, files: &[(&str, &str)]) -> Result<Crate, LoadError> {
        let files: BTreeMap<PathBuf, String> = files
            .iter()
            .map(|(p, t)| (PathBuf::from(p), (*t).to_owned()))
            .collect();
        let read = |p: &Path| files.get(p).cloned();
        Crate::load(&read, Path::new(root))
    }

    fn load(read: load::Reader, root: &Path) -> Result<Crate, LoadError> {
        let modules = load::load(read, root)?;
        let resolver = Resolver { modules: &modules };
        let mut imports = BTreeSet::new();
        for (from, module) in &modules {
            for r in &module.refs {
                let Some(to) = resolver.target(from, &r.path) else {
                    continue;
                };
                if to != *from {
                    imports.insert(Import {
                        from: from.clone(),
                        to,
                        file: module.file.clone(),
                        line: r.line,
                        path: r.path.join("::"),
                    });
                }
            }
        }
        let imports = imports.into_iter().collect();
        Ok(Crate { modules, imports })
    }

    /// Every module, by key ("" is the root).
    pub fn modules(&self) -> impl Iterator<Item = &str> {
        self.modules.keys().map(String::as_str)
    }

    /// Every import of one module by another.
    pub fn imports(&self) -> &[Import] {
        &self.imports
    }

    /// Whether module `from` (or one of its submodules) imports `to` (or
    /// one of its submodules).
    pub fn imports_from(&self, from: &str, to: &str) -> bool {
        self.imports
            .iter()
            .any(|i| within(&i.from, from) && within(&i.to, to))
    }

    /// The imports between units of one folder: for each folder (a module
    /// with submodules, "" for the root), `(unit, unit) -> first import`.
    fn folder_edges(&self) -> BTreeMap<Key, BTreeMap<(String, String), &Import>> {
        let mut out: BTreeMap<Key, BTreeMap<(String, String), &Import>> = BTreeMap::new();
        for import in &self.imports {
            let from: Vec<&str> = parts(&import.from);
            let to: Vec<&str> = parts(&import.to);
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            // One is the other's ancestor: one concept.
            if common == from.len() || common == to.len() {
                continue;
            }
            let folder = from[..common].join("::");
            let edge = (from[common].to_owned(), to[common].to_owned());
            out.entry(folder).or_default().entry(edge).or_insert(import);
        }
        out
    }

    /// Every import circle: per folder, each set of units that reach each
    /// other, as one circle through them with the imports that make it.
    pub fn circles(&self) -> Vec<Circle> {
        let mut out = Vec::new();
        for (folder, edges) in self.folder_edges() {
            let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
            for (a, b) in edges.keys() {
                next.entry(a.as_str()).or_default().insert(b.as_str());
            }
            let mut seen = BTreeSet::new();
            for &start in next.keys() {
                if seen.contains(start) {
                    continue;
                }
                let Some(path) = shortest_path(&next, start, start) else {
                    continue;
                };
                // The whole set that reaches `start` and is reached from it.
                let from_start = reachable(&next, start);
                for &m in &from_start {
                    if reachable(&next, m).contains(start) {
                        seen.insert(m);
                    }
                }
                let imports = path
                    .windows(2)
                    .map(|w| edges[&(w[0].to_owned(), w[1].to_owned())].clone())
                    .collect();
                out.push(Circle {
                    folder: folder.clone(),
                    units: path.iter().map(|s| (*s).to_owned()).collect(),
                    imports,
                });
            }
        }
        out
    }

    /// The imports at the crate root that go up `layers` (top row first;
    /// each row names top-level modules), and the top-level modules in no
    /// row.
    pub fn layer_violations(&self, layers: &[&[&str]]) -> Vec<String> {
        let row = |unit: &str| layers.iter().position(|r| r.contains(&unit));
        let mut out = Vec::new();
        if let Some(root) = self.modules.get("") {
            for child in &root.children {
                if row(child).is_none() {
                    out.push(format!("module {child} is in no row of the layers"));
                }
            }
        }
        for ((a, b), import) in self.folder_edges().remove("").unwrap_or_default() {
            if let (Some(ra), Some(rb)) = (row(&a), row(&b)) {
                if rb < ra {
                    out.push(format!("{a} imports {b}, a row above it: {import}"));
                }
            }
        }
        out
    }
}

/// Units of one folder that import each other in a ring.
#[derive(Debug, Clone)]
pub struct Circle {
    /// The folder ("" is the crate root).
    pub folder: Key,
    /// The ring, its first unit again at the end.
    pub units: Vec<String>,
    /// The import behind each step.
    pub imports: Vec<Import>,
}

impl fmt::Display for Circle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "in {}: {}", name(&self.folder), self.units.join(" -> "))?;
        for i in &self.imports {
            write!(f, "\n    {i}")?;
        }
        Ok(())
    }
}

fn parts(key: &str) -> Vec<&str> {
    if key.is_empty() {
        Vec::new()
    } else {
        key.split("::").collect()
    }
}

/// `key` is `unit` or below it.
fn within(key: &str, unit: &str) -> bool {
    key == unit || key.starts_with(&format!("{unit}::"))
}

fn reachable<'a>(next: &BTreeMap<&'a str, BTreeSet<&'a str>>, from: &'a str) -> BTreeSet<&'a str> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from];
    while let Some(m) = todo.pop() {
        for &n in next.get(m).into_iter().flatten() {
            if seen.insert(n) {
                todo.push(n);
            }
        }
    }
    seen
}

/// The shortest walk from `from` to `to` of one step or more.
fn shortest_path<'a>(
    next: &BTreeMap<&'a str, BTreeSet<&'a str>>,
    from: &'a str,
    to: &'a str,
) -> Option<Vec<&'a str>> {
    let mut back: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([from]);
    while let Some(m) = queue.pop_front() {
        for &n in next.get(m).into_iter().flatten() {
            if n == to {
                let mut path = vec![n, m];
                let mut cur = m;
                while cur != from {
                    cur = back[cur];
                    path.push(cur);
                }
                path.reverse();
                return Some(path);
            }
            if n != from && !back.contains_key(n) {
                back.insert(n, m);
                queue.push_back(n);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests;
