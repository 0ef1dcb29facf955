#!/usr/bin/env bash
# `just run`: dev keys, a manager (SQLite) and one agent (Docker), CURVE on both channels.
# Waits until the agent is ALIVE, creates a demo session sized to what the agent has free, runs
# code in it, prints what to try next, then waits. Ctrl+C (SIGINT), SIGTERM or SIGHUP removes the
# demo session, stops the agent, then the manager, and says "stopped" once both have exited.
#
# It never adopts a pair it did not start: a pair an earlier run left (pid files in var/dev) is
# stopped first, saying so; anything else holding one of the dev ports is named and nothing starts.
#
# Signals: the manager and the agent run in sessions of their own (setsid), so a Ctrl+C reaches
# only this script (and whatever shares its terminal job: `just`, `| tee`); the script stops them
# in order (the manager must outlive the agent to take its last events and the session removal).
# Output may go to a pipe whose reader the same Ctrl+C killed: SIGPIPE is ignored and lines that
# cannot be written go to the terminal instead, so the stop always runs to its end.
#
# Environment: KV_BIN (default: the binary `just run` installed), KV_DEMO=0 (no demo session).
set -uo pipefail
trap '' PIPE
cd "$(dirname "$0")/.."
bin=${KV_BIN:-${CARGO_HOME:-$HOME/.cargo}/bin/kernelvisor}
dev=var/dev
manager_toml=configs/dev/manager.toml
agent_toml=configs/dev/agent.toml

# A line to stdout, or to the terminal when stdout is gone (`| tee` killed by the same Ctrl+C).
say() {
  printf '%s\n' "$*" 2>/dev/null || { [ -w /dev/tty ] && printf '%s\n' "$*" >/dev/tty; } 2>/dev/null || true
}
fail() {
  say "$*" >&2
  exit 1
}
[ -x "$bin" ] || fail "no kernelvisor at $bin: run \`just run\` (it installs one) or set KV_BIN"

# `port = N` of the `{ host, port }` table on the line holding KEY in FILE.
port_of() { sed -n "s/^$2 *=.*port *= *\([0-9]*\).*/\1/p" "$1" | head -1; }
api_port=$(port_of "$manager_toml" listen-addr)
event_port=$(port_of "$manager_toml" event-listen-addr)
rpc_port=$(port_of "$agent_toml" rpc-listen-addr)
metrics_port=$(port_of "$agent_toml" service-addr)
metrics_port=${metrics_port:-6003}

export KERNELVISOR_API=http://127.0.0.1:$api_port
ctl() { "$bin" ctl "$@"; }
alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }
# Whether pid $1 is a kernelvisor process (not a reused pid).
is_kernelvisor() { tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q kernelvisor; }

# Stops pid $1 (named $2): SIGTERM, up to 30 s, then SIGKILL. Works for a pid that is not our
# child too (a pair an earlier run left).
stop_pid() {
  local pid=$1 name=$2
  alive "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 300); do
    alive "$pid" || { wait "$pid" 2>/dev/null; return 0; }
    # Our own child exited: a zombie (state Z) that kill -0 still finds until it is reaped.
    [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = Z ] && { wait "$pid" 2>/dev/null; return 0; }
    sleep 0.1
  done
  say "the $name (pid $pid) did not stop within 30 s of SIGTERM: killing it"
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null || true
}

# Who listens on TCP port $1: "pid N (command)", or empty when nobody does.
listener() {
  local line pid
  if command -v ss >/dev/null; then
    line=$(ss -Hltnp "sport = :$1" 2>/dev/null | head -1)
    [ -n "$line" ] || return 0
    pid=$(printf '%s' "$line" | sed -n 's/.*pid=\([0-9]*\).*/\1/p')
    if [ -n "$pid" ]; then
      printf 'pid %s (%s)' "$pid" "$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-80)"
    else
      printf 'another process'
    fi
  elif (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
    printf 'another process'
  fi
}

# Another `just run` still running keeps its pair: refuse rather than take it away from it.
if other=$(cat "$dev/run.pid" 2>/dev/null) && [ "$other" != $$ ] && alive "$other" \
  && tr '\0' ' ' <"/proc/$other/cmdline" 2>/dev/null | grep -q dev-run.sh; then
  fail "\`just run\` is already running here (pid $other): use that pair, or stop it (Ctrl+C there, or kill $other). Nothing was started."
fi
# A pair an earlier run left (its script killed, or an older script's Ctrl+C): stop it.
for name in agent manager; do
  pid=$(cat "$dev/$name.pid" 2>/dev/null) || continue
  if alive "$pid" && is_kernelvisor "$pid"; then
    say "a $name an earlier \`just run\` left is still running (pid $pid): stopping it"
    stop_pid "$pid" "$name"
  fi
  rm -f "$dev/$name.pid"
done
for p in "$api_port:manager API" "$event_port:manager event intake" "$rpc_port:agent RPC" "$metrics_port:agent metrics"; do
  who=$(listener "${p%%:*}")
  [ -z "$who" ] || fail "port ${p%%:*} (${p#*:}) is in use by $who; stop it (kill <pid>) or change the ports in configs/dev/*.toml. Nothing was started."
done

mkdir -p "$dev/keys" "$dev/agent-keys" "$dev/logs"
echo $$ >"$dev/run.pid"
[ -f "$dev/keys/manager.key_secret" ] || "$bin" keygen manager --dir "$dev/keys" >/dev/null
[ -f "$dev/keys/agent-dev.key_secret" ] || "$bin" keygen agent-dev --dir "$dev/keys" >/dev/null
# The manager's intake admits the public keys in agent-keys-dir (new files: no restart needed).
cp "$dev/keys/agent-dev.key" "$dev/agent-keys/agent-dev.key"

manager="" agent="" session="" stopping="" sleeper=""
stop() {
  [ -n "$stopping" ] && return
  stopping=1
  # The wait loop's `sleep` would outlive this script by up to a second.
  [ -z "$sleeper" ] || kill "$sleeper" 2>/dev/null || true
  [ -n "$manager$agent" ] || return 0   # nothing was started
  # Stop to the end: a second Ctrl+C, or the SIGINT `just` forwards, must not cut it short.
  trap '' INT TERM HUP
  say ""
  # The demo session goes; sessions you created stay (the agent preserves their containers and
  # re-attaches them on the next start).
  if [ -n "$session" ] && alive "$manager" && ctl session rm "$session" >/dev/null 2>&1; then
    say "removed the demo session $session"
  fi
  say "stopping the agent and the manager…"
  stop_pid "$agent" agent
  stop_pid "$manager" manager
  rm -f "$dev/agent.pid" "$dev/manager.pid" "$dev/run.pid"
  say "kernelvisor dev pair stopped."
}
# The last lines of the log of the process that failed, and exit 1.
failed_start() {
  local name=$1 why=$2
  local log="$dev/logs/$name.log" this_run
  # This run's part of the log; its `Error: …` (the reason, without a backtrace) when the process
  # returned one, else its last lines.
  this_run=$(awk -v m="--- just run $start_mark" '$0 == m { n = NR } { line[NR] = $0 } END { for (i = n + 1; i <= NR; i++) print line[i] }' "$log" 2>/dev/null)
  if printf '%s\n' "$this_run" | grep -q '^Error: '; then
    say "$why; from $log:" >&2
    printf '%s\n' "$this_run" | sed -n '/^Error: /,$p' | sed '/^Stack backtrace:/,$d' | head -n 20 | sed 's/^/  | /' >&2
  else
    say "$why; the last lines of $log:" >&2
    printf '%s\n' "$this_run" | tail -n 15 | sed 's/^/  | /' >&2
  fi
  stop
  exit 1
}
trap 'stop; exit 0' INT TERM HUP
trap stop EXIT

start_mark=$(date -u +%FT%TZ)
say "starting the manager and the agent (logs: $dev/logs/)…"
printf '\n--- just run %s\n' "$start_mark" >>"$dev/logs/manager.log"
printf '\n--- just run %s\n' "$start_mark" >>"$dev/logs/agent.log"
setsid "$bin" manager --config "$manager_toml" >>"$dev/logs/manager.log" 2>&1 </dev/null &
manager=$!
echo "$manager" >"$dev/manager.pid"
setsid "$bin" agent --config "$agent_toml" >>"$dev/logs/agent.log" 2>&1 </dev/null &
agent=$!
echo "$agent" >"$dev/agent.pid"

# The manager's first start creates the dev admin key and writes its secret to the token file
# (configs/dev/manager.toml, [api] admin-token-file); every API call carries it.
token_file="$dev/manager/admin-token"
for i in $(seq 60); do
  [ -s "$token_file" ] && break
  alive "$manager" || failed_start manager "the manager exited"
  [ "$i" = 60 ] && failed_start manager "no admin token at $token_file after 30 s"
  sleep 0.5
done
KERNELVISOR_TOKEN=$(cat "$token_file")
export KERNELVISOR_TOKEN
umask 077
printf 'export KERNELVISOR_API=%s\nexport KERNELVISOR_TOKEN=%s\n' "$KERNELVISOR_API" "$KERNELVISOR_TOKEN" >"$dev/env.sh"
umask 022
say "waiting for agent-dev to be ALIVE on the manager…"
for i in $(seq 60); do
  # ALIVE with its heartbeat applied (placement needs the slots it reports).
  agents=$(ctl -o json agents 2>/dev/null || true)
  if printf '%s' "$agents" | grep -q '"status": "ALIVE"' && ! printf '%s' "$agents" | grep -q '"last_heartbeat": null'; then break; fi
  alive "$manager" || failed_start manager "the manager exited"
  alive "$agent" || failed_start agent "the agent exited"
  [ "$i" = 60 ] && failed_start agent "agent-dev was not ALIVE after 60 s"
  sleep 1
done
# The manager refuses kernel calls during its start-up grace period (503 starting-up).
for _ in $(seq 30); do ctl health 2>/dev/null | grep -q normal && break; sleep 0.5; done
ctl agents 2>/dev/null
say ""

# The demo session takes half a core, or nothing when less is free (sessions an earlier run
# created hold the rest): the tour's examples (half a core each) must still fit.
flat=$(printf '%s' "$agents" | tr -d ' \n')
slot_cpu() { printf '%s' "$flat" | sed -n "s/.*\"$1\":{\([^}]*\)}.*/\1/p" | sed -n 's/.*"cpu":"*\([0-9.]*\).*/\1/p'; }
free_cpu=$(awk -v t="$(slot_cpu slots_total)" -v u="$(slot_cpu slots_used)" 'BEGIN { printf "%g", t - u }')
if [ "${KV_DEMO:-1}" = 0 ]; then
  :
elif awk -v f="$free_cpu" 'BEGIN { exit !(f >= 1) }'; then
  ctl vfolder create scratchpad >/dev/null 2>&1 || true   # exists from an earlier run: fine
  created=$(ctl -o json session create --image kernelvisor-test:latest --cpu 0.5 --mem 128m --mount scratchpad) \
    || failed_start manager "the demo session could not be created"
  session=$(printf '%s\n' "$created" | sed -n 's/.*"session_id": *"\([^"]*\)".*/\1/p')
  say "created the demo session $session"
  say '$ kernelvisor ctl session exec '"${session:0:8}"' '\''echo "hello from $(hostname)"; uname -sm'\'
  ctl session exec "$session" 'echo "hello from $(hostname)"; uname -sm'
  say ""
  ctl sessions
else
  say "no demo session: agent-dev has $free_cpu cores free (sessions from earlier runs hold the rest; see \`kernelvisor ctl sessions\`)"
fi
short=${session:0:8}
short=${short:-ID}
say "
kernelvisor dev pair running (CURVE on both channels):
  manager  API $KERNELVISOR_API (metrics /metrics), event intake tcp://127.0.0.1:$event_port
           web console $KERNELVISOR_API/ui/ (sign in with KERNELVISOR_TOKEN from $dev/env.sh)
           store var/dev/manager/manager.db   config $manager_toml   log $dev/logs/manager.log
  agent    RPC tcp://127.0.0.1:$rpc_port, metrics http://127.0.0.1:$metrics_port/metrics
           config $agent_toml   log $dev/logs/agent.log
Try, in another shell:
  source $dev/env.sh                          # KERNELVISOR_API and KERNELVISOR_TOKEN (admin)
  kernelvisor ctl sessions
  kernelvisor ctl session exec $short 'for i in 1 2 3; do echo \$i; sleep 1; done'   # streams as it prints
  kernelvisor ctl session exec -it $short     # a shell in it
  kernelvisor ctl session create --image kernelvisor-test:latest --cpu 0.5 --mem 128m --type batch \\
      --command 'echo start; sleep 3; echo done'        # a batch job; then session logs ID -f, session wait ID
  kernelvisor ctl events -f                   # what happens, as it happens
See README.md's tour for more. Ctrl+C stops both."
# Until a signal (the trap stops the pair) or until one of the pair exits. `wait` returns at once
# when a trapped signal comes, so Ctrl+C is handled without delay. The `sleep` holds none of our
# output: were it to, a reader of it (`just run | tee`, a test's pipe) would wait for it.
while alive "$agent" && alive "$manager"; do
  sleep 1 </dev/null >/dev/null 2>&1 &
  sleeper=$!
  wait "$sleeper" 2>/dev/null
done
alive "$agent" || failed_start agent "the agent exited"
failed_start manager "the manager exited"
