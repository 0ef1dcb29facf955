# kernelvisor task runner. `just run` starts a dev agent + manager; `just test-all` is what CI runs.

set shell := ["bash", "-euo", "pipefail", "-c"]

venv := justfile_directory() / ".venv"

# List the recipes.
default:
    @just --list

# Install what the project needs when it is missing: libzmq with CURVE, pkg-config,
# and a Python venv with callosum 1.0.x + pyzmq for the interop tests and schemathesis 3 for
# the API fuzz test.
setup:
    #!/usr/bin/env bash
    set -euo pipefail
    # cargo-nextest runs the tests (`just test-all`): from crates.io when missing.
    command -v cargo-nextest >/dev/null || cargo install --locked cargo-nextest
    # `just lint` needs rustfmt and clippy (rustup's components; a no-op when present).
    cargo fmt --version >/dev/null 2>&1 && cargo clippy --version >/dev/null 2>&1 || rustup component add rustfmt clippy
    need=()
    pkg-config --exists libzmq 2>/dev/null || need+=(libzmq3-dev)
    command -v pkg-config >/dev/null || need+=(pkg-config)
    if [ ${#need[@]} -gt 0 ]; then
      echo "setup: installing ${need[*]}"
      sudo_=""; [ "$(id -u)" -eq 0 ] || sudo_="sudo"
      $sudo_ apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq "${need[@]}" >/dev/null
    fi
    if ! "{{venv}}/bin/python" -c 'import callosum, zmq' 2>/dev/null; then
      echo "setup: creating {{venv}} with callosum"
      python3 -m venv "{{venv}}"
      "{{venv}}/bin/pip" install --quiet 'callosum>=1.0,<1.1' pyzmq msgpack
    fi
    # schemathesis 3 for the API fuzz test (tests/it/api_fuzz.rs), with hypothesis held below 6.131
    # (6.130 is the one tested here): hypothesis 6.170.10 dropped an internal (`many.more`)
    # that schemathesis 3's hypothesis-jsonschema still calls.
    st_ok='from importlib.metadata import version as v; import sys; h = tuple(int(x) for x in v("hypothesis").split(".")[:2]); sys.exit(not (v("schemathesis").startswith("3.") and h < (6, 131)))'
    if ! "{{venv}}/bin/python" -c "$st_ok" 2>/dev/null; then
      echo "setup: installing schemathesis into {{venv}}"
      "{{venv}}/bin/pip" install --quiet 'schemathesis>=3.39,<4' 'hypothesis>=6.103.4,<6.131'
    fi

# Build everything (debug).
build: setup
    cargo build --workspace --all-targets

# The PostgreSQL server the manager tests use (role `kv`, password `kv`, may create databases).
pg_url := "postgres://kv:kv@127.0.0.1:5432/postgres"

# Formatting and lints: `cargo fmt --check`, then clippy on every target with warnings as errors.
lint: setup
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings
    cargo clippy --workspace --all-targets --features kernelvisor/fault-injection -- -D warnings

# Where `just bai-env` builds (once) the environment of the Backend.AI compatibility test.
bai_root := env_var_or_default("KV_BAI_ROOT", "/var/cache/kernelvisor/bai-trixie")

# scripts/bai-compat-env.sh: a Debian trixie root (Python 3.13, which bookworm lacks) made with
# `debootstrap`, with PostgreSQL 17, Valkey and etcd from trixie's packages and a venv installed
# from scripts/bai-halfstack.lock (backend.ai-manager, -client, -agent, -test, -cli and the kernel
# runner's packages, 26.9.6, every dependency pinned): about 3 minutes and 1.3 GB, once, cached at
# {{bai_root}}, outside the clone. `just test-all` hands the tests its path as `KV_BAI_ROOT`.
# Build (once) the real Backend.AI 26.9.6 environment of tests/it/bai_compat.rs, bai_events.rs
# and bai_halfstack.rs (the halfstack: tests/bai_halfstack/halfstack.py).
bai-env:
    KV_BAI_ROOT="{{bai_root}}" ./scripts/bai-compat-env.sh >/dev/null

# Where `just krunner` provisions Backend.AI's kernel runner (an agent's `[kernel-runner] dir`).
krunner_dir := env_var_or_default("KV_KRUNNER_DIR", "/var/cache/kernelvisor/krunner")

# scripts/krunner-fetch.sh: the pinned wheels (backend.ai-kernel, -kernel-helper and
# -kernel-binary 26.9.6, backend.ai-krunner-static-gnu 4.4.0; 56 MB) downloaded from PyPI into
# {{krunner_dir}}/wheels and unpacked there with their file modes, the static Python 3.13 the
# runner runs on extracted once into env/v<N>.<arch>.static-gnu/, everything byte-compiled (it is
# mounted read-only into kernels). About 300 MB and a few seconds, once; a second run sees its
# stamp and does nothing, offline. Fetched, never committed: the runner is LGPL-3.0. `just
# test-all` hands the tests its path as `KV_KRUNNER_DIR`.
# Provision (once) Backend.AI's kernel runner, which kernelvisor runs inside kernel containers.
krunner:
    KV_KRUNNER_DIR="{{krunner_dir}}" ./scripts/krunner-fetch.sh >/dev/null

# Where `just test-image-py` keeps the Debian root it imports.
py_root := env_var_or_default("KV_PY_ROOT", "/var/cache/kernelvisor/py-trixie")

# scripts/test-image-py.sh: `kernelvisor-test-py:latest`, a Debian trixie root made with
# `debootstrap` (python3, Debian's python3-ipykernel; about 2 minutes, once, cached at
# {{py_root}}) imported with Backend.AI's kernel labels (runtime-type python, runtime-path
# /usr/bin/python3, features, minimum resources) and a service-def `hello` (python's http.server
# on 8090, label ai.backend.service-ports), and `kernelvisor-test-py:bash` (= `kernelvisor/test-py:bash`)
# with `/bin/bash` as its command, as upstream's base images have (tests/it/bai_halfstack.rs). The
# image carries a hash of the script: a changed script imports it again from the cached root.
# Build (once) the Python kernel image upstream's kernel runner is tested in.
test-image-py: docker
    KV_PY_ROOT="{{py_root}}" ./scripts/test-image-py.sh

# scripts/test-image-py-ssh.sh: `kernelvisor-test-py:ssh`, the Python kernel image plus Debian's
# `openssh-client` (`docker build`, about 20 s, once per base image): the cluster test's kernels
# log in to each other with it (tests/it/cluster_kernels.rs).
# Build (once) the Python kernel image with an ssh client.
test-image-py-ssh: test-image-py
    ./scripts/test-image-py-ssh.sh

# Every test: lint first, then unit, property, actors, RPC over real ZeroMQ, callosum interop,
# the kernel lifecycle and workloads on the real Docker engine (with test-only failure
# injection), the manager scenarios on SQLite and PostgreSQL, the real Backend.AI 26.9.6 agent
# client driving a kernel (tests/it/bai_compat.rs), the agent's events read off a real Redis by the
# real 26.9.6 consumer (tests/it/bai_events.rs), doctests, examples. The tests run under
# cargo-nextest (.config/nextest.toml: a process per test, its duration on its line, groups for
# what must not run side by side, no retries); the ten slowest are listed at the end. The fuzz
# tests run a short budget here; `just fuzz` runs their full one.
test-all: setup docker test-image test-image-py test-image-py-ssh krunner postgres redis registry chromium bai-env lint
    cargo test -p actors --doc
    cargo run --quiet -p actors --example two_level_tree > /dev/null
    {{test_env}} KV_FUZZ_EXAMPLES=10 KV_FUZZ_ITERS=300000 cargo nextest run --workspace --features kernelvisor/fault-injection --lib --bins --tests --examples --no-tests=fail
    ./scripts/slowest-tests.sh target/nextest/default/junit.xml 10

# The environment every test run gets: the venv's python, PostgreSQL, Backend.AI's root, the
# kernel runner's dir, the Redis, registry and htpasswd binaries.
test_env := 'KV_PYTHON="' + venv + '/bin/python" KV_TEST_POSTGRES_URL="' + pg_url + '" KV_BAI_ROOT="' + bai_root + '" KV_KRUNNER_DIR="' + krunner_dir + '" KV_REDIS_SERVER="$(command -v redis-server)" KV_REGISTRY_SERVER="$(command -v docker-registry)" KV_HTPASSWD="$(command -v htpasswd)"'

# Some tests, by nextest filter (`just test kernels::`, `just test 'test(/^queue::/)'`): the same
# environment as test-all, without lint. A plain word is a substring of the test's name.
test *filter: setup docker test-image test-image-py test-image-py-ssh krunner postgres redis registry chromium bai-env
    {{test_env}} cargo nextest run --workspace --features kernelvisor/fault-injection --lib --bins --tests --examples {{filter}}

# The fuzz tests with their full budgets (schemathesis' 50 examples per operation, 1.5 M
# msgpack/pickle inputs): minutes, not part of test-all.
fuzz: setup docker test-image
    {{test_env}} cargo nextest run --features kernelvisor/fault-injection --test it -E 'test(/^api_fuzz::/) | test(/^bai_ext_fuzz::/)'

# Make sure a local PostgreSQL answers at {{pg_url}}: install Debian's `postgresql` when
# missing, create and start a cluster, create the `kv` role. Idempotent.
postgres:
    #!/usr/bin/env bash
    set -euo pipefail
    PGPASSWORD=kv psql "{{pg_url}}" -qtAc 'select 1' >/dev/null 2>&1 && exit 0
    sudo_=""; [ "$(id -u)" -eq 0 ] || sudo_="sudo"
    if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
      echo "postgres: installing postgresql"
      $sudo_ apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq postgresql >/dev/null
    fi
    ver=$(ls /usr/lib/postgresql | sort -n | tail -1)
    pg_lsclusters -h | awk '{print $1" "$2}' | grep -q "^$ver main$" || $sudo_ pg_createcluster "$ver" main >/dev/null
    pg_lsclusters -h | grep "^$ver *main" | grep -q online || $sudo_ pg_ctlcluster "$ver" main start
    as_pg() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else sudo -u postgres "$@"; fi; }
    for _ in $(seq 30); do as_pg psql -qtAc 'select 1' >/dev/null 2>&1 && break; sleep 1; done
    as_pg psql -qtAc "select 1 from pg_roles where rolname = 'kv'" | grep -q 1 \
      || as_pg psql -qc "create role kv login password 'kv' createdb"
    PGPASSWORD=kv psql "{{pg_url}}" -qtAc 'select 1' >/dev/null
    echo "postgres: ready at {{pg_url}}"

# Nothing is started here: tests/it/bai_events.rs starts its own servers, each on a free port with
# its own data directory (append-only file on, so a server stopped and started again keeps the
# streams, as a production Redis/Valkey does). `just test-all` hands the tests its path as
# `KV_REDIS_SERVER`.
# Install `redis-server` (Debian's package) when missing, for tests/it/bai_events.rs.
redis:
    #!/usr/bin/env bash
    set -euo pipefail
    command -v redis-server >/dev/null && exit 0
    echo "redis: installing redis-server"
    sudo_=""; [ "$(id -u)" -eq 0 ] || sudo_="sudo"
    $sudo_ apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq redis-server >/dev/null
    # The package's own service is not needed (and may not start without systemd).
    command -v redis-server >/dev/null

# Make sure a Docker engine answers; when none does, install `docker.io` and start `dockerd` in
# the background (log in /tmp/dockerd.log), waiting up to 30 s for it. The `dockerd` and
# `containerd` binaries are installed even when an engine answers: tests/it/engine_restart.rs starts
# a private engine of its own with them (as root).
# The container registry the image tests start (tests/common/registry.rs): Debian's
# `docker-registry` (the CNCF distribution registry 2.8) and `htpasswd` (apache2-utils) for its
# basic auth. Each test starts its own on a free loopback port; the package's service is not used.
registry:
    #!/usr/bin/env bash
    set -euo pipefail
    need=()
    command -v docker-registry >/dev/null || need+=(docker-registry)
    command -v htpasswd >/dev/null || need+=(apache2-utils)
    [ ${#need[@]} -eq 0 ] && exit 0
    echo "registry: installing ${need[*]}"
    sudo_=""; [ "$(id -u)" -eq 0 ] || sudo_="sudo"
    $sudo_ apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    command -v docker-registry >/dev/null && command -v htpasswd >/dev/null

# The web console's tests (tests/it/console/) drive a headless Chromium through WebDriver:
# Debian's `chromium` and `chromium-driver` (/usr/bin/chromium, /usr/bin/chromedriver). Each test
# starts its own chromedriver on a free loopback port; no service is used.
# Install Chromium and chromedriver (Debian's packages) when missing, for the console's tests.
chromium:
    #!/usr/bin/env bash
    set -euo pipefail
    need=()
    command -v chromium >/dev/null || need+=(chromium)
    command -v chromedriver >/dev/null || need+=(chromium-driver)
    [ ${#need[@]} -eq 0 ] && exit 0
    echo "chromium: installing ${need[*]}"
    sudo_=""; [ "$(id -u)" -eq 0 ] || sudo_="sudo"
    $sudo_ apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    command -v chromium >/dev/null && command -v chromedriver >/dev/null

# Regenerates the web console's vendored xterm.js (src/manager/console/vendor/): Debian's
# `node-xterm` (CommonJS) bundled into one ES module with Debian's `esbuild`, and its style
# sheet. Not part of test-all: the committed bundle is what the binary serves.
console-vendor:
    #!/usr/bin/env bash
    set -euo pipefail
    need=()
    command -v esbuild >/dev/null || need+=(esbuild)
    [ -f /usr/share/nodejs/xterm/package.json ] || need+=(node-xterm)
    if [ ${#need[@]} -gt 0 ]; then
        sudo_=""; [ "$(id -u)" -eq 0 ] || sudo_="sudo"
        $sudo_ apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    fi
    out=src/manager/console/vendor
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    printf 'export { Terminal } from "xterm";\nexport { fit } from "xterm/lib/addons/fit/fit";\n' > "$tmp/entry.js"
    NODE_PATH=/usr/share/nodejs esbuild "$tmp/entry.js" --bundle --format=esm --minify --log-level=warning --outfile="$out/xterm.js"
    cp /usr/share/nodejs/xterm/lib/xterm.css "$out/xterm.css"
    cp /usr/share/doc/node-xterm/copyright "$out/LICENSE.xterm"
    dpkg-query -W esbuild node-xterm

docker:
    #!/usr/bin/env bash
    set -euo pipefail
    sudo_=""; [ "$(id -u)" -eq 0 ] || sudo_="sudo"
    if ! command -v dockerd >/dev/null || ! command -v containerd >/dev/null; then
      echo "docker: installing docker.io"
      $sudo_ apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq docker.io >/dev/null
    fi
    docker info >/dev/null 2>&1 && exit 0
    echo "docker: starting dockerd (log: /tmp/dockerd.log)"
    $sudo_ sh -c 'nohup dockerd >/tmp/dockerd.log 2>&1 &'
    for _ in $(seq 30); do
      docker info >/dev/null 2>&1 && exit 0
      sleep 1
    done
    echo "docker: no engine answered within 30 s; see /tmp/dockerd.log" >&2
    exit 1

# Build the local image `kernelvisor-test:latest` the Docker backend tests use, when missing:
# busybox with one symlink per applet, a `work` user (uid 1000). Its command evals
# `$KERNEL_CMD` (default `sleep infinity`), so a test can choose what PID 1 does (OOM, exit).
# Its service-def files (Backend.AI's format) define `web`, busybox httpd serving /home/work on
# 8080, and `broken`, which exits at once; `kernelvisor-test:services` is the same image with the
# label `ai.backend.service-ports` declaring both (a separate tag: the label gives each kernel
# two more host ports, and the lifecycle tests size their port ranges to what they request).
# KV_TEST_IMAGE_VERSION in its env marks the recipe version; an older image is rebuilt.
test-image:
    #!/usr/bin/env bash
    set -euo pipefail
    version=5
    docker image inspect -f '{{{{json .Config.Env}}' kernelvisor-test:healthcheck 2>/dev/null | grep -q "KV_TEST_IMAGE_VERSION=$version" && exit 0
    sudo_=""; [ "$(id -u)" -eq 0 ] || sudo_="sudo"
    if [ ! -x /bin/busybox ]; then
      echo "test-image: installing busybox-static"
      $sudo_ apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq busybox-static >/dev/null
    fi
    root=$(mktemp -d); trap '$sudo_ rm -rf "$root"' EXIT
    # mktemp's 0700 would be the image's `/`: an engine on vfs (tests/common/engines.rs) keeps it,
    # and a non-root user (a kernel's `work`) could reach nothing.
    chmod 755 "$root"
    mkdir -p "$root"/{bin,etc/backend.ai/service-defs,tmp,home/work}
    printf '%s\n' '{"command": ["httpd", "-f", "-p", "{ports[0]}", "-h", "{home}"], "prestart": [["mkdir", "-p", "{home}"]]}' \
      > "$root/etc/backend.ai/service-defs/web.json"
    printf '%s\n' '{"command": ["sh", "-c", "echo broken service: missing config >&2; exit 3"]}' \
      > "$root/etc/backend.ai/service-defs/broken.json"
    chmod 1777 "$root/tmp"
    cp /bin/busybox "$root/bin/busybox"
    for applet in $(/bin/busybox --list); do
      [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nwork:x:1000:1000:work:/home/work:/bin/sh\n' > "$root/etc/passwd"
    printf 'root:x:0:\nwork:x:1000:\n' > "$root/etc/group"
    $sudo_ chown -R 0:0 "$root"
    $sudo_ chown 1000:1000 "$root/home/work"
    for tag in latest services healthcheck; do
      label=()
      [ "$tag" = services ] && label=(-c 'LABEL ai.backend.service-ports=web:http:8080,broken:http:8081')
      # Healthy while /tmp/healthy exists (tests/it/supervision.rs).
      [ "$tag" = healthcheck ] && label=(-c 'HEALTHCHECK --interval=1s --timeout=2s --retries=1 CMD ["sh","-c","test -f /tmp/healthy"]')
      $sudo_ tar -C "$root" --numeric-owner -c . | docker import \
        -c 'CMD ["sh","-c","eval \"${KERNEL_CMD:-exec sleep infinity}\""]' -c 'ENV PATH=/bin' \
        -c "ENV KV_TEST_IMAGE_VERSION=$version" -c 'WORKDIR /home/work' "${label[@]}" \
        - "kernelvisor-test:$tag" >/dev/null
    done
    echo "test-image: built kernelvisor-test:latest, :services and :healthcheck"

# `exec` also times Backend.AI's kernel runner (benches/exec/runner.rs), so it provisions the
# runner and the Python image first and names the runner's directory as `KV_KRUNNER_DIR`;
# `backend-ai` (benches/backend_ai.rs: kernelvisor's agent against upstream's on a real 26.9.6
# halfstack, about 15 minutes) also builds the halfstack's root (`just bai-env`); `console`
# (benches/console.rs: the web console in a headless Chromium) installs Chromium (`just chromium`).
# Run one benchmark (`just bench rpc`); prints a table and ends with one JSON line.
bench name: setup docker test-image
    #!/usr/bin/env bash
    set -euo pipefail
    if [ "{{name}}" = exec ] || [ "{{name}}" = backend-ai ]; then
      "{{just_executable()}}" --justfile "{{justfile()}}" krunner test-image-py
    fi
    if [ "{{name}}" = backend-ai ]; then
      "{{just_executable()}}" --justfile "{{justfile()}}" bai-env
    fi
    if [ "{{name}}" = console ]; then
      "{{just_executable()}}" --justfile "{{justfile()}}" chromium
    fi
    KV_KRUNNER_DIR="{{krunner_dir}}" KV_BAI_ROOT="{{bai_root}}" cargo bench --bench {{name}}

# Put `kernelvisor` on the PATH: `cargo install --path .` (an optimized build, reusing
# target/release) into ${CARGO_HOME:-~/.cargo}/bin.
install: setup
    ./scripts/install.sh release

# From nothing: install `kernelvisor` (reusing the release or the debug build already made, saying
# which), dev keys, a manager (SQLite) and an agent (Docker) with CURVE on; wait until the agent is
# ALIVE, create a demo session, run code in it, print what to try next. Ctrl+C stops both, whatever
# the output is piped to; a pair an earlier run left is stopped first (scripts/dev-run.sh).
run: setup docker test-image test-image-py krunner
    ./scripts/install.sh auto
    ./scripts/dev-run.sh
