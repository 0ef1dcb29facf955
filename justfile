# kernelvisor task runner. `just run` starts a dev agent + manager; `just test-all` is what CI runs.

set shell := ["bash", "-euo", "pipefail", "-c"]

venv := justfile_directory() / ".venv"

# List the recipes.
default:
    @just --list

# Install what the project needs when it is missing: libzmq with CURVE, pkg-config,
# and a Python venv with callosum 1.0.x + pyzmq for the interop tests.
setup:
    #!/usr/bin/env bash
    set -euo pipefail
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

# Build everything (debug).
build: setup
    cargo build --workspace --all-targets

# Every test: unit, property, actors, RPC over real ZeroMQ, callosum interop, doctests, examples.
test-all: setup
    cargo test -p actors --doc
    cargo run --quiet -p actors --example two_level_tree > /dev/null
    KV_PYTHON="{{venv}}/bin/python" cargo test --workspace --lib --bins --tests --examples -- --test-threads 2

# Run one benchmark (`just bench rpc`); prints a table and ends with one JSON line.
bench name: setup
    cargo bench --bench {{name}}

# Generate dev keys and run an agent plus a manager that health-checks it (Ctrl+C stops both).
run: setup
    cargo build --release
    ./scripts/dev-run.sh
