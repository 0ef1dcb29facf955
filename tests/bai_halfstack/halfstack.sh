#!/usr/bin/env bash
# Runs tests/bai_halfstack/halfstack.py with the venv of the trixie root (`just bai-env`) in a
# private mount namespace (`unshare -m`), so nothing it mounts outlives its processes:
#   halfstack.sh ROOT WORK SUBCOMMAND [ARGS...]
# In the namespace the root gets the host's /dev, /proc, /sys and Docker socket, and two mounts
# at the host's own paths, so that a path the Python hands to the Docker engine (which resolves
# it on the host) names the same file: WORK (the halfstack's state, logs, keys, the upstream
# agent's scratch directories, this directory's Python modules) and ROOT/opt/bai (the venv: upstream's agent mounts its runner
# files from its site-packages into kernels). Python runs as ROOT/opt/bai/bin/python for the
# same reason. WORK must be an absolute path; the script is copied into it.
set -euo pipefail
root="$1"; work="$2"; shift 2
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$work"
cp "$here"/*.py "$work/"
[ -e "$root/run/docker.sock" ] || touch "$root/run/docker.sock"
mkdir -p "$root$work" "$root$root/opt/bai"
exec unshare -m --propagation private bash -euc '
  root="$1"; work="$2"; shift 2
  mount --rbind /dev "$root/dev"
  mount -t proc proc "$root/proc"
  mount --rbind /sys "$root/sys"
  mount --bind /run/docker.sock "$root/run/docker.sock"
  mount --bind "$work" "$root$work"
  mount --bind "$root/opt/bai" "$root$root/opt/bai"
  exec chroot "$root" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 PYTHONUNBUFFERED=1 KV_HS_WORK="$work" "$root/opt/bai/bin/python" "$work/halfstack.py" "$@"
' halfstack "$root" "$work" "$@"
