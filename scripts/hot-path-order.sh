#!/usr/bin/env bash
# Profile what the daemon runs at steady state and on a fault, and write agent/hot-path.order:
# the link order that puts those functions together in the x86_64 release build, between the
# gpu_agent_hot_start and gpu_agent_hot_end markers (agent/build.rs), so the daemon can keep
# that region locked and hand the rest of its program back (agent/src/host/resident.rs).
#
#   sudo scripts/hot-path-order.sh [FOOTPRINT_CONFIG...]   (default: all kmsg+imds+kube)
#
# Run it after a dependency update (the order names mangled symbols, whose hashes change
# with a dependency's version): a stale order shrinks the region, and under 256 KiB the
# daemon keeps all its pages and logs why. It takes about ten minutes: the release build
# with symbols (the same code as the shipped one; only the strip differs) runs the footprint
# bench's daemon under callgrind (the hand-back itself off), once per configuration (every
# source on, as on a GPU node; the issue's steady state, without NVML), recording from a few
# seconds after start (start-up code is what gets handed back) through the idle window, the
# first Xid and one line of each other kind of Xid; every function of the binary that ran
# then, in any run, is in the order.
set -euo pipefail
cd "$(dirname "$0")/.."
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(all kmsg+imds+kube)
command -v valgrind >/dev/null || apt-get install -y -qq valgrind >/dev/null

work=$PWD/target/hot-path
rm -rf "$work" && mkdir -p "$work"
cargo build --release --locked -q -p fake-nvml
cargo rustc --release --locked -q -p gpu-agent --bin gpu-agent -- -C strip=none
cp target/release/gpu-agent "$work/gpu-agent"
printf '%s\n' '#!/bin/sh' \
  "exec valgrind --tool=callgrind --instr-atstart=no --demangle=no \\" \
  "  --callgrind-out-file=\"\$CALLGRIND_OUT\" $work/gpu-agent \"\$@\"" >"$work/agent.sh"
chmod +x "$work/agent.sh"

profile() {
  local config=$1 log=$work/bench.$1.log bench pid
  CALLGRIND_OUT=$work/callgrind.$config GPU_AGENT_BIN=$work/agent.sh \
    FAKE_NVML_LIB=$PWD/target/release/libfake_nvml.so \
    FOOTPRINT_CONFIG=$config FOOTPRINT_SECS=70 FOOTPRINT_HOLD=30 FOOTPRINT_PAGE_OUT_AFTER=0s \
    cargo bench --locked -q -p gpu-agent-e2e --bench footprint >"$log" 2>&1 &
  bench=$!
  wait_for() {
    until grep -q "$1" "$log"; do
      kill -0 "$bench" 2>/dev/null || { cat "$log"; exit 1; }
      sleep 1
    done
  }
  wait_for "after start-up"
  pid=$(pgrep -f "valgrind.*$work/gpu-agent" | head -1)
  callgrind_control -i on "$pid" >/dev/null 2>&1
  wait_for "fault lines injected"
  sleep 10
  callgrind_control -d "$pid" >/dev/null 2>&1
  wait "$bench"
}
for config in "${configs[@]}"; do
  profile "$config"
done

# Every function of the binary with a cost of its own in the dumps, most run first.
python3 - "$work"/callgrind.*.[0-9]* >"$work/hot.txt" <<'PY'
import collections, re, sys
cost = collections.Counter()
for path in sys.argv[1:]:
    names, objects = {}, {}
    ob = fn = None
    after_calls = False
    for line in open(path):
        m = re.match(r"^(c?)(ob|fn)=\((\d+)\)(?: (.*))?$", line.rstrip("\n"))
        if m:
            called, kind, key, name = m.groups()
            if name is not None:
                (objects if kind == "ob" else names)[key] = name
            if not called:
                ob, fn = (key, fn) if kind == "ob" else (ob, key)
            continue
        if line.startswith("calls="):
            after_calls = True  # the next cost line is the call's, not this function's
        elif line[:1].isdigit() or line[:1] in "+-*":
            if not after_calls and objects.get(ob, "").endswith("/gpu-agent"):
                # callgrind marks recursion depth with 'N
                cost[re.sub(r"'\d+$", "", names[fn])] += int(line.split()[1])
            after_calls = False
for name, _ in cost.most_common():
    if not name.startswith("gpu_agent_hot_"):
        print(name)
PY
{
  echo gpu_agent_hot_start
  cat "$work/hot.txt"
  echo gpu_agent_hot_end
} >agent/hot-path.order
echo "agent/hot-path.order: $(wc -l <"$work/hot.txt") functions (${configs[*]})"
