//! The pipeline's layering, checked rather than hoped for: sources emit observations and
//! never call a sink, sinks never reach into a source, and the model, core and config know
//! neither, nor any Kubernetes, AWS, NVML or D-Bus crate (design rules, docs/ARCHITECTURE.md).
//!
//! Production code only: a file is read up to its first top-level `#[cfg(test)]` item (the
//! test helpers and `mod tests` that follow may build fixtures with any module; a test-only
//! `use` is skipped alone), and comment lines are skipped.

use std::path::{Path, PathBuf};

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

/// `(file, line number, line)` of every production-code line under `root/layer`.
fn code_lines(root: &Path, layer: &str) -> Vec<(String, usize, String)> {
    let mut files = Vec::new();
    rust_files(&root.join(layer), &mut files);
    assert!(!files.is_empty(), "no Rust files under {layer}");
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read");
        let name = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .display()
            .to_string();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            // The test part begins at a top-level test item (a test-only `use` does not
            // end the production code: it is skipped alone).
            if *line == "#[cfg(test)]" {
                if lines
                    .get(i + 1)
                    .is_some_and(|next| next.starts_with("use "))
                {
                    continue;
                }
                break;
            }
            if i > 0 && lines[i - 1] == "#[cfg(test)]" {
                continue;
            }
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            out.push((name.clone(), i + 1, (*line).to_string()));
        }
    }
    out
}

/// Every line of `root/layer` that mentions one of `forbidden`.
fn violations_in(root: &Path, layer: &str, forbidden: &[&str]) -> Vec<String> {
    code_lines(root, layer)
        .into_iter()
        .filter(|(_, _, line)| forbidden.iter().any(|f| line.contains(f)))
        .map(|(file, n, line)| format!("{file}:{n}: {}", line.trim()))
        .collect()
}

/// [`violations_in`] the agent's own `src/`.
fn violations(layer: &str, forbidden: &[&str]) -> Vec<String> {
    violations_in(&src(), layer, forbidden)
}

/// Paths of the crates the shared types must never depend on.
const CLIENT_CRATES: &[&str] = &[
    "kube::",
    "k8s_openapi",
    "aws_config",
    "aws_sdk_",
    "aws_smithy",
    "nvml_wrapper",
    "zbus",
    "tonic",
];

#[test]
fn sources_never_call_a_sink() {
    let found = violations("sources", &["crate::sinks", "super::super::sinks"]);
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn sinks_never_reach_into_a_source() {
    let found = violations("sinks", &["crate::sources", "super::super::sources"]);
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn the_model_knows_no_source_sink_core_or_client_crate() {
    let mut forbidden = vec!["crate::sources", "crate::sinks", "crate::core"];
    forbidden.extend_from_slice(CLIENT_CRATES);
    let found = violations("model", &forbidden);
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn core_and_config_import_no_source_sink_or_client_crate() {
    let mut forbidden = vec!["crate::sources", "crate::sinks"];
    forbidden.extend_from_slice(CLIENT_CRATES);
    for layer in ["core", "config"] {
        let found = violations(layer, &forbidden);
        assert!(found.is_empty(), "{layer}: {found:#?}");
    }
}

/// The check itself: a forbidden line in production code is found, with its file and line,
/// past a test-only `use`; the same line in a comment or in the tests after `#[cfg(test)]`
/// is not.
#[test]
fn a_forbidden_line_is_found_and_tests_and_comments_are_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sources = dir.path().join("sources/kmsg");
    std::fs::create_dir_all(&sources).expect("mkdir");
    std::fs::write(
        sources.join("mod.rs"),
        "//! Mentions crate::sinks in a comment.\n\
         #[cfg(test)]\n\
         use crate::sinks::status;\n\
         use crate::model::Observation;\n\
         fn f() { crate::sinks::status::render(); }\n\
         #[cfg(test)]\n\
         mod tests { use crate::sinks::status; }\n",
    )
    .expect("write");
    let found = violations_in(dir.path(), "sources", &["crate::sinks"]);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].starts_with("sources/kmsg/mod.rs:5:"), "{found:#?}");
}
