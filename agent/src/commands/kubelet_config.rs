//! `gpu-agent kubelet-config plan|apply`.

use anyhow::Context;

use crate::cli::KubeletConfigAction;
use crate::config::Loaded;
use crate::kubelet_config::{self as kc, Applied, KubeletConfigError};

/// Exit code: the plan breaks a kubelet rule (nothing written).
pub const EXIT_INVALID: u8 = 1;
/// Exit code: the kubelet runs with checkpoints for another policy (nothing written).
pub const EXIT_REFUSED: u8 = 3;

/// Run `plan` or `apply`.
pub fn run(loaded: &Loaded, action: &KubeletConfigAction) -> anyhow::Result<u8> {
    let config = &loaded.config;
    let settings = &config.kubelet;
    let (sysfs, json, apply) = match action {
        KubeletConfigAction::Plan { json, sysfs_root } => (sysfs_root.clone(), *json, None),
        KubeletConfigAction::Apply {
            dry_run,
            target,
            sysfs_root,
        } => (sysfs_root.clone(), false, Some((*dry_run, target.clone()))),
    };
    let sysfs = sysfs.unwrap_or_else(|| config.sysfs.root.clone());
    let plan = match kc::plan(&sysfs, settings) {
        Ok(plan) => plan,
        Err(e @ KubeletConfigError::Invalid(_)) => {
            eprintln!("gpu-agent: {e}");
            return Ok(EXIT_INVALID);
        }
        Err(e) => return Err(e.into()),
    };
    let Some((dry_run, target)) = apply else {
        if json {
            println!(
                "{}",
                serde_json::to_string_pretty(&plan).context("cannot encode the plan")?
            );
        } else {
            print_plan(&plan);
        }
        return Ok(0);
    };
    let target = kc::resolve_target(target.as_deref().unwrap_or(&settings.target), settings)?;
    for w in &plan.warnings {
        eprintln!("warning: {w}");
    }
    match kc::apply(&plan, target, settings, &config.procfs.root, dry_run) {
        Ok(Applied::Unchanged(path)) => println!("unchanged: {}", path.display()),
        Ok(Applied::DryRun { path, diff }) if diff.is_empty() => {
            println!("{}: no change", path.display())
        }
        Ok(Applied::DryRun { path, diff }) => {
            print!("--- {p}\n+++ {p} (planned)\n{diff}", p = path.display())
        }
        Ok(Applied::Written { path, removed }) => {
            println!("wrote {}", path.display());
            for r in removed {
                println!("removed stale kubelet checkpoint {}", r.display());
            }
        }
        Err(e @ KubeletConfigError::KubeletRunning(_)) => {
            eprintln!("gpu-agent: {e}");
            return Ok(EXIT_REFUSED);
        }
        Err(e) => return Err(e.into()),
    }
    Ok(0)
}

fn print_plan(plan: &kc::Plan) {
    let t = &plan.topology;
    println!(
        "Topology: {} NUMA nodes, {} CPUs online, {} threads per core",
        t.nodes.len(),
        t.online.len(),
        t.threads_per_core
    );
    for n in &t.nodes {
        println!(
            "  node {}: CPUs {}, {} MiB, {} GPUs, {} EFA",
            n.id,
            n.cpus,
            n.memory_mib,
            n.gpus.len(),
            n.efa.len()
        );
    }
    println!("\nKubelet settings:");
    let fields = serde_json::to_value(&plan.kubelet).unwrap_or_default();
    if let Some(map) = fields.as_object() {
        for (k, v) in map {
            println!("  {k}: {v}");
        }
    }
    println!("\nWhy:");
    for r in &plan.reasoning {
        println!("  - {r}");
    }
    if !plan.warnings.is_empty() {
        println!("\nWarnings:");
        for w in &plan.warnings {
            println!("  - {w}");
        }
    }
}
