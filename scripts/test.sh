#!/usr/bin/env bash
# The whole test suite on a fresh Debian/Ubuntu machine, set-up included. Run it as root from
# anywhere in the checkout:
#
#   scripts/test.sh [extra `cargo test` arguments, e.g. -p gpu-agent or a test name filter]
#
# It installs only what is missing, and says what and why:
#   - Debian packages for the real peers the tests use (apt-get);
#   - the pinned cargo tools that build the .deb/.rpm and run the fuzz smoke, into a cache
#     outside the checkout (GPU_AGENT_TOOLS, default /var/cache/gpu-agent-tests/tools), so a
#     second run, or a fresh clone on the same machine, installs nothing;
#   - the real trainers' Python packages (tests/python/requirements.txt: torch, PyTorch
#     Lightning, gRPC) into a virtual environment in the same cache, keyed by that file;
# then runs `cargo test --workspace --locked --no-fail-fast` with those tools on PATH, and
# (with no arguments) the fault path's lock test again on the release build.
# Plain `cargo test --workspace` works too once the tools are installed and on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "scripts/test.sh: run as root: the end-to-end tests write real lines into /dev/kmsg," \
    "boot a container with systemd-nspawn and make network namespaces" >&2
  exit 1
fi

started=$SECONDS
phase() { echo "test.sh: $1 ($((SECONDS - started)) s)"; }

# command -> Debian package, for every tool a test or a packaging script runs.
#   dbus-daemon: a private bus for the fake logind; python3: trainer processes that do (or do
#   not) handle the checkpoint signal; systemd-analyze: unit hardening checks; systemd-nspawn,
#   debootstrap, nsenter: a real systemd boot that installs the .deb; rpm: the .rpm's files and
#   scriptlets; dpkg-deb, objdump, strip: the .deb's control files, the binary's glibc needs,
#   packaging; packer: the AMI template; promtool: the alert rules; ip: network namespaces.
declare -A packages=(
  [dbus-daemon]=dbus [python3]=python3 [systemd-analyze]=systemd
  [systemd-nspawn]=systemd-container [debootstrap]=debootstrap [nsenter]=util-linux
  [rpm]=rpm [dpkg-deb]=dpkg [objdump]=binutils [strip]=binutils [packer]=packer
  [promtool]=prometheus [ip]=iproute2 [cc]=gcc
)
missing=()
for cmd in "${!packages[@]}"; do
  command -v "$cmd" >/dev/null || missing+=("${packages[$cmd]}")
done
if [ ${#missing[@]} -gt 0 ]; then
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  echo "test.sh: installing Debian packages the tests run for real: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  phase "Debian packages installed"
fi

# Pinned cargo tools: cargo-deb and cargo-generate-rpm (packaging/build-packages.sh, which the
# package tests run) and cargo-fuzz (fuzz/run.sh, .ci/run's fuzz smoke).
tools="${GPU_AGENT_TOOLS:-/var/cache/gpu-agent-tests/tools}"
export PATH="$tools/bin:$PATH"
pins=(cargo-deb@3.8.0 cargo-generate-rpm@0.21.1 cargo-fuzz@0.13.2)
for pin in "${pins[@]}"; do
  name="${pin%@*}" version="${pin#*@}"
  if [ -x "$tools/bin/$name" ] && grep -q "\"$name $version " "$tools/.crates.toml" 2>/dev/null; then
    continue
  fi
  echo "test.sh: installing $pin into $tools (the package tests and the fuzz smoke need it)"
  # One shared target dir so the tools' common dependencies build once; a release build
  # without LTO is fast enough for what they do and builds in half the time.
  CARGO_TARGET_DIR="$tools/build" CARGO_PROFILE_RELEASE_LTO=false \
    CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
    cargo install --quiet --locked --root "$tools" "$pin"
  phase "$pin installed"
done
rm -rf "$tools/build"

# The real trainers (tests/tests/trainers.rs run torchrun and Lightning jobs under the agent).
# The registry's torch is the CUDA build: about 5 GB with its nvidia-* wheels, a minute or
# two to install; it runs on the CPU (gloo). Installed once per requirements file.
requirements=tests/python/requirements.txt
venv="$tools/trainers-$(sha256sum "$requirements" | cut -c1-12)"
if [ ! -e "$venv/.complete" ]; then
  echo "test.sh: installing the real trainers' Python packages into $venv (torch, Lightning, gRPC; about 5 GB)"
  rm -rf "$venv"
  python3 -m venv "$venv" 2>/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    python3 -m venv "$venv"
  }
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$requirements"
  touch "$venv/.complete"
  # Older environments of earlier requirement files.
  find "$tools" -maxdepth 1 -name 'trainers-*' ! -path "$venv" -exec rm -rf {} +
  phase "trainer packages installed"
fi
export GPU_AGENT_TRAINER_PYTHON="$venv/bin/python"

phase "set-up done; cargo test --workspace"
cargo test --workspace --locked --no-fail-fast "$@"
phase "tests done"

# The fault path's lock on the release build, as it ships (tests/tests/fault_path_lock.rs):
# after the hand-back and a dropped page cache, a kernel-log fault, a Spot notice and an
# EFA device gone read nothing from the disk. Only for the whole suite (no arguments).
if [ $# -eq 0 ]; then
  cargo build --release --locked -p gpu-agent --bin gpu-agent
  GPU_AGENT_BIN="$PWD/target/release/gpu-agent" \
    cargo test --locked -p gpu-agent-e2e --test fault_path_lock
  phase "the release build's fault path checked"
fi
