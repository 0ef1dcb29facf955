#!/usr/bin/env bash
# Provisions (once) Backend.AI's kernel runner for `[kernel-runner] dir`, pinned and offline-capable
# (docs/kernel-runner.md 6.1 A): the wheels of backend.ai-kernel, -kernel-helper, -kernel-binary
# (this host's arch) and backend.ai-krunner-static-gnu, downloaded from PyPI into
# KV_KRUNNER_DIR (default /var/cache/kernelvisor/krunner) and unpacked there with their Unix modes,
# so that <dir>/ai/backend/{kernel,helpers,runner,krunner/static_gnu}/ exist; the relocatable
# static Python extracted once into <dir>/env/v<N>.<arch>.static-gnu/ (N from
# krunner-version.static-gnu.txt, written to its VERSION), which stands in for upstream's
# `backendai-krunner.v<N>.<arch>.static-gnu` volume; the kernel and helpers packages
# byte-compiled. The wheels are LGPL-3.0: fetched here, never committed to git.
# Messages go to stderr; the last line of stdout is the absolute <dir>. A second run with the same
# pins changes nothing (a stamp records them) and makes no network access.
set -euo pipefail
shopt -s nullglob
KERNEL_VERSION="26.9.6"   # backend.ai-kernel, -kernel-helper, -kernel-binary: one release train
KRUNNER_VERSION="4.4.0"   # backend.ai-krunner-static-gnu: versioned on its own
# Bump when what this script builds from the same pins changes (the stamp then no longer matches).
LAYOUT=1
pins=(
  "backend.ai-kernel==$KERNEL_VERSION"
  "backend.ai-kernel-helper==$KERNEL_VERSION"
  "backend.ai-kernel-binary==$KERNEL_VERSION"
  "backend.ai-krunner-static-gnu==$KRUNNER_VERSION"
)
dir="$(realpath -m "${KV_KRUNNER_DIR:-/var/cache/kernelvisor/krunner}")"
arch="$(uname -m)"
case "$arch" in
  x86_64 | aarch64) ;;
  *) echo "krunner: no Backend.AI kernel-binary wheel for $arch (x86_64 and aarch64 only)" >&2; exit 1 ;;
esac
stamp="$dir/.kv-krunner"
want="$(printf '%s\n' "${pins[@]}" "arch=$arch" "layout=$LAYOUT")"
sg="$dir/ai/backend/krunner/static_gnu"

# Done already: same pins, and the parts an agent mounts are there.
done_already() {
  local n
  [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && [ -x "$dir/ai/backend/runner/entrypoint.sh" ] \
    && n="$(cat "$sg/krunner-version.static-gnu.txt" 2>/dev/null)" \
    && [ -f "$dir/env/v$n.$arch.static-gnu/VERSION" ]
}
if done_already; then echo "$dir"; exit 0; fi

sudo_=""; [ "$(id -u)" -eq 0 ] || sudo_="sudo"
# The dir belongs to whoever runs this (root needs no sudo for anything below; another user gets
# the dir once, with sudo, and then writes it as themself: pip as root is not wanted).
if ! mkdir -p "$dir" 2>/dev/null || [ ! -w "$dir" ]; then
  $sudo_ mkdir -p "$dir"
  $sudo_ chown "$(id -u):$(id -g)" "$dir"
fi
# One provisioner at a time (two `just test-all` at once): the second waits, then finds the stamp.
lock="$dir.lock"
[ -e "$lock" ] || { $sudo_ touch "$lock"; $sudo_ chmod 0666 "$lock" 2>/dev/null || true; }
exec 9<>"$lock"
flock 9
if done_already; then echo "$dir"; exit 0; fi

if ! command -v xz >/dev/null; then
  echo "krunner: installing xz-utils" >&2
  $sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq xz-utils >/dev/null
fi

# The wheel in <dir>/wheels for a pin, by its file name (the project name normalised to
# underscores). The arch-specific ones carry manylinux2014_<arch> among their platform tags (the
# aarch64 ones end in macosx_11_0_arm64, so match the manylinux tag, not the end).
wheels="$dir/wheels"
wheel_for() {
  local name="${1%%==*}" ver="${1##*==}" f
  name="${name//[-.]/_}"
  for f in "$wheels/$name-$ver-"*"-any.whl" "$wheels/$name-$ver-"*"manylinux2014_$arch"*".whl"; do
    [ -f "$f" ] && { echo "$f"; return 0; }
  done
  return 1
}
missing=()
for p in "${pins[@]}"; do wheel_for "$p" >/dev/null || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "krunner: downloading ${missing[*]} into $wheels" >&2
  # The host's python may be older than the runner's 3.13: ask for 3.13 wheels, binary only, for
  # this arch (the kernel-binary and krunner wheels are manylinux2014, the rest pure Python).
  python3 -m pip download --quiet --no-deps --python-version 3.13 --only-binary=:all: \
    --platform "manylinux2014_$arch" --platform "manylinux_2_17_$arch" --platform any \
    -d "$wheels" "${missing[@]}" >&2
fi
whls=()
for p in "${pins[@]}"; do
  f="$(wheel_for "$p")" || { echo "krunner: no wheel for $p in $wheels after download" >&2; exit 1; }
  whls+=("$f")
done

# Unpack into a staging dir first, so an interrupted run leaves <dir>/ai as it was.
staging="$(mktemp -d "$dir/.unpack.XXXXXX")"
envtmp=""
trap 'rm -rf "$staging" ${envtmp:+"$envtmp"}' EXIT
echo "krunner: unpacking ${#whls[@]} wheels" >&2
# zipfile (and `python -m zipfile -e`) drops the Unix modes, and then the container's
# `entrypoint.sh: Permission denied`: chmod each file from the high half of external_attr. The
# zip's dates are kept too, so the layout (and the bytecode's source mtimes) depend on the wheels
# only, not on when they were unpacked.
python3 - "$staging" "${whls[@]}" <<'EOF'
import os, stat, sys, time, zipfile
dest = sys.argv[1]
for whl in sys.argv[2:]:
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                path = os.path.join(dest, info.filename)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                os.symlink(z.read(info).decode(), path)
                continue
            path = z.extract(info, dest)
            if mode & 0o7777:
                os.chmod(path, stat.S_IMODE(mode))
            if not info.is_dir():
                t = time.mktime(info.date_time + (0, 0, -1))
                os.utime(path, (t, t))
EOF
arch_bin="$staging/ai/backend/runner/su-exec.$arch.bin"
for f in "$staging/ai/backend/runner/entrypoint.sh" "$arch_bin"; do
  m="$(stat -c %a "$f" 2>/dev/null || echo missing)"
  [ "$m" = 755 ] || { echo "krunner: $f: mode $m, want 755" >&2; exit 1; }
done
for d in kernel helpers runner krunner/static_gnu; do
  [ -d "$staging/ai/backend/$d" ] || { echo "krunner: ai/backend/$d missing from the wheels" >&2; exit 1; }
done

# The static Python, extracted once per krunner version, like upstream's named volume: an existing
# complete one (it has VERSION) is never rewritten, since running kernels may have it mounted. It
# is extracted into a temp dir and renamed, so a complete-looking dir is a complete one.
ssg="$staging/ai/backend/krunner/static_gnu"
n="$(tr -d '[:space:]' < "$ssg/krunner-version.static-gnu.txt")"
pyver="$(tr -d '[:space:]' < "$ssg/krunner-python.static-gnu.txt")"
env="$dir/env/v$n.$arch.static-gnu"
site="lib/python$pyver/site-packages/ai/backend"
if [ ! -f "$env/VERSION" ]; then
  echo "krunner: extracting krunner-env.static-gnu.$arch.tar.xz into $env" >&2
  mkdir -p "$dir/env"
  envtmp="$(mktemp -d "$dir/env/.v$n.XXXXXX")"
  tar -xJpf "$ssg/krunner-env.static-gnu.$arch.tar.xz" -C "$envtmp"
  # The archive's stdlib and site-packages lack bytecode for about 570 modules (asyncio's among
  # them, which the runner imports at every start); the env is mounted read-only, so compile them
  # here, once (about 1 s and 10 MB), under the path the container sees.
  "$envtmp/bin/python" -m compileall -q -s "$envtmp" -p /opt/backend.ai "$envtmp/lib/python$pyver" >&2
  echo "$n" > "$envtmp/VERSION"
  chmod 0755 "$envtmp"
  rm -rf "$env"   # an incomplete one (no VERSION): not made by this script, nothing uses it
  mv -T "$envtmp" "$env"
  envtmp=""
fi
# The mount points of the kernel and helpers packages (the archive has them, empty; an agent's bind
# mount needs them to exist, and the env is mounted read-only). mkdir -p leaves existing ones as
# they are.
mkdir -p "$env/$site/kernel" "$env/$site/helpers"

# Byte-compile what is bind-mounted read-only over those mount points: nothing in the container
# could write its __pycache__, so every kernel start would compile the runner again. With the
# runner's own python (3.13), under the path the container sees (for tracebacks).
"$env/bin/python" -m compileall -q -s "$staging" -p "/opt/backend.ai/lib/python$pyver/site-packages" \
  "$staging/ai/backend/kernel" "$staging/ai/backend/helpers" >&2

# Swap the staged packages in (the old tree is removed, not overwritten: a kernel started from it
# keeps its mounts).
old="$(mktemp -d "$dir/.old.XXXXXX")"
for e in "$dir/ai" "$dir"/*.dist-info; do if [ -e "$e" ]; then mv "$e" "$old/"; fi; done
mv "$staging/ai" "$dir/ai"
for e in "$staging"/*.dist-info; do mv "$e" "$dir/"; done
rm -rf "$old" "$staging"
printf '%s\n' "${pins[@]}" > "$dir/PINS"
# The stamp last, so an interrupted run is redone, and nothing in <dir> is newer than it.
echo "$want" > "$stamp"
echo "krunner: ready ($(tr '\n' ' ' < "$dir/PINS")on $arch, env v$n)" >&2
echo "$dir"
