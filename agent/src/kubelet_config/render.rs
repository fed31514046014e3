//! The files gpu-agent writes: a nodeadm NodeConfig drop-in (AL2023) or a kubelet
//! `--config-dir` KubeletConfiguration drop-in. Both are JSON (valid YAML, and both loaders
//! read `.json`/`.conf` JSON), deterministic so a second run is byte-identical.

use std::path::{Path, PathBuf};

use super::plan::KubeletFields;

/// Where to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// `/etc/eks/nodeadm.d/60-gpu-agent.json`, merged by nodeadm on top of user data.
    Nodeadm,
    /// `<config-dir>/60-gpu-agent.conf`, read by the kubelet after its base config.
    KubeletDropIn,
}

/// The file for `target` under its directory.
pub fn path(target: Target, nodeadm_dir: &Path, kubelet_dir: &Path) -> PathBuf {
    match target {
        Target::Nodeadm => nodeadm_dir.join("60-gpu-agent.json"),
        Target::KubeletDropIn => kubelet_dir.join("60-gpu-agent.conf"),
    }
}

/// The file's contents.
pub fn contents(target: Target, fields: &KubeletFields) -> String {
    let config = serde_json::to_value(fields).unwrap_or_default();
    let doc = match target {
        Target::Nodeadm => serde_json::json!({
            "apiVersion": "node.eks.aws/v1alpha1",
            "kind": "NodeConfig",
            "spec": { "kubelet": { "config": config } }
        }),
        Target::KubeletDropIn => {
            let mut doc = serde_json::json!({ "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration" });
            if let (Some(d), Some(c)) = (doc.as_object_mut(), config.as_object()) {
                d.extend(c.clone());
            }
            doc
        }
    };
    let mut text = serde_json::to_string_pretty(&doc).unwrap_or_default();
    text.push('\n');
    text
}

/// A line diff of `old` against `new` (`-`/`+` lines; unchanged lines are not shown).
pub fn diff(old: &str, new: &str) -> String {
    let old_lines: Vec<&str> = old.lines().collect();
    let new_lines: Vec<&str> = new.lines().collect();
    // Longest common subsequence: these files are small.
    let (n, m) = (old_lines.len(), new_lines.len());
    let mut lcs = vec![vec![0usize; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if old_lines[i] == new_lines[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    while i < n || j < m {
        if i < n && j < m && old_lines[i] == new_lines[j] {
            i += 1;
            j += 1;
        } else if j < m && (i == n || lcs[i][j + 1] > lcs[i + 1][j]) {
            out.push_str(&format!("+{}\n", new_lines[j]));
            j += 1;
        } else {
            out.push_str(&format!("-{}\n", old_lines[i]));
            i += 1;
        }
    }
    out
}
