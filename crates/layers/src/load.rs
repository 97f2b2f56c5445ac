//! Reading a crate's module tree from its source: each module's children,
//! the names it defines, the names its `use` items bring in, and every path
//! its code writes (in `use` trees, in code, in macro bodies), with the line.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::visit::Visit;
use syn::{Attribute, Item, Meta, UseTree};

use crate::LoadError;

/// A module's key: its path below the crate root, `admin::identify`; the
/// root is "".
pub type Key = String;

/// One module as its source declares it.
#[derive(Debug, Default)]
pub struct Module {
    /// The file it is written in (inline modules share their parent's).
    pub file: PathBuf,
    /// Its submodules, by name.
    pub children: BTreeSet<String>,
    /// Items it defines (types, functions, traits, constants, macros).
    pub defined: BTreeSet<String>,
    /// Names its module-level `use` items bring in, with the path written
    /// (`use a::b as c`: "c" -> [a, b]). Its submodules see them too.
    pub uses: BTreeMap<String, Vec<String>>,
    /// `use a::*` paths.
    pub globs: Vec<Vec<String>>,
    /// Names brought in by `use` items inside function bodies: they only
    /// help resolve this module's own paths.
    pub local_uses: BTreeMap<String, Vec<String>>,
    /// Every multi-segment path its code writes.
    pub refs: Vec<Ref>,
}

/// A path as written, and where.
#[derive(Debug, Clone)]
pub struct Ref {
    pub path: Vec<String>,
    pub line: usize,
}

/// Reads files for [`load`]: the disk, or a table in tests.
pub type Reader<'r> = &'r dyn Fn(&Path) -> Option<String>;

/// Every module reachable from `root_file` through `mod` items, except
/// those compiled only for tests (`#[cfg(test)]`, `#[cfg(any(test, ..))]`).
pub fn load(read: Reader, root_file: &Path) -> Result<BTreeMap<Key, Module>, LoadError> {
    let mut out = BTreeMap::new();
    let dir = root_file.parent().unwrap_or(Path::new("")).to_path_buf();
    load_file(read, root_file, String::new(), dir, &mut out)?;
    Ok(out)
}

fn load_file(
    read: Reader,
    file: &Path,
    key: Key,
    child_dir: PathBuf,
    out: &mut BTreeMap<Key, Module>,
) -> Result<(), LoadError> {
    let text = read(file).ok_or_else(|| LoadError::Missing(file.to_path_buf()))?;
    let parsed = syn::parse_file(&text).map_err(|source| LoadError::Parse {
        file: file.to_path_buf(),
        source,
    })?;
    load_items(read, file, &parsed.items, key, child_dir, out)
}

fn load_items(
    read: Reader,
    file: &Path,
    items: &[Item],
    key: Key,
    child_dir: PathBuf,
    out: &mut BTreeMap<Key, Module>,
) -> Result<(), LoadError> {
    let mut module = Module {
        file: file.to_path_buf(),
        ..Module::default()
    };
    let mut submodules = Vec::new();
    for item in items.iter().filter(|i| !test_only(item_attrs(i))) {
        match item {
            Item::Mod(m) => {
                let name = m.ident.to_string();
                module.children.insert(name.clone());
                submodules.push((name, m));
            }
            Item::Use(u) => {
                let line = u.use_token.span.start().line;
                let mut leaves = Vec::new();
                use_tree(&u.tree, &mut Vec::new(), &mut leaves);
                for leaf in leaves {
                    match leaf {
                        UseLeaf::Name(name, path) => {
                            module.refs.push(Ref {
                                path: path.clone(),
                                line,
                            });
                            if name != "_" {
                                module.uses.insert(name, path);
                            }
                        }
                        UseLeaf::Glob(path) => {
                            module.refs.push(Ref {
                                path: path.clone(),
                                line,
                            });
                            module.globs.push(path);
                        }
                    }
                }
            }
            other => {
                if let Some(name) = defined_name(other) {
                    module.defined.insert(name);
                }
                let mut paths = Paths::default();
                paths.visit_item(other);
                module.refs.extend(paths.refs);
                for (name, path) in paths.uses {
                    module.local_uses.insert(name, path);
                }
            }
        }
    }
    let prefix = |name: &str| {
        if key.is_empty() {
            name.to_owned()
        } else {
            format!("{key}::{name}")
        }
    };
    for (name, m) in submodules {
        let sub_key = prefix(&name);
        let sub_dir = child_dir.join(&name);
        if let Some((_, content)) = &m.content {
            load_items(read, file, content, sub_key, sub_dir, out)?;
            continue;
        }
        let candidates = match path_attr(&m.attrs) {
            Some(p) => vec![file.parent().unwrap_or(Path::new("")).join(p)],
            None => vec![
                child_dir.join(format!("{name}.rs")),
                child_dir.join(&name).join("mod.rs"),
            ],
        };
        let found = candidates
            .iter()
            .find(|c| read(c).is_some())
            .ok_or_else(|| LoadError::Missing(candidates[0].clone()))?;
        // `a/mod.rs` and `a.rs` both keep their submodules in `a/`.
        let grand_dir = if found.file_name().is_some_and(|f| f == "mod.rs") {
            found.parent().unwrap_or(Path::new("")).to_path_buf()
        } else {
            sub_dir
        };
        load_file(read, found, sub_key, grand_dir, out)?;
    }
    out.insert(key, module);
    Ok(())
}

enum UseLeaf {
    Name(String, Vec<String>),
    Glob(Vec<String>),
}

/// The leaves of a `use` tree with their whole paths; `a::{self, b as c}`
/// gives ("a", [a]) and ("c", [a, b]).
fn use_tree(tree: &UseTree, prefix: &mut Vec<String>, out: &mut Vec<UseLeaf>) {
    match tree {
        UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_tree(&p.tree, prefix, out);
            prefix.pop();
        }
        UseTree::Name(n) => {
            let name = n.ident.to_string();
            if name == "self" {
                if let Some(last) = prefix.last() {
                    out.push(UseLeaf::Name(last.clone(), prefix.clone()));
                }
            } else {
                let mut path = prefix.clone();
                path.push(name.clone());
                out.push(UseLeaf::Name(name, path));
            }
        }
        UseTree::Rename(r) => {
            let mut path = prefix.clone();
            let ident = r.ident.to_string();
            if ident != "self" {
                path.push(ident);
            }
            out.push(UseLeaf::Name(r.rename.to_string(), path));
        }
        UseTree::Glob(_) => out.push(UseLeaf::Glob(prefix.clone())),
        UseTree::Group(g) => {
            for t in &g.items {
                use_tree(t, prefix, out);
            }
        }
    }
}

/// The paths of one item's code: types, expressions, patterns, attributes'
/// paths, and paths inside macro bodies (`debug!("{}", crate::a::f())`).
#[derive(Default)]
struct Paths {
    refs: Vec<Ref>,
    uses: Vec<(String, Vec<String>)>,
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.segments.len() > 1 {
            let line = path
                .segments
                .first()
                .map_or(0, |s| s.ident.span().start().line);
            self.refs.push(Ref {
                path: path.segments.iter().map(|s| s.ident.to_string()).collect(),
                line,
            });
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        token_paths(mac.tokens.clone(), &mut self.refs);
    }

    fn visit_item(&mut self, item: &'ast Item) {
        if !test_only(item_attrs(item)) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs = match item {
            syn::ImplItem::Const(c) => &c.attrs[..],
            syn::ImplItem::Fn(f) => &f.attrs,
            syn::ImplItem::Type(t) => &t.attrs,
            syn::ImplItem::Macro(m) => &m.attrs,
            _ => &[],
        };
        if !test_only(attrs) {
            syn::visit::visit_impl_item(self, item);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let line = u.use_token.span.start().line;
        let mut leaves = Vec::new();
        use_tree(&u.tree, &mut Vec::new(), &mut leaves);
        for leaf in leaves {
            let path = match leaf {
                UseLeaf::Name(name, path) => {
                    self.uses.push((name, path.clone()));
                    path
                }
                UseLeaf::Glob(path) => path,
            };
            self.refs.push(Ref { path, line });
        }
    }

    // Inline modules are modules of their own (see `load_items`).
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {}
}

/// `a::b::c` written among a macro's tokens.
fn token_paths(tokens: TokenStream, out: &mut Vec<Ref>) {
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < trees.len() {
        match &trees[i] {
            TokenTree::Group(g) => {
                token_paths(g.stream(), out);
                i += 1;
            }
            TokenTree::Ident(first) => {
                let mut path = vec![first.to_string()];
                let mut j = i + 1;
                while let (
                    Some(TokenTree::Punct(a)),
                    Some(TokenTree::Punct(b)),
                    Some(TokenTree::Ident(next)),
                ) = (trees.get(j), trees.get(j + 1), trees.get(j + 2))
                {
                    if a.as_char() != ':' || a.spacing() != Spacing::Joint || b.as_char() != ':' {
                        break;
                    }
                    path.push(next.to_string());
                    j += 3;
                }
                if path.len() > 1 {
                    out.push(Ref {
                        path,
                        line: first.span().start().line,
                    });
                }
                i = j;
            }
            _ => i += 1,
        }
    }
}

fn defined_name(item: &Item) -> Option<String> {
    let ident = match item {
        Item::Const(i) => &i.ident,
        Item::Enum(i) => &i.ident,
        Item::Fn(i) => &i.sig.ident,
        Item::Macro(i) => i.ident.as_ref()?,
        Item::Static(i) => &i.ident,
        Item::Struct(i) => &i.ident,
        Item::Trait(i) => &i.ident,
        Item::TraitAlias(i) => &i.ident,
        Item::Type(i) => &i.ident,
        Item::Union(i) => &i.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

fn item_attrs(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// Compiled only for tests: `#[cfg(test)]`, or `test` among an `any(..)`
/// or `all(..)` (`#[cfg(any(test, feature = "testing"))]`: the helpers
/// other crates' tests use). Test code may reach anywhere.
fn test_only(attrs: &[Attribute]) -> bool {
    fn is_test(meta: &Meta) -> bool {
        match meta {
            Meta::Path(p) => p.is_ident("test"),
            Meta::List(l) if l.path.is_ident("any") || l.path.is_ident("all") => l
                .parse_args_with(
                    syn::punctuated::Punctuated::<Meta, syn::Token![,]>::parse_terminated,
                )
                .is_ok_and(|metas| metas.iter().any(is_test)),
            _ => false,
        }
    }
    attrs
        .iter()
        .any(|a| a.path().is_ident("cfg") && a.parse_args::<Meta>().is_ok_and(|m| is_test(&m)))
}

/// `#[path = "x.rs"]`.
fn path_attr(attrs: &[Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}
