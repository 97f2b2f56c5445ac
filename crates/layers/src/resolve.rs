//! Which module a path names: `crate::`, `self::`, `super::`, a submodule's
//! name or a name a `use` brought in, followed through every re-export
//! (`pub use`, a parent's `use`, globs) to the module that defines the item.
//! `use crate::Controller` in `queue` is an import of `controller` when the
//! crate root says `pub use controller::Controller`.

use std::collections::BTreeMap;

use crate::load::{Key, Module};

/// Re-exports followed at most this deep (a `use` naming itself ends here).
const MAX_DEPTH: usize = 32;

pub struct Resolver<'m> {
    pub modules: &'m BTreeMap<Key, Module>,
}

fn segments(key: &str) -> Vec<String> {
    if key.is_empty() {
        Vec::new()
    } else {
        key.split("::").map(str::to_owned).collect()
    }
}

fn key_of(segments: &[String]) -> Key {
    segments.join("::")
}

impl Resolver<'_> {
    /// The module `path` (written in module `at`) leads to, or `None`
    /// when it names nothing of this crate (std, another crate, a local).
    pub fn target(&self, at: &str, path: &[String]) -> Option<Key> {
        let absolute = self.absolute(at, path, true, 0)?;
        self.locate(&absolute, 0)
    }

    /// `path` written in `at` as a path from the crate root.
    fn absolute(
        &self,
        at: &str,
        path: &[String],
        local: bool,
        depth: usize,
    ) -> Option<Vec<String>> {
        if depth > MAX_DEPTH {
            return None;
        }
        let (first, rest) = path.split_first()?;
        let here = segments(at);
        let module = self.modules.get(at)?;
        let mut out = match first.as_str() {
            "crate" => Vec::new(),
            "self" => here,
            "super" => {
                let mut up = here;
                up.pop()?;
                let mut rest = rest;
                while let Some(("super", tail)) = rest.split_first().map(|(s, t)| (s.as_str(), t)) {
                    up.pop()?;
                    rest = tail;
                }
                up.extend(rest.iter().cloned());
                return Some(up);
            }
            name if module.children.contains(name) => {
                let mut p = here;
                p.push(name.to_owned());
                p
            }
            name => {
                let used = module
                    .uses
                    .get(name)
                    .or_else(|| local.then(|| module.local_uses.get(name)).flatten())?;
                // A `use` path is written in the module that holds it.
                self.absolute(at, used, false, depth + 1)?
            }
        };
        out.extend(rest.iter().cloned());
        Some(out)
    }

    /// The module that defines what `absolute` names.
    fn locate(&self, absolute: &[String], depth: usize) -> Option<Key> {
        if depth > MAX_DEPTH {
            return None;
        }
        let mut here: Vec<String> = Vec::new();
        for (i, seg) in absolute.iter().enumerate() {
            let key = key_of(&here);
            let module = self.modules.get(&key)?;
            if module.children.contains(seg) {
                here.push(seg.clone());
                continue;
            }
            if module.defined.contains(seg) {
                return Some(key);
            }
            if let Some(used) = module.uses.get(seg) {
                // Re-exported (or imported, which submodules also see):
                // follow it; a name of another crate is no import.
                let mut target = self.absolute(&key, used, false, depth + 1)?;
                target.extend(absolute[i + 1..].iter().cloned());
                return self.locate(&target, depth + 1);
            }
            for glob in &module.globs {
                let Some(from) = self.absolute(&key, glob, false, depth + 1) else {
                    continue;
                };
                let Some(source) = self.modules.get(&key_of(&from)) else {
                    continue;
                };
                if source.children.contains(seg)
                    || source.defined.contains(seg)
                    || source.uses.contains_key(seg)
                {
                    let mut target = from;
                    target.extend(absolute[i..].iter().cloned());
                    return self.locate(&target, depth + 1);
                }
            }
            // A name the scan does not see defined (made by a macro, a
            // variant, a method): of this module.
            return Some(key);
        }
        Some(key_of(&here))
    }
}
