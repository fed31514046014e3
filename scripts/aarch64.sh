#!/usr/bin/env bash
# The aarch64 build (Grace: p6e-gb200/gb300; Graviton: g5g), proven on this x86_64 machine:
# cross-build gpu-agent for aarch64-unknown-linux-gnu, run the aarch64 binary under qemu-user
# (--help, default-config, check, a short `run` answering `status`, a clean stop), and package
# it as an arm64 .deb and an aarch64 .rpm. Run it as root from anywhere in the checkout:
#
#   scripts/aarch64.sh
#
# The rustup toolchain here has only the x86_64 std and cannot download another, so the
# cross toolchain is Debian's: a throwaway Debian root (debootstrap, minbase) of a suite whose
# rustc is new enough for the workspace's rust-version, with its rustc and cargo, the arm64
# standard library (libstd-rust-dev:arm64, multiarch), the aarch64 cross gcc (ring's C and
# assembly, and the linker) and qemu-user. It links against Debian 12's arm64 glibc (2.36,
# unpacked as a sysroot), not the suite's own: the binary must start on Amazon Linux 2023
# (glibc 2.34), and a newer glibc gives Rust's weak symbols (pidfd_spawnp) versions AL2023
# does not have; the script checks the binary needs no GLIBC_ version past 2.34, as the x86_64
# package test does. The root, cargo's downloads and the build are kept in
# the tools cache scripts/test.sh keeps (GPU_AGENT_TOOLS, default
# /var/cache/gpu-agent-tests/tools), so a second run rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
checkout="$(pwd)"

if [ "$(id -u)" != 0 ]; then
  echo "scripts/aarch64.sh: run as root: it builds in a chroot" >&2
  exit 1
fi

started=$SECONDS
phase() { echo "aarch64.sh: $1 ($((SECONDS - started)) s)"; }

tools="${GPU_AGENT_TOOLS:-/var/cache/gpu-agent-tests/tools}"
# cargo-deb and cargo-generate-rpm, as scripts/test.sh installed them.
export PATH="$tools/bin:$PATH"
triple=aarch64-unknown-linux-gnu
# Debian forky ships rustc 1.97 (the workspace needs 1.89; trixie's 1.85 is too old).
suite=forky
mirror=http://deb.debian.org/debian
packages=(rustc cargo libstd-rust-dev:arm64 gcc-aarch64-linux-gnu qemu-user ca-certificates)
# The glibc the binary is linked against: Debian 12's arm64 packages, unpacked into the root.
sysroot_suite=bookworm
sysroot=/opt/sysroot-$sysroot_suite
sysroot_packages=(libc6:arm64 libc6-dev:arm64 linux-libc-dev:arm64)
cache="$tools/aarch64"
root="$cache/root-$suite"
stamp="$suite ${packages[*]} $sysroot_suite ${sysroot_packages[*]}"

# On this machine: debootstrap for the root; the aarch64 binutils (strip) and dpkg-deb and rpm
# to package and inspect.
declare -A host_packages=(
  [debootstrap]=debootstrap [aarch64-linux-gnu-strip]=binutils-aarch64-linux-gnu
  [readelf]=binutils [dpkg-deb]=dpkg [rpm]=rpm
)
missing=()
for cmd in "${!host_packages[@]}"; do
  command -v "$cmd" >/dev/null || missing+=("${host_packages[$cmd]}")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "aarch64.sh: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

mounts=()
daemon=""
cleanup() {
  local i
  if [ -n "$daemon" ]; then kill -TERM "$daemon" 2>/dev/null || true; fi
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
bind() { # bind SOURCE TARGET-IN-ROOT [ro]
  mkdir -p "$root$2"
  mount --bind "$1" "$root$2"
  mounts+=("$root$2")
  if [ "${3:-}" = ro ]; then mount -o remount,bind,ro "$root$2"; fi
}
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }

if [ "$(cat "$root/.gpu-agent-root" 2>/dev/null)" != "$stamp" ]; then
  echo "aarch64.sh: making the cross-build root $root (Debian $suite: ${packages[*]})"
  rm -rf "$root"
  mkdir -p "$cache"
  # debootstrap has no script of its own for a suite newer than it; sid's fits every one.
  debootstrap --variant=minbase "$suite" "$root" "$mirror" /usr/share/debootstrap/scripts/sid >/dev/null
  mount -t proc proc "$root/proc"
  mounts+=("$root/proc")
  # The mirror's testing suite may carry a Release file past its Valid-Until date.
  in_root dpkg --add-architecture arm64
  in_root apt-get -o Acquire::Check-Valid-Until=false update -qq
  in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${packages[@]}" >/dev/null
  # The sysroot: downloaded from the older suite (arm64 only), unpacked, never installed.
  echo "deb [arch=arm64] $mirror $sysroot_suite main" \
    >"$root/etc/apt/sources.list.d/$sysroot_suite-sysroot.list"
  in_root apt-get -o Acquire::Check-Valid-Until=false update -qq
  in_root sh -c "mkdir -p /tmp/sysroot-debs $sysroot && cd /tmp/sysroot-debs &&
    apt-get download -qq $(printf '%s/'"$sysroot_suite"' ' "${sysroot_packages[@]}") &&
    for d in *.deb; do dpkg-deb -x \"\$d\" $sysroot; done && rm -rf /tmp/sysroot-debs"
  in_root apt-get clean
  echo "$stamp" >"$root/.gpu-agent-root"
  cleanup
  mounts=()
  phase "root ready"
fi

mount -t proc proc "$root/proc"
mounts+=("$root/proc")
bind /dev /dev
bind /sys /sys
mkdir -p "$cache/cargo-home" "$cache/target"
bind "$checkout" /src ro
bind "$cache/cargo-home" /cargo-home
bind "$cache/target" /target
# cargo in the root trusts what the host trusts (a proxy's CA, where there is one).
cp "${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" "$root/etc/host-ca.crt"

# No debug info: the binary is for running and packaging (stripped) only, and it builds and
# links in far less time and space. No incremental cache, and the agent's own outputs of
# earlier builds removed first (a fresh clone rebuilds it anyway): the cache keeps only the
# dependencies, instead of growing by the agent's build at every run (a CI machine's disk
# filled up).
rm -rf "$cache/target/$triple/debug/incremental" "$cache/target/$triple/debug/deps/"*gpu_agent-* \
  "$cache/target/$triple/debug/.fingerprint/gpu-agent-"*
export_env=(
  CARGO_HOME=/cargo-home CARGO_TARGET_DIR=/target CARGO_HTTP_CAINFO=/etc/host-ca.crt
  CARGO_PROFILE_DEV_DEBUG=0 CARGO_INCREMENTAL=0
  "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS=-C link-arg=--sysroot=$sysroot"
  "CFLAGS_aarch64_unknown_linux_gnu=--sysroot=$sysroot"
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
  CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
)
in_root "${export_env[@]}" sh -c "cd /src && rustc --version && cargo build --locked -p gpu-agent --bin gpu-agent --target $triple"
phase "built for $triple"

built="$cache/target/$triple/debug/gpu-agent"
machine="$(readelf -h "$built" | sed -n 's/^ *Machine: *//p')"
[ "$machine" = AArch64 ] || { echo "aarch64.sh: $built is a $machine binary" >&2; exit 1; }
# Amazon Linux 2023 has glibc 2.34: no symbol version past it (weak ones included: the loader
# refuses a missing version whatever the symbol's binding).
newest="$(aarch64-linux-gnu-objdump -T "$built" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)"
if [ "$(printf '%s\nGLIBC_2.34\n' "$newest" | sort -V | tail -1)" != GLIBC_2.34 ]; then
  echo "aarch64.sh: the aarch64 binary needs $newest; Amazon Linux 2023 has glibc 2.34" >&2
  exit 1
fi
echo "aarch64.sh: the binary needs glibc up to $newest"

# Under qemu-user, inside the root (its arm64 libc and loader): the one-shot commands, then
# the daemon with the default config but the fault path's timers shortened (in the root, its
# state and sockets are the root's own; no GPU, not EC2, no Kubernetes: those parts are off
# and say why) answering `status` from a second aarch64 process, saying what became of its
# fault path, then a clean stop on SIGTERM.
agent=(qemu-aarch64 "/target/$triple/debug/gpu-agent")
in_root "${agent[@]}" --help | grep -q "Usage: gpu-agent"
in_root "${agent[@]}" default-config >"$root/tmp/aarch64-config.toml"
in_root "${agent[@]}" --config /tmp/aarch64-config.toml check
# The daemon below runs the embedded defaults but for the fault path's timers (soon, so the
# lock is seen): a config of its own.
sed -e 's/^page_out_after = .*/page_out_after = "1s"/' \
  -e 's/^fault_path_watch = .*/fault_path_watch = "2s"/' \
  "$root/tmp/aarch64-config.toml" >"$root/tmp/aarch64-run.toml"
grep -q '^fault_path_watch = "2s"' "$root/tmp/aarch64-run.toml"
# Not through in_root (a function: in the background it would be a subshell, and $! its pid):
# chroot, env and sh each exec the next, so $! is the agent's own process under qemu.
chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  sh -c 'rm -f /tmp/aarch64-agent.log; exec "$@" --config /tmp/aarch64-run.toml run >/tmp/aarch64-agent.log 2>&1' sh "${agent[@]}" &
daemon=$!
answered=""
for _ in $(seq 1 300); do
  # Exit 0 healthy, 1 with a warning or fault: either is an answer; what matters is the page.
  status="$(in_root "${agent[@]}" status 2>/dev/null || true)"
  if grep -q '^Health:' <<<"$status"; then
    answered=1
    break
  fi
  sleep 0.1
done
if [ -z "$answered" ]; then
  kill -TERM "$daemon" 2>/dev/null || true
  wait "$daemon" || true
  echo "aarch64.sh: the aarch64 daemon never answered status; its log:" >&2
  cat "$root/tmp/aarch64-agent.log" >&2
  exit 1
fi
echo "$status" | head -3
# The fault path's lock (host::resident): hand back after 1 s, lock after a 2 s watch. The
# daemon must come to a verdict and say it, and what it says it locked is locked (VmLck).
# Under qemu-user, whose /proc/self/smaps is not the kernel's (no page resident), it must
# decline to hand anything back and say why.
said=""
for _ in $(seq 1 300); do
  said="$(in_root "${agent[@]}" status 2>/dev/null | sed -n 's/^Fault path: //p' || true)"
  case "$said" in
    "" | *"not handed back yet"* | "start-up pages handed back; watching"*) ;;
    *) break ;;
  esac
  sleep 0.1
done
echo "aarch64.sh: fault path: $said"
case "$said" in
  *"KiB of code and data locked"*)
    locked_kib="${said%% KiB*}"
    vmlck="$(sed -n 's/^VmLck: *\([0-9]*\) kB/\1/p' "/proc/$daemon/status")"
    if [ "${vmlck:-0}" -lt "$locked_kib" ]; then
      echo "aarch64.sh: the daemon says $locked_kib KiB locked; VmLck is ${vmlck:-0} kB" >&2
      exit 1
    fi ;;
  "NOT LOCKED ("* | "every page of the program kept mapped ("*) ;;
  *)
    echo "aarch64.sh: the aarch64 daemon never said what became of its fault path; its log:" >&2
    cat "$root/tmp/aarch64-agent.log" >&2
    exit 1 ;;
esac
if ! kill -0 "$daemon" 2>/dev/null; then
  echo "aarch64.sh: the aarch64 daemon died; its log:" >&2
  cat "$root/tmp/aarch64-agent.log" >&2
  exit 1
fi
kill -TERM "$daemon"
wait "$daemon" || {
  echo "aarch64.sh: the aarch64 daemon did not stop cleanly; its log:" >&2
  cat "$root/tmp/aarch64-agent.log" >&2
  exit 1
}
daemon=""
phase "the aarch64 binary ran under qemu-user"

# Packages: an arm64 .deb and an aarch64 .rpm of that binary (the package tests do the same
# with the x86_64 test build).
out="$(mktemp -d)"
trap 'cleanup; rm -rf "$out"' EXIT
packaging/build-packages.sh --profile dev --target "$triple" --target-dir "$cache/target" \
  --no-build --fast --out "$out"
deb_arch="$(dpkg-deb -f "$out"/gpu-agent_*.deb Architecture)"
rpm_arch="$(rpm -qp --qf '%{ARCH}' "$out"/gpu-agent-*.rpm 2>/dev/null)"
[ "$deb_arch" = arm64 ] || { echo "aarch64.sh: the .deb is for $deb_arch" >&2; exit 1; }
deb_depends="$(dpkg-deb -f "$out"/gpu-agent_*.deb Depends)"
case "$deb_depends" in
  *"libc6 (>= 2.34)"*) ;;
  *) echo "aarch64.sh: the .deb depends on '$deb_depends', not glibc" >&2; exit 1 ;;
esac
[ "$rpm_arch" = aarch64 ] || { echo "aarch64.sh: the .rpm is for $rpm_arch" >&2; exit 1; }
phase "packaged: arm64 .deb, aarch64 .rpm"
