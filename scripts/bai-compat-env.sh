#!/usr/bin/env bash
# Builds (once) the environment the Backend.AI compatibility test runs the real 26.x agent client
# in: a Debian trixie root made with `debootstrap` (Backend.AI 26.x needs Python 3.13, which
# bookworm lacks), and in it a venv with `backend.ai-manager` pinned. Cached outside the clone
# (KV_BAI_ROOT, default /var/cache/kernelvisor/bai-trixie); prints the root's path when ready.
# The test runs `chroot $root /opt/bai/bin/python ...` with the host's network namespace, so the
# client reaches an agent on 127.0.0.1.
set -euo pipefail
BAI_VERSION="${KV_BAI_VERSION:-26.9.6}"
root="${KV_BAI_ROOT:-/var/cache/kernelvisor/bai-trixie}"
mirror="${KV_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
stamp="$root/.kv-bai-$BAI_VERSION"
if [ -f "$stamp" ]; then echo "$root"; exit 0; fi
sudo_=""; [ "$(id -u)" -eq 0 ] || sudo_="sudo"
if ! command -v debootstrap >/dev/null; then
  echo "bai-compat: installing debootstrap" >&2
  $sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq debootstrap >/dev/null
fi
if [ ! -x "$root/usr/bin/python3.13" ]; then
  echo "bai-compat: debootstrap trixie into $root (a few minutes, once)" >&2
  $sudo_ rm -rf "$root"; $sudo_ mkdir -p "$root"
  $sudo_ debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    trixie "$root" "$mirror" >&2
fi
# pip inside the root needs DNS and the host's CA bundle (a proxy's CA may be in it).
$sudo_ cp /etc/resolv.conf "$root/etc/resolv.conf"
$sudo_ cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/kv-host-ca.crt"
echo "bai-compat: installing backend.ai-manager==$BAI_VERSION into $root/opt/bai" >&2
$sudo_ chroot "$root" /usr/bin/python3 -m venv /opt/bai
$sudo_ chroot "$root" env -u PIP_FIND_LINKS -u PIP_CERT SSL_CERT_FILE=/etc/ssl/certs/kv-host-ca.crt \
  /opt/bai/bin/pip install --quiet \
  "backend.ai-manager==$BAI_VERSION" "backend.ai-common==$BAI_VERSION" >&2
$sudo_ touch "$stamp"
echo "$root"
