#!/usr/bin/env bash
# `just run`: dev keys, one agent and one manager with CURVE on, in the foreground.
# Ctrl+C (or SIGTERM) stops both cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/kernelvisor
dev=var/dev
mkdir -p "$dev/keys"
[ -f "$dev/keys/manager.key_secret" ] || "$bin" keygen manager --dir "$dev/keys" >/dev/null
[ -f "$dev/keys/agent-dev.key_secret" ] || "$bin" keygen agent-dev --dir "$dev/keys" >/dev/null

"$bin" agent --config configs/dev/agent.toml &
agent=$!
"$bin" manager --config configs/dev/manager.toml &
manager=$!
stop() {
  trap - INT TERM EXIT
  kill -TERM "$manager" "$agent" 2>/dev/null || true
  wait "$manager" "$agent" 2>/dev/null || true
  echo "kernelvisor dev pair stopped."
}
trap stop INT TERM EXIT
cat <<'MSG'

kernelvisor dev pair running (CURVE on):
  agent   RPC tcp://127.0.0.1:16011   (configs/dev/agent.toml)
          metrics http://127.0.0.1:6003/metrics
  manager pools it, health-checks every 5 s (configs/dev/manager.toml)
Try, in another shell, a stock callosum client against the agent:
  .venv/bin/python tests/interop/callosum_client.py tcp://127.0.0.1:16011 \
      --server-key var/dev/keys/agent-dev.key --keypair var/dev/keys/manager.key_secret
Ctrl+C stops both.
MSG
wait "$agent" "$manager"
