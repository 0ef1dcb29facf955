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
# One builder at a time (two `just test-all` at once): the second waits, then finds the stamp.
$sudo_ mkdir -p "$(dirname "$root")"
lock="$root.lock"
$sudo_ touch "$lock"; $sudo_ chmod 0666 "$lock" 2>/dev/null || true
exec 9<>"$lock"
flock 9
if [ -f "$stamp" ]; then echo "$root"; exit 0; fi
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
# What the compatibility test imports must import (a broken install is not stamped as done).
$sudo_ chroot "$root" /opt/bai/bin/python -c \
  'import ai.backend.manager.agent_cache, ai.backend.manager.clients.agent, ai.backend.manager.sokovan.scheduler.launcher.launcher, zmq.auth' >&2
# The resolved versions, for the record (backend.ai-* pin only some of their dependencies).
$sudo_ chroot "$root" /opt/bai/bin/pip freeze --all 2>/dev/null | $sudo_ tee "$root/opt/bai/kv-freeze.txt" >/dev/null || true
$sudo_ touch "$stamp"
echo "$root"
