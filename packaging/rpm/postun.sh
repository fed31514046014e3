# %postun: $1 is 0 on erase, 1 on upgrade. On upgrade, restart the daemon on the new binary
# (the kubelet-config oneshot is never re-run under a running kubelet).
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || :
  if [ "$1" -ge 1 ]; then
    systemctl try-restart gpu-agent.service >/dev/null 2>&1 || :
  fi
fi
