//! The pipeline's layering, checked rather than hoped for: sources emit observations and
//! never call a sink, sinks never reach into a source, the model, core and config know
//! neither, nor any Kubernetes, AWS, NVML or D-Bus crate, and the shared services under them
//! (`host/`, `catalog/`) know no layer above (design rules, docs/ARCHITECTURE.md).
//!
//! Each file is parsed (syn), not matched as text: every `use` tree (grouped, nested,
//! renamed, `self`/`super`/`crate`-relative) and every path in the code is resolved to the
//! module it names, from the file's own place in the module tree. Production code only:
//! items under `#[cfg(test)]` (and `#[test]` functions) are skipped, so test fixtures may
//! build with any module.

use std::path::{Path, PathBuf};

use syn::visit::Visit;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of `file` under `root` (`sources/kmsg/mod.rs` -> `sources::kmsg`,
/// `sources/kmsg/parse.rs` -> `sources::kmsg::parse`, `lib.rs` -> the crate root).
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).unwrap_or(file);
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("test")
            || (a.path().is_ident("cfg")
                && a.parse_args::<syn::Meta>()
                    .is_ok_and(|m| m.path().is_ident("test")))
    })
}

/// What a file names: each path resolved to `crate::...` (a module of this crate) or left
/// as written (another crate), with its line.
struct Names {
    module: Vec<String>,
    found: Vec<(Vec<String>, usize)>,
}

impl Names {
    /// Resolve `segments` as written in the current module: `crate::a` -> `crate::a`,
    /// `super::a` / `self::a` from the module, anything else as written.
    fn resolve(&self, segments: &[String]) -> Vec<String> {
        let mut base = self.module.clone();
        let mut rest = segments;
        match segments.first().map(String::as_str) {
            Some("crate") => return segments.to_vec(),
            Some("self") => rest = &segments[1..],
            Some("super") => {
                while rest.first().map(String::as_str) == Some("super") {
                    base.pop();
                    rest = &rest[1..];
                }
            }
            _ => return segments.to_vec(),
        }
        let mut out = vec!["crate".to_string()];
        out.extend(base);
        out.extend(rest.iter().cloned());
        out
    }

    fn push(&mut self, segments: Vec<String>, line: usize) {
        let resolved = self.resolve(&segments);
        self.found.push((resolved, line));
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut path = prefix.clone();
                if n.ident != "self" {
                    path.push(n.ident.to_string());
                }
                self.push(path, n.ident.span().start().line);
            }
            syn::UseTree::Rename(r) => {
                let mut path = prefix.clone();
                path.push(r.ident.to_string());
                self.push(path, r.ident.span().start().line);
            }
            syn::UseTree::Glob(g) => {
                self.push(prefix.clone(), g.star_token.spans[0].start().line);
            }
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Names {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if is_test_only(attrs) {
            return;
        }
        if let syn::Item::Mod(m) = item {
            // An inline module: its paths are relative to it.
            if m.content.is_some() {
                self.module.push(m.ident.to_string());
                syn::visit::visit_item_mod(self, m);
                self.module.pop();
                return;
            }
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test_only(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let mut prefix = Vec::new();
        self.use_tree(&mut prefix, &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if segments.len() > 1 {
            let line = p
                .segments
                .first()
                .map_or(0, |s| s.ident.span().start().line);
            self.push(segments, line);
        }
        syn::visit::visit_path(self, p);
    }
}

/// Every path of the production code of `file`, resolved, with its line.
fn names_in(root: &Path, file: &Path) -> Vec<(Vec<String>, usize)> {
    let text = std::fs::read_to_string(file).expect("read");
    let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let mut names = Names {
        module: module_of(root, file),
        found: Vec::new(),
    };
    names.visit_file(&parsed);
    names.found
}

/// What a layer may not name: modules of this crate (`sinks`) and other crates (`kube`).
struct Forbidden<'a> {
    modules: &'a [&'a str],
    crates: &'a [&'a str],
}

/// Every name in the production code under `root/layer` that `forbidden` rules out, as
/// `file:line: path`.
fn violations_in(root: &Path, layer: &str, forbidden: &Forbidden<'_>) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(&root.join(layer), &mut files);
    assert!(!files.is_empty(), "no Rust files under {layer}");
    let mut out = Vec::new();
    for file in files {
        for (path, line) in names_in(root, &file) {
            let bad = match path.first().map(String::as_str) {
                Some("crate") => path
                    .get(1)
                    .is_some_and(|m| forbidden.modules.contains(&m.as_str())),
                Some(first) => forbidden.crates.contains(&first),
                None => false,
            };
            if bad {
                let name = file
                    .strip_prefix(root)
                    .unwrap_or(&file)
                    .display()
                    .to_string();
                out.push(format!("{name}:{line}: {}", path.join("::")));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// [`violations_in`] the agent's own `src/`.
fn violations(layer: &str, forbidden: &Forbidden<'_>) -> Vec<String> {
    violations_in(&src(), layer, forbidden)
}

/// The crates the shared types must never depend on.
const CLIENT_CRATES: &[&str] = &[
    "kube",
    "k8s_openapi",
    "aws_config",
    "aws_sdk_ec2",
    "aws_smithy_types",
    "aws_smithy_runtime_api",
    "nvml_wrapper",
    "zbus",
    "tonic",
];

#[test]
fn sources_never_call_a_sink() {
    let found = violations(
        "sources",
        &Forbidden {
            modules: &["sinks", "commands"],
            crates: &[],
        },
    );
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn sinks_never_reach_into_a_source() {
    let found = violations(
        "sinks",
        &Forbidden {
            modules: &["sources", "commands"],
            crates: &[],
        },
    );
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn the_model_knows_no_source_sink_core_or_client_crate() {
    let found = violations(
        "model",
        &Forbidden {
            modules: &["sources", "sinks", "core", "commands", "config", "host"],
            crates: CLIENT_CRATES,
        },
    );
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn core_and_config_import_no_source_sink_or_client_crate() {
    for layer in ["core", "config"] {
        let found = violations(
            layer,
            &Forbidden {
                modules: &["sources", "sinks", "commands"],
                crates: CLIENT_CRATES,
            },
        );
        assert!(found.is_empty(), "{layer}: {found:#?}");
    }
}

/// `host/` (facts of this machine: sysfs, procfs, listeners, peers) and `catalog/`
/// (NVIDIA's tables) serve every layer, so they name none of them.
#[test]
fn host_and_catalog_know_no_layer_above_them() {
    let found = violations(
        "host",
        &Forbidden {
            modules: &["sources", "sinks", "core", "commands", "config"],
            crates: &[],
        },
    );
    assert!(found.is_empty(), "host: {found:#?}");
    let found = violations(
        "catalog",
        &Forbidden {
            modules: &["sources", "sinks", "core", "commands", "config", "host"],
            crates: CLIENT_CRATES,
        },
    );
    assert!(found.is_empty(), "catalog: {found:#?}");
}

/// The check itself: grouped and nested imports, `super` chains, renames, globs and paths
/// in expressions are found with their file and line; the same names in comments, in a
/// test-only `use` or in `mod tests` are not.
#[test]
fn every_shape_of_a_forbidden_name_is_found_and_tests_and_comments_are_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kmsg = dir.path().join("sources/kmsg");
    std::fs::create_dir_all(&kmsg).expect("mkdir");
    std::fs::write(
        kmsg.join("mod.rs"),
        "//! Mentions crate::sinks in a comment.\n\
         #[cfg(test)]\n\
         use crate::sinks::status;\n\
         use crate::{model::Observation, sinks::metrics};\n\
         fn f() { crate::sinks::status::render(); }\n\
         #[cfg(test)]\n\
         mod tests { use crate::sinks::status; }\n",
    )
    .expect("write");
    std::fs::write(
        kmsg.join("parse.rs"),
        "use super::super::super::sinks::status as s;\n\
         use super::Record;\n\
         mod inner { use super::super::super::super::sinks::*; }\n\
         #[test]\n\
         fn t() { crate::sinks::x(); }\n",
    )
    .expect("write");
    let found = violations_in(
        dir.path(),
        "sources",
        &Forbidden {
            modules: &["sinks"],
            crates: &[],
        },
    );
    assert_eq!(
        found,
        [
            "sources/kmsg/mod.rs:4: crate::sinks::metrics",
            "sources/kmsg/mod.rs:5: crate::sinks::status::render",
            "sources/kmsg/parse.rs:1: crate::sinks::status",
            "sources/kmsg/parse.rs:3: crate::sinks",
        ],
        "{found:#?}"
    );
}
