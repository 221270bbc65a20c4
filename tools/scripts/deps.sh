#!/usr/bin/env bash
# deps.sh GROUP... installs the Debian packages a make target needs, only
# those that are missing, so a fresh Debian machine can run `make test`.
# Groups: build (nasm), smoke (what dpxe smoke boots with: QEMU, OVMF,
# iPXE), test (QEMU, firmware, netboot peers, browser, PostgreSQL for the
# store's second backend), bench (side-by-side peers). Needs root (or sudo)
# when something is missing.
set -euo pipefail

declare -A want=(
  [build]="nasm"
  [smoke]="qemu-system-x86 ovmf ipxe"
  # postgresql: the store suite on both backends; prometheus: the real server (and promtool) of
  # fleet/metrics' scrape test; openssl: the s_server peer of appliance's TLS client test;
  # nats-server: the three-process JetStream cluster of fleet/events; gnutls-bin: gnutls-serv, a
  # peer of the kernel's tlsget= (tools/e2e TestKernelTLSGetPeers)
  [test]="nasm qemu-system-x86 qemu-utils ovmf ipxe busybox dnsmasq-base tftp-hpa curl iproute2 chromium kmod mount util-linux e2fsprogs postgresql prometheus openssl nats-server gnutls-bin"
  # linux-image-amd64: the Linux guest of BenchmarkKernelTCPDownload32MiB
  [bench]="tftpd-hpa hyperfine linux-image-amd64"
)

missing=()
for g in "$@"; do
  for p in ${want[$g]:?unknown group $g}; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
done
# Commands that may come from outside Debian's packages (Node.js from NodeSource bundles npm, and
# Debian's npm package would conflict with it): installed from Debian only when absent.
# npm: examples/jsworker's test installs the JavaScript NATS client with it.
declare -A want_cmd=([test]="npm")
for g in "$@"; do
  for c in ${want_cmd[$g]:-}; do
    command -v "$c" >/dev/null || missing+=("$c")
  done
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "deps: need root to install ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
# A package's post-install must not start a daemon (tftpd-hpa would bind port 69).
printf '#!/bin/sh\nexit 101\n' > /tmp/dpxe-policy-rc.d && chmod +x /tmp/dpxe-policy-rc.d
if [ ! -e /usr/sbin/policy-rc.d ]; then
  $SUDO cp /tmp/dpxe-policy-rc.d /usr/sbin/policy-rc.d
  trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
