#!/usr/bin/env bash
# Reproduce BENCHMARKS.md: footprint and latency of the release build against test doubles.
#
#   sudo tests/bench.sh [all|size|footprint|latency|flood|throughput]   (default: all)
#
# Knobs: FOOTPRINT_SECS (600), FOOTPRINT_RUNS (1), FOOTPRINT_PAGE_OUT_AFTER (the config's
# page_out_after; default 1m, as the daemon's), FOOTPRINT_FAULT_PATH_WATCH (default 2m, as the
# daemon's: the idle window opens once the fault path is locked, about 3 min after start;
# a page_out_after of 0s measures without the hand-back), PRESSURE_RUNS (20), FLOOD_RATE
# (100000), FLOOD_SECS (60). Run `cargo bench -p gpu-agent --no-default-features` only after the
# footprint: cargo puts that build's binary (no network clients) at target/release/gpu-agent.
# The flood overwrites the shared kernel log and the latency runs inject into it: run this
# alone, not beside the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"

if [ "$(id -u)" != 0 ]; then
  echo "tests/bench.sh: needs root (/dev/kmsg, kernel.printk_devkmsg)" >&2
  exit 1
fi
cargo build --locked --release -p gpu-agent -p fake-nvml
target="${CARGO_TARGET_DIR:-target}"
export GPU_AGENT_BIN="$PWD/$target/release/gpu-agent"
export FAKE_NVML_LIB="$PWD/$target/release/libfake_nvml.so"
bench() { cargo bench --locked -q -p "$1" --bench "$2" 2>/dev/null | grep -v '^$' || true; }

case "$what" in all | size)
  echo "== binary size"
  stat -c '%s bytes  %n' "$GPU_AGENT_BIN"
  ;; esac
case "$what" in all | footprint)
  # FOOTPRINT_RUNS runs per configuration (a fresh daemon each), then the median and the
  # spread (min-max) of RSS and CPU.
  for config in kmsg kmsg+imds kmsg+imds+kube all; do
    echo "== start-to-READY and idle footprint, $config (${FOOTPRINT_SECS:-600} s x ${FOOTPRINT_RUNS:-1})"
    out=$(for _ in $(seq "${FOOTPRINT_RUNS:-1}"); do FOOTPRINT_CONFIG=$config bench gpu-agent-e2e footprint; done)
    echo "$out"
    summary() { # $1: sed expression extracting the number from an "idle" line
      sed -n "$1" <<<"$out" | sort -n | awk '{v[NR]=$1} END {if (NR) printf "median %s, min %s, max %s (%d runs)", v[int((NR+1)/2)], v[1], v[NR], NR}'
    }
    echo "-- $config: RSS KiB $(summary 's/^idle.*: RSS \([0-9]*\) KiB now.*/\1/p'); CPU % $(summary 's/^idle.*CPU \([0-9.]*\)% .*/\1/p'); CPU % (live threads, precise) $(summary 's/^idle.*to the microsecond: \([0-9.]*\)%.*/\1/p')"
  done
  ;; esac
case "$what" in all | latency)
  echo "== kernel-log line to Kubernetes API request"
  bench gpu-agent-e2e condition_latency
  echo "== the first fault under page-cache pressure, with and without the start-up hand-back"
  bench gpu-agent-e2e pressure_latency
  echo "== notice to checkpoint signal"
  BENCH_IDLE_SECS=${BENCH_IDLE_SECS:-30} bench gpu-agent-e2e notice_latency
  echo "== kernel-log line to status, parse throughput, idle"
  BENCH_IDLE_SECS=${BENCH_IDLE_SECS:-60} bench gpu-agent kmsg
  ;; esac
case "$what" in all | throughput)
  echo "== NVML poll cost"
  bench gpu-agent nvml
  ;; esac
case "$what" in all | flood)
  echo "== kernel-log flood (${FLOOD_RATE:-100000} lines/s for ${FLOOD_SECS:-60} s)"
  bench gpu-agent-e2e kmsg_flood
  ;; esac
