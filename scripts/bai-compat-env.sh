#!/usr/bin/env bash
# Builds (once) the environment the Backend.AI tests run the real 26.9.6 Python in: a Debian
# trixie root made with `debootstrap` (Backend.AI 26.x needs Python 3.13, which bookworm lacks)
# holding
# - a venv /opt/bai installed `--no-deps` from scripts/bai-halfstack.lock (every distribution
#   pinned: backend.ai-manager, -common, -client, -agent, -test, -cli, -kernel, -kernel-binary,
#   -kernel-helper 26.9.6, backend.ai-krunner-static-gnu 4.4.0 and their dependencies);
# - PostgreSQL 17, Valkey 8.1 and etcd 3.5 from trixie's packages (no cluster made, no service
#   started: tests/bai_halfstack/halfstack.py starts its own on loopback ports with their own
#   data directories), and the Docker CLI (upstream's agent runs `docker` for its krunner volume).
# Cached outside the clone (KV_BAI_ROOT, default /var/cache/kernelvisor/bai-trixie); prints the
# root's path when ready. A root an older version of this script made (its stamp differs) is
# extended in place. The tests run `chroot $root /opt/bai/bin/python ...` with the host's
# network namespace, so the Python reaches an agent on 127.0.0.1.
set -euo pipefail
BAI_VERSION="${KV_BAI_VERSION:-26.9.6}"
root="${KV_BAI_ROOT:-/var/cache/kernelvisor/bai-trixie}"
mirror="${KV_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
lockfile="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/bai-halfstack.lock"
# The stamp names the lock's content: a changed lock installs again.
stamp="$root/.kv-bai-$BAI_VERSION-$(sha256sum "$lockfile" | cut -c1-12)"
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
# PostgreSQL, Valkey and etcd: the packages only. No `main` cluster is created and no service
# is started inside the root (policy-rc.d refuses), the halfstack starts its own.
if [ ! -x "$root/usr/lib/postgresql/17/bin/postgres" ] || [ ! -x "$root/usr/bin/valkey-server" ] \
  || [ ! -x "$root/usr/bin/etcd" ] || [ ! -x "$root/usr/bin/docker" ]; then
  echo "bai-compat: installing postgresql-17, valkey-server, etcd-server and docker-cli into $root" >&2
  $sudo_ mkdir -p "$root/etc/postgresql-common"
  echo "create_main_cluster = false" | $sudo_ tee "$root/etc/postgresql-common/createcluster.conf" >/dev/null
  printf '#!/bin/sh\nexit 101\n' | $sudo_ tee "$root/usr/sbin/policy-rc.d" >/dev/null
  $sudo_ chmod 0755 "$root/usr/sbin/policy-rc.d"
  $sudo_ chroot "$root" apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo_ chroot "$root" apt-get install -y -qq --no-install-recommends \
    postgresql-17 valkey-server etcd-server docker-cli >/dev/null
  $sudo_ sh -c 'rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/cache/apt/archives/*.deb' sh "$root"
fi
echo "bai-compat: installing the pinned Backend.AI $BAI_VERSION venv into $root/opt/bai" >&2
[ -x "$root/opt/bai/bin/pip" ] || $sudo_ chroot "$root" /usr/bin/python3 -m venv /opt/bai
$sudo_ cp "$lockfile" "$root/opt/bai/kv-lock.txt"
$sudo_ chroot "$root" env -u PIP_FIND_LINKS -u PIP_CERT SSL_CERT_FILE=/etc/ssl/certs/kv-host-ca.crt \
  /opt/bai/bin/pip install --quiet --no-deps -r /opt/bai/kv-lock.txt >&2
# What the compatibility test imports must import (a broken install is not stamped as done).
$sudo_ chroot "$root" /opt/bai/bin/python -c \
  'import ai.backend.manager.agent_cache, ai.backend.manager.clients.agent, ai.backend.manager.sokovan.scheduler.launcher.launcher, zmq.auth, ai.backend.manager.server, ai.backend.agent.server, ai.backend.client.session, ai.backend.test.tester' >&2
# The resolved versions, for the record (backend.ai-* pin only some of their dependencies).
$sudo_ chroot "$root" /opt/bai/bin/pip freeze --all 2>/dev/null | $sudo_ tee "$root/opt/bai/kv-freeze.txt" >/dev/null || true
$sudo_ touch "$stamp"
echo "$root"
