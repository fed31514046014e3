#!/usr/bin/env bash
# Build the .deb (cargo-deb) and the .rpm (cargo-generate-rpm) from the workspace.
#
#   packaging/build-packages.sh [--profile release|dev] [--target TRIPLE] [--target-dir DIR]
#                               [--no-build] [--fast] [--out DIR]
#
# Defaults: the release profile for this machine's architecture, built first, packages into
# target/packages/. --target x86_64-unknown-linux-gnu (amd64 .deb, x86_64 .rpm) or
# aarch64-unknown-linux-gnu (arm64 .deb, aarch64 .rpm: Grace and Graviton nodes); building
# for another architecture needs its standard library (rustup target add, or scripts/aarch64.sh,
# which cross-builds in a Debian root and packages with --no-build). --target-dir: where the
# build is (default CARGO_TARGET_DIR or target/). --no-build packages the binary already built
# for that profile and target (the package tests package the test build's binary this way).
# --fast trades package size for time (gzip payloads).
# Needs: cargo install --locked cargo-deb cargo-generate-rpm
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
triple=""
target_dir="${CARGO_TARGET_DIR:-target}"
build=1
fast=0
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="$2"; shift 2 ;;
    --target) triple="$2"; shift 2 ;;
    --target-dir) target_dir="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    --fast) fast=1; shift ;;
    --out) out="$2"; shift 2 ;;
    *) echo "build-packages.sh: unknown argument $1" >&2; exit 64 ;;
  esac
done
out="${out:-$target_dir/packages}"
mkdir -p "$out"

for tool in cargo-deb cargo-generate-rpm; do
  if ! command -v "$tool" >/dev/null; then
    echo "build-packages.sh: $tool is missing: cargo install --locked cargo-deb cargo-generate-rpm (scripts/test.sh installs the pinned versions)" >&2
    exit 69
  fi
done

# The binary of that profile and target: <target dir>[/<triple>]/<profile dir>/gpu-agent.
case "$profile" in
  dev | test) profile_dir=debug ;;
  *) profile_dir="$profile" ;;
esac
target_args=() built_dir="$target_dir"
if [ -n "$triple" ]; then
  target_args=(--target "$triple")
  built_dir="$target_dir/$triple"
fi
if [ "$build" = 1 ]; then
  CARGO_TARGET_DIR="$target_dir" cargo build --locked --profile "$profile" "${target_args[@]}" \
    -p gpu-agent --bin gpu-agent
fi
built="$built_dir/$profile_dir/gpu-agent"
[ -x "$built" ] || { echo "build-packages.sh: $built is missing" >&2; exit 66; }

# Strip with the binutils of the binary's architecture (binutils' strip reads only its own).
strip=strip foreign=0
case "$(readelf -h "$built" | sed -n 's/^ *Machine: *//p')" in
  AArch64) [ "$(uname -m)" = aarch64 ] || { strip=aarch64-linux-gnu-strip foreign=1; } ;;
  "Advanced Micro Devices X86-64") [ "$(uname -m)" = x86_64 ] || { strip=x86_64-linux-gnu-strip foreign=1; } ;;
esac
command -v "$strip" >/dev/null || {
  echo "build-packages.sh: $strip is missing (Debian: binutils-aarch64-linux-gnu or binutils-x86-64-linux-gnu)" >&2
  exit 69
}

# Both tools take the binary from <target dir>[/<triple>]/release/; stage a copy there with
# its debug info stripped (a test build's binary is mostly debug info), so that any profile
# packages the same way and the build's own target dir is left alone. The tools name the
# package's architecture from the target (amd64/arm64 for the .deb, x86_64/aarch64 for the
# .rpm).
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
staged="$stage${triple:+/$triple}/release"
mkdir -p "$staged"
"$strip" --strip-debug -o "$staged/gpu-agent" "$built"
deb_fast=() rpm_fast=()
if [ "$fast" = 1 ]; then deb_fast=(--fast); rpm_fast=(--payload-compress gzip); fi
# A foreign architecture's libraries are not here for dpkg-shlibdeps: its dependencies are
# stated in the `cross` variant instead.
if [ "$foreign" = 1 ]; then deb_fast+=(--variant cross); fi
CARGO_TARGET_DIR="$stage" cargo deb --locked --no-build --no-strip "${deb_fast[@]}" \
  "${target_args[@]}" -p gpu-agent --output "$out" >/dev/null
rpm_arch=()
case "$triple" in
  aarch64-*) rpm_arch=(--arch aarch64) ;;
  x86_64-*) rpm_arch=(--arch x86_64) ;;
esac
cargo generate-rpm -p agent --target-dir "$stage" "${target_args[@]}" "${rpm_arch[@]}" \
  "${rpm_fast[@]}" -o "$out" >/dev/null
ls "$out"/gpu-agent*.deb "$out"/gpu-agent*.rpm
