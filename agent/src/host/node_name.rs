//! This node's Kubernetes name, and where it came from.
//!
//! The kubelet registers the Node under its `--hostname-override` when nodeadm passes one
//! (the EC2 private DNS name, or the instance id under nodeadm's `InstanceIdNodeName` gate;
//! custom DHCP domains make it differ from the kernel hostname). The agent starts before the
//! kubelet, so the name is resolved when it is needed and again when the API server says the
//! name is wrong; in order:
//! 1. `node_name` from the config (an explicit override);
//! 2. the running kubelet's `--hostname-override` (procfs), the truth once the kubelet runs;
//! 3. nodeadm's kubelet environment file (`NODEADM_KUBELET_ARGS=...`), written before the
//!    kubelet starts;
//! 4. the kernel hostname.

use std::path::Path;

pub use crate::model::{NameSource, NodeName};

/// Resolve the node name (see the module doc for the order).
pub fn resolve(configured: &str, procfs_root: &Path, kubelet_environment: &Path) -> NodeName {
    let named = |name: String, source| NodeName { name, source };
    if !configured.is_empty() {
        return named(configured.to_string(), NameSource::Config);
    }
    if let Some(name) = kubelet_hostname_override(procfs_root) {
        return named(name, NameSource::KubeletCommandLine);
    }
    if let Some(name) = std::fs::read_to_string(kubelet_environment)
        .ok()
        .and_then(|text| environment_override(&text))
    {
        return named(name, NameSource::NodeadmEnvironment);
    }
    let hostname = std::fs::read_to_string(procfs_root.join("sys/kernel/hostname"))
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string());
    named(hostname, NameSource::Hostname)
}

/// `--hostname-override` in an argument list (`--flag=value` or `--flag value`).
fn override_in<'a>(mut args: impl Iterator<Item = &'a str>) -> Option<String> {
    while let Some(arg) = args.next() {
        let value = if let Some(v) = arg.strip_prefix("--hostname-override=") {
            Some(v)
        } else if arg == "--hostname-override" {
            args.next()
        } else {
            continue;
        };
        return value
            .map(|v| v.trim_matches(|c| c == '"' || c == '\'').to_string())
            .filter(|v| !v.is_empty());
    }
    None
}

/// The running kubelet's `--hostname-override`, from its command line in procfs. Only a
/// process whose `comm` is `kubelet` and that runs on the host itself (the agent's PID
/// namespace, the host's mount namespace) has its command line read, each read bounded: a
/// process stuck in the kernel (whose `cmdline` read would block) never stalls the
/// resolution.
fn kubelet_hostname_override(procfs_root: &Path) -> Option<String> {
    let mut reader = super::proc_read::ProcReader::new(super::proc_read::DEFAULT_DEADLINE);
    for entry in std::fs::read_dir(procfs_root).ok()?.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let comm = match reader.read_text(&entry.path().join("comm")) {
            Ok(Some(comm)) => comm,
            Ok(None) => continue,
            Err(stuck) => {
                tracing::debug!(error = %stuck, "Skipped while looking for the kubelet.");
                continue;
            }
        };
        if comm.trim_end() != "kubelet" {
            continue;
        }
        // A kubelet in a container (kind, vcluster, a test rig) is another node's: only one
        // in the agent's PID namespace and the host's mount namespace names this node.
        let pid = name.to_str().and_then(|p| p.parse::<i32>().ok());
        if let Err(foreign) = super::peer::on_host_in(procfs_root, pid) {
            tracing::debug!(pid = ?pid, reason = %foreign, "A kubelet not on this host is not asked for the node name.");
            continue;
        }
        let cmdline = match reader.read(&entry.path().join("cmdline")) {
            Ok(Some(cmdline)) => cmdline,
            Ok(None) => continue,
            Err(stuck) => {
                tracing::warn!(error = %stuck, "The kubelet's command line does not answer.");
                continue;
            }
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_kubelet = args
            .first()
            .is_some_and(|a| a.ends_with("/kubelet") || a == "kubelet");
        if is_kubelet {
            return override_in(args.iter().map(String::as_str));
        }
    }
    None
}

/// `--hostname-override` in an environment file's variables (`NODEADM_KUBELET_ARGS="..."`,
/// or any other variable holding kubelet flags).
fn environment_override(text: &str) -> Option<String> {
    text.lines()
        .filter_map(|line| line.trim().split_once('='))
        .find_map(|(_, value)| {
            let value = value.trim().trim_matches(|c| c == '"' || c == '\'');
            override_in(value.split_whitespace())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn procfs(kubelet: Option<&[&str]>, hostname: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("sys/kernel")).expect("dirs");
        std::fs::write(dir.path().join("sys/kernel/hostname"), hostname).expect("hostname");
        std::fs::create_dir_all(dir.path().join("1")).expect("pid 1");
        std::fs::write(dir.path().join("1/cmdline"), "/sbin/init\0").expect("cmdline");
        std::fs::write(dir.path().join("1/comm"), "systemd\n").expect("comm");
        let ns = |who: &str, pid: &str, mnt: &str| {
            let ns = dir.path().join(who).join("ns");
            std::fs::create_dir_all(&ns).expect("ns");
            std::os::unix::fs::symlink(pid, ns.join("pid")).expect("pid ns");
            std::os::unix::fs::symlink(mnt, ns.join("mnt")).expect("mnt ns");
        };
        ns("self", "pid:[1]", "mnt:[10]");
        ns("1", "pid:[1]", "mnt:[10]");
        // A kubelet in a container (kind): another node's, whatever its PID.
        ns("100", "pid:[2]", "mnt:[20]");
        let container = ["/usr/bin/kubelet", "--hostname-override=kind-worker"];
        std::fs::write(dir.path().join("100/cmdline"), container.join("\0")).expect("cmdline");
        std::fs::write(dir.path().join("100/comm"), "kubelet\n").expect("comm");
        if let Some(args) = kubelet {
            ns("4242", "pid:[1]", "mnt:[10]");
            std::fs::write(dir.path().join("4242/cmdline"), args.join("\0")).expect("cmdline");
            std::fs::write(dir.path().join("4242/comm"), "kubelet\n").expect("comm");
        }
        // A process stuck in the kernel: a read of its command line never returns.
        std::fs::create_dir_all(dir.path().join("77")).expect("stuck pid");
        std::fs::write(dir.path().join("77/comm"), "python3\n").expect("comm");
        crate::host::proc_read::fifo(&dir.path().join("77/cmdline"));
        dir
    }

    #[test]
    fn order_config_kubelet_environment_hostname() {
        let env_dir = tempfile::tempdir().expect("tempdir");
        let env = env_dir.path().join("environment");
        std::fs::write(
            &env,
            "NODEADM_KUBELET_ARGS=\"--node-ip=10.0.1.23 --hostname-override=ip-10-0-1-23.ec2.internal --cloud-provider=external\"\n",
        )
        .expect("env");
        let kubelet = [
            "/usr/bin/kubelet",
            "--config",
            "/etc/kubernetes/kubelet/config.json",
            "--hostname-override",
            "i-0abc123",
        ];
        let with_kubelet = procfs(Some(&kubelet), "gpu-host\n");
        let no_kubelet = procfs(None, "gpu-host\n");
        let resolved = |configured, root: &tempfile::TempDir, env: &Path| {
            let n = resolve(configured, root.path(), env);
            (n.name, n.source)
        };
        assert_eq!(
            resolved("pinned", &with_kubelet, &env),
            ("pinned".into(), NameSource::Config)
        );
        assert_eq!(
            resolved("", &with_kubelet, &env),
            ("i-0abc123".into(), NameSource::KubeletCommandLine)
        );
        assert_eq!(
            resolved("", &no_kubelet, &env),
            (
                "ip-10-0-1-23.ec2.internal".into(),
                NameSource::NodeadmEnvironment
            )
        );
        assert_eq!(
            resolved("", &no_kubelet, &env_dir.path().join("absent")),
            ("gpu-host".into(), NameSource::Hostname)
        );
    }

    #[test]
    fn flag_forms() {
        assert_eq!(
            override_in(["--hostname-override=a.b"].into_iter()),
            Some("a.b".into())
        );
        assert_eq!(
            override_in(["--hostname-override", "a.b"].into_iter()),
            Some("a.b".into())
        );
        assert_eq!(override_in(["--hostname-override="].into_iter()), None);
        assert_eq!(override_in(["--hostname-override"].into_iter()), None);
        assert_eq!(
            environment_override("# comment\nNODEADM_KUBELET_ARGS='--v=2 --hostname-override=x'"),
            Some("x".into())
        );
        assert_eq!(environment_override("NODEADM_KUBELET_ARGS=--v=2"), None);
    }
}
