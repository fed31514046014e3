#!/usr/bin/env bash
# Fuzz every parser of outside input for a bounded time (libFuzzer through cargo-fuzz).
#
#   fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]     default: 60 s, every target
#
# Targets: kmsg_line, imds_body, config_toml, sysfs_values (the agent's own parsers, built
# without the network clients: about 3 minutes) and ec2_xml (EC2 answers through aws-sdk-ec2's
# deserializers into the Capacity Block lookup: builds the SDK instrumented, about 10
# minutes). .ci/run runs the first four.
#
# Each target starts from the seeds in fuzz/seeds/<target>/ plus what earlier runs found
# (fuzz/corpus/<target>/, not committed). A crash leaves its input in
# fuzz/artifacts/<target>/ and fails the script; reproduce it with
#   cargo fuzz run -s none <target> fuzz/artifacts/<target>/crash-...
# and add the fixed input to fuzz/seeds/<target>/. Builds on stable Rust (no sanitizer:
# the targets are safe Rust; -s none keeps the coverage instrumentation only).
# Needs: cargo install --locked cargo-fuzz
set -euo pipefail
cd "$(dirname "$0")"

seconds="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo fuzz list)
fi

for target in "${targets[@]}"; do
  # ec2_xml needs the AWS SDK (the `ec2` feature: a long instrumented build).
  features=()
  [ "$target" = ec2_xml ] && features=(--features ec2)
  cargo fuzz build -s none "${features[@]}" "$target" >/dev/null
  mkdir -p "corpus/$target"
  echo "fuzz: $target for ${seconds}s"
  # -rss_limit_mb: a parser must not balloon on small inputs; -max_len: bigger than any
  # real line, body or config the agent reads.
  cargo fuzz run -s none "${features[@]}" "$target" "corpus/$target" "seeds/$target" -- \
    -max_total_time="$seconds" -rss_limit_mb=512 -max_len=16384 -timeout=5 \
    -print_final_stats=1 2>&1 | grep -E "^(Done|stat::number_of_executed_units|stat::peak_rss_mb)|ERROR|panicked|SUMMARY" || true
  if compgen -G "artifacts/$target/crash-*" >/dev/null || compgen -G "artifacts/$target/oom-*" >/dev/null \
     || compgen -G "artifacts/$target/timeout-*" >/dev/null; then
    echo "fuzz: $target found a failing input: $(ls "artifacts/$target")" >&2
    exit 1
  fi
done
