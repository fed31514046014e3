# %preun: $1 is 0 on erase, 1 on upgrade. On erase, stop and disable both units.
if [ "$1" -eq 0 ]; then
  systemctl disable --now gpu-agent.service gpu-agent-kubelet-config.service >/dev/null 2>&1 || :
fi
