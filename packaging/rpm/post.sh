# %post: $1 is 1 on install, 2 on upgrade. What the systemd rpm macros do, plus enabling on
# install (an AMI bake wants both units on at the next boot, the daemon also now). First the
# gpu-agent system user the service runs as (it must exist before the unit starts).
systemd-sysusers gpu-agent.conf >/dev/null 2>&1 || :
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || :
fi
if [ "$1" -eq 1 ]; then
  systemctl enable gpu-agent.service gpu-agent-kubelet-config.service >/dev/null 2>&1 || :
  if [ -d /run/systemd/system ]; then
    systemctl start gpu-agent.service >/dev/null 2>&1 || :
  fi
fi
