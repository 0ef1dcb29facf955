#!/usr/bin/env bash
# `just run`: dev keys, a manager (SQLite) and one agent (Docker), CURVE on both channels.
# Waits until the agent is ALIVE, creates a session, runs code in it, prints the result and
# what to try next, then keeps both in the foreground. Ctrl+C (or SIGTERM) removes the demo
# session, stops the agent, then the manager, and exits 0.
set -euo pipefail
# On a terminal, job control: the wait at the end is a foreground job with a process group of its
# own that owns the terminal, so Ctrl+C signals only it, not `just` (which would report the
# recipe as interrupted, exit 130, however cleanly it stopped); the script then stops the pair.
if [ -t 0 ]; then set -m; fi
cd "$(dirname "$0")/.."
bin=target/release/kernelvisor
dev=var/dev
mkdir -p "$dev/keys" "$dev/agent-keys" "$dev/logs"
[ -f "$dev/keys/manager.key_secret" ] || "$bin" keygen manager --dir "$dev/keys" >/dev/null
[ -f "$dev/keys/agent-dev.key_secret" ] || "$bin" keygen agent-dev --dir "$dev/keys" >/dev/null
# The manager's intake admits the public keys in agent-keys-dir (new files: no restart needed).
cp "$dev/keys/agent-dev.key" "$dev/agent-keys/agent-dev.key"

export KERNELVISOR_API=http://127.0.0.1:8081
ctl() { "$bin" ctl "$@"; }
manager="" agent="" session=""
stop() {
  trap - INT TERM EXIT
  echo
  # The demo session goes; sessions you created stay (the agent preserves their containers
  # and re-attaches them on the next start).
  [ -n "$session" ] && ctl session rm "$session" >/dev/null 2>&1 && echo "removed the demo session $session"
  echo "stopping the agent and the manager…"
  [ -n "$agent" ] && kill -TERM "$agent" 2>/dev/null || true
  [ -n "$agent" ] && wait "$agent" 2>/dev/null || true
  [ -n "$manager" ] && kill -TERM "$manager" 2>/dev/null || true
  [ -n "$manager" ] && wait "$manager" 2>/dev/null || true
  echo "kernelvisor dev pair stopped."
}
# Ctrl+C is a clean stop (exit 0); any other exit still stops both, keeping its status.
trap 'stop; exit 0' INT TERM
trap stop EXIT

# Each in a process group of its own (job control makes one per background job; without it,
# setsid): the terminal's Ctrl+C reaches only this script, which stops them in order (the manager
# must outlive the agent to take its last events and the session removal).
detach=(setsid)
[[ $- == *m* ]] && detach=()
"${detach[@]}" "$bin" manager --config configs/dev/manager.toml >>"$dev/logs/manager.log" 2>&1 &
manager=$!
"${detach[@]}" "$bin" agent --config configs/dev/agent.toml >>"$dev/logs/agent.log" 2>&1 &
agent=$!

# The manager's first start creates the dev admin key and writes its secret to the token file
# (configs/dev/manager.toml, [api] admin-token-file); every API call carries it.
token_file="$dev/manager/admin-token"
for i in $(seq 30); do
  [ -s "$token_file" ] && break
  kill -0 "$manager" 2>/dev/null || { echo "the manager exited; see $dev/logs/manager.log" >&2; exit 1; }
  [ "$i" = 30 ] && { echo "no admin token at $token_file after 30 s; see $dev/logs/manager.log" >&2; exit 1; }
  sleep 0.5
done
KERNELVISOR_TOKEN=$(cat "$token_file")
export KERNELVISOR_TOKEN
umask 077
printf 'export KERNELVISOR_API=%s\nexport KERNELVISOR_TOKEN=%s\n' "$KERNELVISOR_API" "$KERNELVISOR_TOKEN" >"$dev/env.sh"
umask 022
echo "waiting for agent-dev to be ALIVE on the manager (logs: $dev/logs/)…"
for i in $(seq 60); do
  # ALIVE with its heartbeat applied (placement needs the slots it reports).
  agents=$(ctl -o json agents 2>/dev/null || true)
  if echo "$agents" | grep -q '"status": "ALIVE"' && ! echo "$agents" | grep -q '"last_heartbeat": null'; then break; fi
  kill -0 "$manager" 2>/dev/null || { echo "the manager exited; see $dev/logs/manager.log" >&2; exit 1; }
  kill -0 "$agent" 2>/dev/null || { echo "the agent exited; see $dev/logs/agent.log" >&2; exit 1; }
  [ "$i" = 60 ] && { echo "agent-dev not ALIVE after 60 s; see $dev/logs/" >&2; exit 1; }
  sleep 1
done
# The manager refuses kernel calls during its start-up grace period (503 starting-up).
for _ in $(seq 30); do ctl health 2>/dev/null | grep -q normal && break; sleep 0.5; done
ctl agents
echo
ctl vfolder create scratchpad >/dev/null 2>&1 || true   # exists from an earlier run: fine
created=$(ctl -o json session create --image kernelvisor-test:latest --cpu 1 --mem 256m --mount scratchpad)
session=$(printf '%s\n' "$created" | sed -n 's/.*"session_id": *"\([^"]*\)".*/\1/p')
echo "created session $session"
echo '$ kernelvisor ctl session exec '"$session"' '\''echo "hello from $(hostname)"; uname -sm'\'
ctl session exec "$session" 'echo "hello from $(hostname)"; uname -sm'
echo
ctl sessions
cat <<MSG

kernelvisor dev pair running (CURVE on both channels):
  manager  API http://127.0.0.1:8081 (metrics /metrics), event intake tcp://127.0.0.1:16021
           store var/dev/manager/manager.db   config configs/dev/manager.toml
           admin token var/dev/manager/admin-token (0600)
  agent    RPC tcp://127.0.0.1:16011, metrics http://127.0.0.1:6003/metrics
           config configs/dev/agent.toml
Try, in another shell (first: source $dev/env.sh  — sets KERNELVISOR_API and KERNELVISOR_TOKEN):
  source $dev/env.sh
  $bin ctl agents
  $bin ctl session exec $session 'ls -la /home/work; cat /proc/loadavg'
  $bin ctl session exec $session 'for i in 1 2 3; do echo \$i; sleep 1; done'     # streams as it prints
  $bin ctl session create --image kernelvisor-test:latest --cpu 0.5 --mem 128m \\
      --type batch --command 'echo start; sleep 3; echo done'                    # a batch job; then:
  $bin ctl session logs <ID> -f ; $bin ctl session wait <ID>
  $bin ctl session exec $session 'date > /home/work/scratchpad/hello.txt'       # a vfolder: var/dev/vfolders/<key>/scratchpad
  $bin ctl access-key create --name alice --concurrency-limit 4                  # a user key (secret shown once)
  $bin ctl access-key list
  $bin ctl session rm $session
  curl -s -H "Authorization: Bearer \$KERNELVISOR_TOKEN" http://127.0.0.1:8081/metrics | grep kernelvisor_manager_
Ctrl+C stops both.
MSG
# Until Ctrl+C (on a terminal it ends only this foreground watcher; otherwise the trap above
# runs) or until one of the pair exits.
(while kill -0 "$agent" 2>/dev/null && kill -0 "$manager" 2>/dev/null; do sleep 1; done) || true
if kill -0 "$agent" 2>/dev/null && kill -0 "$manager" 2>/dev/null; then
  stop
  exit 0
fi
echo "the agent or the manager exited; see $dev/logs/" >&2
exit 1
