//! `docs/CONFIGURATION.md` is generated from the code, and this test fails when the checked-in
//! file differs: every key is a field of the config structs (`agent/src/config/*.rs`, parsed
//! with syn), described by its doc comment, with its default from the embedded
//! `default.toml` (which `config`'s own test holds equal to `Config::default()`).
//!
//! After changing a config field or its doc comment:
//! `GPU_AGENT_BLESS=1 cargo test -p gpu-agent --test config_reference`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A field of a config struct.
struct Field {
    /// Its key (serde's renaming applied).
    key: String,
    /// Its doc comment, one paragraph.
    doc: String,
    /// The last segment of its type's path (`KmsgConfig`, `HumanDuration`, `bool`).
    ty: String,
}

fn config_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/config")
}

/// Doc comment lines joined into one paragraph.
fn doc_of(attrs: &[syn::Attribute]) -> String {
    let lines: Vec<String> = attrs
        .iter()
        .filter(|a| a.path().is_ident("doc"))
        .filter_map(|a| match &a.meta {
            syn::Meta::NameValue(nv) => match &nv.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => Some(s.value().trim().to_string()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    lines.join(" ").trim().to_string()
}

/// Whether a struct's serde attributes rename its fields to kebab-case.
fn kebab(attrs: &[syn::Attribute]) -> bool {
    let mut kebab = false;
    for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        let _ = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("rename_all") {
                let value: syn::LitStr = meta.value()?.parse()?;
                kebab |= value.value() == "kebab-case";
            } else if meta.input.peek(syn::Token![=]) {
                let _: syn::Expr = meta.value()?.parse()?;
            }
            Ok(())
        });
    }
    kebab
}

/// The last path segment of a type (`Option<PathBuf>` -> `Option`).
fn type_name(ty: &syn::Type) -> String {
    match ty {
        syn::Type::Path(p) => p
            .path
            .segments
            .last()
            .map(|s| s.ident.to_string())
            .unwrap_or_default(),
        _ => String::new(),
    }
}

/// Every struct of the config module: its doc and its fields.
fn structs() -> HashMap<String, (String, Vec<Field>)> {
    let mut out = HashMap::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(config_dir())
        .expect("config dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read");
        let parsed = syn::parse_file(&text).expect("parse");
        for item in parsed.items {
            let syn::Item::Struct(s) = item else { continue };
            let syn::Fields::Named(named) = &s.fields else {
                continue;
            };
            let rename = kebab(&s.attrs);
            let fields = named
                .named
                .iter()
                .filter_map(|f| {
                    let name = f.ident.as_ref()?.to_string();
                    Some(Field {
                        key: if rename { name.replace('_', "-") } else { name },
                        doc: doc_of(&f.attrs),
                        ty: type_name(&f.ty),
                    })
                })
                .collect();
            out.insert(s.ident.to_string(), (doc_of(&s.attrs), fields));
        }
    }
    out
}

/// A default as it is written in the TOML file.
fn default_of(defaults: &toml::Table, path: &[&str]) -> String {
    let mut table = defaults;
    for (i, part) in path.iter().enumerate() {
        match table.get(*part) {
            Some(toml::Value::Table(t)) if i + 1 < path.len() => table = t,
            Some(value) if i + 1 == path.len() => {
                return format!("`{value}`");
            }
            _ => return "(none)".into(),
        }
    }
    "(none)".into()
}

/// The table of one section's keys.
fn section(
    out: &mut String,
    structs: &HashMap<String, (String, Vec<Field>)>,
    defaults: &toml::Table,
    path: &[&str],
    name: &str,
) {
    let (_, fields) = &structs[name];
    let leaves: Vec<&Field> = fields
        .iter()
        .filter(|f| !structs.contains_key(&f.ty))
        .collect();
    if !leaves.is_empty() {
        out.push_str("| key | default | what it does |\n|---|---|---|\n");
        for f in leaves {
            let mut key_path = path.to_vec();
            key_path.push(&f.key);
            let _ = writeln!(
                out,
                "| `{}` | {} | {} |",
                f.key,
                default_of(defaults, &key_path).replace('|', "\\|"),
                f.doc.replace('|', "\\|")
            );
        }
        out.push('\n');
    }
    for f in fields.iter().filter(|f| structs.contains_key(&f.ty)) {
        let mut sub = path.to_vec();
        sub.push(&f.key);
        let _ = writeln!(out, "## `[{}]`\n\n{}\n", sub.join("."), f.doc);
        section(out, structs, defaults, &sub, &f.ty);
    }
}

fn generated() -> String {
    let structs = structs();
    let defaults: toml::Table =
        toml::from_str(&std::fs::read_to_string(config_dir().join("default.toml")).expect("read"))
            .expect("default.toml");
    let mut out = String::from(
        "# Configuration reference\n\n\
         Generated from the config structs' doc comments (`agent/src/config/*.rs`) and the\n\
         defaults of the embedded `default.toml` (`gpu-agent default-config` prints it, with\n\
         comments); `agent/tests/config_reference.rs` fails when this file differs. Do not edit\n\
         it by hand: `GPU_AGENT_BLESS=1 cargo test -p gpu-agent --test config_reference`.\n\n\
         The agent reads `/etc/gpu-agent/config.toml` (`--config` names another); every key is\n\
         optional, and a key left out takes the default below. Durations are written like\n\
         `\"500ms\"`, `\"30s\"`, `\"5m\"`, `\"24h\"`.\n\n\
         ## Top level\n\n",
    );
    section(&mut out, &structs, &defaults, &[], "Config");
    out.trim_end().to_string() + "\n"
}

#[test]
fn the_configuration_reference_is_what_the_code_says() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/CONFIGURATION.md");
    let want = generated();
    if std::env::var_os("GPU_AGENT_BLESS").is_some() {
        std::fs::write(&path, &want).expect("write docs/CONFIGURATION.md");
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/CONFIGURATION.md differs from the config structs and default.toml; regenerate it: \
         GPU_AGENT_BLESS=1 cargo test -p gpu-agent --test config_reference"
    );
}

#[test]
fn every_key_of_the_default_config_is_in_the_reference() {
    let want = generated();
    let defaults: toml::Table =
        toml::from_str(&std::fs::read_to_string(config_dir().join("default.toml")).expect("read"))
            .expect("default.toml");
    fn keys(table: &toml::Table, prefix: &str, out: &mut Vec<String>) {
        for (k, v) in table {
            match v {
                toml::Value::Table(t) => keys(t, &format!("{prefix}{k}."), out),
                _ => out.push(format!("{prefix}{k}")),
            }
        }
    }
    let mut all = Vec::new();
    keys(&defaults, "", &mut all);
    for key in all {
        let leaf = key.rsplit('.').next().unwrap_or(&key);
        assert!(
            want.contains(&format!("| `{leaf}` |")),
            "{key} is in default.toml but not in the reference"
        );
    }
}
