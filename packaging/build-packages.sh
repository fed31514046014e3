#!/usr/bin/env bash
# Build the .deb (cargo-deb) and the .rpm (cargo-generate-rpm) from the workspace.
#
#   packaging/build-packages.sh [--profile release|dev] [--no-build] [--fast] [--out DIR]
#
# Defaults: the release profile, built first, packages into target/packages/.
# --no-build packages the binary already built for that profile (the package tests package
# the test build's binary this way). --fast trades package size for time (gzip payloads).
# Needs: cargo install --locked cargo-deb cargo-generate-rpm
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
build=1
fast=0
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    --fast) fast=1; shift ;;
    --out) out="$2"; shift 2 ;;
    *) echo "build-packages.sh: unknown argument $1" >&2; exit 64 ;;
  esac
done
target_dir="${CARGO_TARGET_DIR:-target}"
out="${out:-$target_dir/packages}"
mkdir -p "$out"

for tool in cargo-deb cargo-generate-rpm; do
  if ! command -v "$tool" >/dev/null; then
    echo "build-packages.sh: $tool is missing: cargo install --locked cargo-deb cargo-generate-rpm (scripts/test.sh installs the pinned versions)" >&2
    exit 69
  fi
done

if [ "$build" = 1 ]; then
  cargo build --locked --profile "$profile" -p gpu-agent --bin gpu-agent
fi
case "$profile" in
  dev | test) built="$target_dir/debug/gpu-agent" ;;
  *) built="$target_dir/$profile/gpu-agent" ;;
esac
[ -x "$built" ] || { echo "build-packages.sh: $built is missing" >&2; exit 66; }

# Both tools take the binary from <target dir>/release/; stage a copy there with its debug
# info stripped (a test build's binary is mostly debug info), so that any profile packages
# the same way and the build's own target dir is left alone.
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/release"
strip --strip-debug -o "$stage/release/gpu-agent" "$built"
deb_fast=() rpm_fast=()
if [ "$fast" = 1 ]; then deb_fast=(--fast); rpm_fast=(--payload-compress gzip); fi
CARGO_TARGET_DIR="$stage" cargo deb --locked --no-build --no-strip "${deb_fast[@]}" -p gpu-agent \
  --output "$out" >/dev/null
cargo generate-rpm -p agent --target-dir "$stage" "${rpm_fast[@]}" -o "$out" >/dev/null
ls "$out"/gpu-agent*.deb "$out"/gpu-agent*.rpm
