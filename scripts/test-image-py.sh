#!/usr/bin/env bash
# Builds the local image `kernelvisor-test-py:latest`: a Python kernel image that Backend.AI's own
# agent would accept (docs/kernel-runner.md 5), for the tests that run upstream's kernel runner in
# it. No registry is reachable, so it is made from Debian packages: a trixie root (glibc 2.41, so
# the runner's static-gnu krunner and libbaihook.ubuntu22.04 fit) from `debootstrap`, with Debian's
# python3-ipykernel, cached outside the clone (KV_PY_ROOT, default
# /var/cache/kernelvisor/py-trixie), then `docker import`ed with upstream's kernel labels and one
# upstream-format service-def. The image carries a hash of this script as a label: when it
# matches, nothing is done; when the script changed, the image is imported again from the cached
# root (only a changed package list makes a new root).
# `kernelvisor-test-py:bash` is the same image with `/bin/bash` as its command, as upstream's
# base images have (the halfstack test's image: the agent must replace the command with the
# runner's, tests/it/bai_halfstack.rs), also tagged `kernelvisor/test-py:bash`: a `local`
# registry of project `kernelvisor` registers it as `local/kernelvisor/test-py:bash` and both
# agents run it by its short name (ImageRef.short).
set -euo pipefail
image="kernelvisor-test-py:latest"
bash_image="kernelvisor-test-py:bash"
project_image="kernelvisor/test-py:bash"
root="${KV_PY_ROOT:-/var/cache/kernelvisor/py-trixie}"
mirror="${KV_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
suite="trixie"
# python3-cffi-backend must be named: debootstrap does not resolve the virtual
# python3-cffi-backend-api-* that python3-zmq (ipykernel's) depends on, and configuring fails.
# adduser: entrypoint.sh creates the `work` user with it. procps: ps/kill for users and services.
pkgs="python3,python3-ipykernel,python3-cffi-backend,adduser,procps"
recipe="$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)"
recipe_label="kernelvisor.test-image-py.recipe"
have_image() {
  [ "$(docker image inspect -f "{{ index .Config.Labels \"$recipe_label\" }}" "$image" 2>/dev/null)" = "$recipe" ] \
    && [ "$(docker image inspect -f "{{ index .Config.Labels \"$recipe_label\" }}" "$bash_image" 2>/dev/null)" = "$recipe" ] \
    && [ "$(docker image inspect -f '{{.Id}}' "$bash_image" 2>/dev/null)" = "$(docker image inspect -f '{{.Id}}' "$project_image" 2>/dev/null)" ]
}
if have_image; then exit 0; fi

sudo_=""; [ "$(id -u)" -eq 0 ] || sudo_="sudo"
# One builder at a time (two `just test-all` at once): the second waits, then finds the image.
$sudo_ mkdir -p "$(dirname "$root")"
lock="$root.lock"
[ -e "$lock" ] || { $sudo_ touch "$lock"; $sudo_ chmod 0666 "$lock" 2>/dev/null || true; }
exec 9<>"$lock"
flock 9
if have_image; then exit 0; fi

# The root: debootstrap's output, apt's lists and caches removed, stamped with what it was made
# from. It is built beside and renamed, so a root with a stamp is a complete one.
stamp="$root/.kv-py-root"
want="$suite $pkgs"
if [ "$($sudo_ cat "$stamp" 2>/dev/null)" != "$want" ]; then
  if ! command -v debootstrap >/dev/null; then
    echo "test-image-py: installing debootstrap" >&2
    $sudo_ apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq debootstrap >/dev/null
  fi
  new="$root.new"
  echo "test-image-py: debootstrap $suite into $root (about 2.5 minutes, once)" >&2
  $sudo_ rm -rf "$new"; $sudo_ mkdir -p "$new"
  $sudo_ debootstrap --variant=minbase --include="$pkgs" "$suite" "$new" "$mirror" >&2
  # About 120 MB of the 440 that an image has no use for (nothing runs apt in a kernel).
  $sudo_ sh -c 'rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' sh "$new"
  # What the runner needs from the image: the python the runtime-path label names, ipykernel and
  # the kernelspec jupyter_client starts it by.
  $sudo_ chroot "$new" /usr/bin/python3 -c 'import ipykernel, zmq' >&2
  $sudo_ test -f "$new/usr/share/jupyter/kernels/python3/kernel.json"
  echo "$want" | $sudo_ tee "$new/.kv-py-root" >/dev/null
  $sudo_ rm -rf "$root"
  $sudo_ mv -T "$new" "$root"
fi

# The recipe's own files, added from a temp dir at import time, so the cached root stays what
# debootstrap made and a file dropped from the recipe does not linger in it.
overlay="$(mktemp -d)"; trap '$sudo_ rm -rf "$overlay"' EXIT
mkdir -p "$overlay/etc/backend.ai/service-defs"
# One service in upstream's service-def format, valid for the 26.9.6 runner
# (ai/backend/kernel/service.py ServiceParser, service_actions.py): only the keys of
# ServiceDefinition (`prestart` is renamed to prestart_actions; an unknown key makes the runner
# fail at start), and only the variables it has: `runtime_path` (the runtime-path label),
# `ports` (the ports the service was given) and each prestart action's `ref`. write_tempfile
# format_map's each body line (braces would need doubling), adds no newline and returns the path
# of a /tmp/tmp*.py file; run_command runs its argv after the same interpolation, without a shell;
# a list `command` is run as is (a string one would run under `bash -c`). http.server binds
# 0.0.0.0 explicitly: the runner waits for the port on 127.0.0.1, and the default bind may be ::.
cat > "$overlay/etc/backend.ai/service-defs/hello.json" <<'EOF'
{
  "command": ["{runtime_path}", "-m", "http.server", "{ports[0]}", "--bind", "0.0.0.0", "--directory", "/tmp/hello-www"],
  "prestart": [
    {"action": "write_tempfile", "args": {"body": ["hello from a service-def\n"]}, "ref": "tmpf"},
    {"action": "mkdir", "args": {"path": "/tmp/hello-www"}},
    {"action": "run_command", "args": {"command": ["/bin/cp", "{tmpf}", "/tmp/hello-www/index.html"]}}
  ],
  "url_template": "http://{host}:{port}/"
}
EOF
$sudo_ chown -R 0:0 "$overlay"
chmod 0755 "$overlay"
old="$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)"
echo "test-image-py: importing $image from $root" >&2
# etc/resolv.conf and etc/hostname are the host's (debootstrap copies them); Docker provides both.
# No ai.backend.base-distro label: the agent probes glibc (2.41 -> ubuntu24.04), whereas
# `debian13` would match no libbaihook binary (docs/kernel-runner.md 2.2). No CMD: the agent sets
# the entrypoint and command of a kernel.
$sudo_ tar --numeric-owner -c \
  -C "$root" --exclude=./.kv-py-root --exclude=./etc/resolv.conf --exclude=./etc/hostname . \
  -C "$overlay" ./etc/backend.ai \
  | docker import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'LABEL ai.backend.kernelspec=1' \
    -c 'LABEL ai.backend.features="batch query uid-match user-input"' \
    -c 'LABEL ai.backend.runtime-type=python' \
    -c 'LABEL ai.backend.runtime-path=/usr/bin/python3' \
    -c 'LABEL ai.backend.envs.corecount="OPENBLAS_NUM_THREADS,OMP_NUM_THREADS"' \
    -c 'LABEL ai.backend.resource.min.cpu=1' \
    -c 'LABEL ai.backend.resource.min.mem=256m' \
    -c 'LABEL ai.backend.service-ports=hello:http:8090' \
    -c "LABEL $recipe_label=$recipe" \
    - "$image" >/dev/null
# The image an older recipe made is untagged now: remove it (kept if a container still uses it).
new_id="$(docker image inspect -f '{{.Id}}' "$image")"
if [ -n "$old" ] && [ "$old" != "$new_id" ]; then docker rmi "$old" >/dev/null 2>&1 || true; fi
# The `/bin/bash` variant: a new config on the same layer (a container created, never started,
# and committed with the command changed).
old_bash="$(docker image inspect -f '{{.Id}}' "$bash_image" 2>/dev/null || true)"
cid="$(docker create "$image" /bin/true)"
docker commit --change 'CMD ["/bin/bash"]' "$cid" "$bash_image" >/dev/null
docker rm "$cid" >/dev/null
docker tag "$bash_image" "$project_image"
new_bash="$(docker image inspect -f '{{.Id}}' "$bash_image")"
if [ -n "$old_bash" ] && [ "$old_bash" != "$new_bash" ]; then docker rmi "$old_bash" >/dev/null 2>&1 || true; fi
echo "test-image-py: built $image, $bash_image and $project_image" >&2
