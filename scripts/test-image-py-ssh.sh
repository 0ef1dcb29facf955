#!/usr/bin/env bash
# Builds `kernelvisor-test-py:ssh`: `kernelvisor-test-py:latest` (scripts/test-image-py.sh, whose
# labels it keeps) plus Debian's `openssh-client`, the `ssh` a cluster session's kernels log in to
# each other with over the kernel runner's dropbear (tests/it/cluster_kernels.rs: `ssh sub1
# hostname` from main1). Upstream's kernel images carry an OpenSSH client; the runner ships only
# the server (its `dropbearmulti` has no `dbclient`), and the base image is a minimal debootstrap.
# Made with `docker build` (its `apt-get` fetches from the Debian mirror, as debootstrap did for the
# base). The image carries a hash of this script and the base image's id as a label: when both
# match, nothing is done.
set -euo pipefail
base="kernelvisor-test-py:latest"
image="kernelvisor-test-py:ssh"
label="kernelvisor.test-image-py-ssh.recipe"
mirror="${KV_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
base_id="$(docker image inspect -f '{{.Id}}' "$base" 2>/dev/null)" \
  || { echo "test-image-py-ssh: no $base: run \`just test-image-py\` first" >&2; exit 1; }
want="$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16) $base_id"
have() {
  [ "$(docker image inspect -f "{{ index .Config.Labels \"$label\" }}" "$image" 2>/dev/null)" = "$want" ]
}
if have; then exit 0; fi
# One builder at a time (two test runs at once): the second waits, then finds the image.
lock="${TMPDIR:-/tmp}/kv-test-image-py-ssh.lock"
exec 9>>"$lock"
flock 9
if have; then exit 0; fi
ctx="$(mktemp -d)"; trap 'rm -rf "$ctx"' EXIT
cat > "$ctx/Dockerfile" <<DOCKERFILE
FROM $base
RUN echo "deb $mirror trixie main" > /etc/apt/sources.list \\
 && rm -f /etc/apt/sources.list.d/* \\
 && apt-get update -qq \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssh-client >/dev/null \\
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \\
 && ssh -V
LABEL $label="$want"
DOCKERFILE
echo "test-image-py-ssh: building $image (openssh-client from $mirror)" >&2
docker build -q -t "$image" "$ctx" >/dev/null
have
