#!/usr/bin/env bash
# `just install` / `just run`: put `kernelvisor` on the PATH with `cargo install --path .`
# (into ${CARGO_HOME:-~/.cargo}/bin, which rustup puts on the PATH). cargo builds a path install
# in this workspace's target/, so a build already made is reused, not redone.
#
#   install.sh release   an optimized build (target/release), as `just install` does
#   install.sh auto      what `just run` does: reuse the release build when there is one, else the
#                        debug build `just build` / `just test-all` made, else a release build
#
# Says which build it uses and why before cargo starts, since a first release build takes about
# 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-release}
root=${CARGO_HOME:-$HOME/.cargo}
target=${CARGO_TARGET_DIR:-target}
profile=(--profile release)
if [ "$mode" = auto ]; then
  if [ -x "$target/release/kernelvisor" ]; then
    echo "install: the release build in $target/release (cargo rebuilds only what changed)"
  elif [ -x "$target/debug/kernelvisor" ]; then
    profile=(--debug)
    echo "install: reusing the debug build in $target/debug (cargo rebuilds only what changed);" \
      "\`just install\` makes an optimized one"
  else
    echo "install: no build yet: building a release binary (the first build takes about 10 minutes" \
      "on 2 cores; later runs reuse it)"
  fi
elif [ "$mode" = release ]; then
  [ -x "$target/release/kernelvisor" ] || echo "install: building a release binary (the first" \
    "build takes about 10 minutes on 2 cores; later ones reuse it)"
else
  echo "usage: install.sh release|auto" >&2
  exit 2
fi
cargo install --quiet --locked --path . --root "$root" "${profile[@]}"
echo "install: $root/bin/kernelvisor"
if [ "$(command -v kernelvisor 2>/dev/null)" != "$root/bin/kernelvisor" ]; then
  echo "install: $root/bin is not first on your PATH; add it: export PATH=\"$root/bin:\$PATH\"" >&2
fi
