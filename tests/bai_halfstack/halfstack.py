"""A real Backend.AI 26.9.6 halfstack, its agents and the session scenario run on them.

Runs with the venv of the Debian trixie root that scripts/bai-compat-env.sh builds (PostgreSQL 17,
Valkey and etcd from trixie, the pinned Backend.AI packages of scripts/bai-halfstack.lock), as
root, inside the private mount namespace tests/bai_halfstack/halfstack.sh makes (the host's /dev,
/proc, /sys and Docker socket mounted in, the work directory at its own host path). Subcommands:

- ``up``: PostgreSQL, Valkey and etcd on free loopback ports of ``--ports`` with their data
  directories under ``--work``; the manager's and an agent's CURVE keypairs; etcd's Redis
  config; ``createdb`` + ``mgr schema oneshot``; fixtures for the 26.9.6 schema; the users added
  to the ``default`` project through the manager's GraphQL; ``mgr start-server``; a ``local``
  registry and ``mgr image rescan local``. Writes ``<work>/halfstack.json`` (ports, keys,
  credentials, pids) and exits when the manager answers; the servers keep running.
- ``down``: stops every process ``up`` and ``agent-up`` started, by pid (SIGTERM, then SIGKILL).
- ``agent-up`` / ``agent-down``: upstream's own agent (``backend.ai-agent`` 26.9.6, the shape of
  upstream's ``configs/agent/halfstack.toml``) on this halfstack.
- ``wait-agent``: until the manager lists ``--agent-id`` ALIVE.
- ``scenario``: the session scenario through the real client SDK and ``backend.ai`` CLI, one JSON
  line per step (``{"step", "ok", "secs", "error"?, ...}``).
- ``suite``: backend.ai-test's single-node session specs that need no storage proxy/webserver.

A benchmark reuses ``up``/``down`` and ``agent-up`` as they are (``halfstack.json`` names every
port and key); see docs/backend-ai.md, "kernelvisor as the agent of a Backend.AI deployment".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
import uuid
from pathlib import Path
from typing import Any, Callable

VENV = Path(sys.prefix)
BAI = VENV / "bin" / "backend.ai"
PG_BIN = Path("/usr/lib/postgresql/17/bin")

# The fixture's ids and keys (the shape of upstream's fixtures/manager/example-*.json, written
# for the 26.9.6 schema: sgroups_for_domains by ids, keypairs with is_default).
DOMAIN_ID = "b9e676dc-e23e-54c6-b350-e83fba4127e9"
GROUP_ID = "2de2b969-1d04-48a6-af16-0bc8adb3c831"
SGROUP_ID = "4d1e9b32-90c7-5b32-8f0e-6f470b8ed24a"
ADMIN_ID = "f38dea23-50fa-42a0-b5ae-338f5f4693f4"
USER_ID = "dfa9da54-4b28-432f-be29-c0d680c7a412"
ADMIN_EMAIL, ADMIN_PASSWORD = "admin@lablup.com", "wJalrXUt"
ADMIN_AK, ADMIN_SK = "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
USER_AK, USER_SK = "AKIANABBDUSEREXAMPLE", "C8qnIo29EZvXkPK_MXcuAakYTy4NYrxwmCEyNPlf"

# How long each wait may take (a deadline, never a sleep standing for synchronisation).
SERVER_START_LIMIT = 120.0
SESSION_LIMIT = 180.0


def log(msg: str) -> None:
    print(f"halfstack: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Processes, ports and waiting


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_ports(lo: int, hi: int, names: list[str]) -> dict[str, int]:
    """One free loopback port of [lo, hi] per name, in order."""
    out: dict[str, int] = {}
    port = lo
    for name in names:
        while port <= hi and not port_free(port):
            port += 1
        if port > hi:
            raise SystemExit(f"no free port left in {lo}-{hi} for {name}")
        out[name] = port
        port += 1
    return out


def wait_until(what: str, probe: Callable[[], bool], limit: float, proc: subprocess.Popen | None = None,
               logfile: Path | None = None, every: float = 0.1) -> float:
    """Polls `probe` until true; fails after `limit` s, or at once when `proc` exited."""
    start = time.monotonic()
    while True:
        if probe():
            return time.monotonic() - start
        if proc is not None and proc.poll() is not None:
            tail = logfile.read_text(errors="replace")[-4000:] if logfile else ""
            raise SystemExit(f"{what}: the process exited ({proc.returncode}); log tail:\n{tail}")
        if time.monotonic() - start > limit:
            tail = logfile.read_text(errors="replace")[-4000:] if logfile else ""
            raise SystemExit(f"{what}: not ready after {limit:.0f} s; log tail:\n{tail}")
        time.sleep(every)


def tcp_open(port: int) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False
    return probe


def spawn(name: str, argv: list[str], work: Path, state: dict, *, user: str | None = None,
          env: dict | None = None, cwd: Path | None = None) -> subprocess.Popen:
    """Starts a long-running server (its own session, output to <work>/logs/<name>.log) and
    records its pid in `state["pids"]` for `down`."""
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    logfile = logs / f"{name}.log"
    if user is not None:
        argv = ["runuser", "-u", user, "--", *argv]
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=open(logfile, "ab"), stderr=subprocess.STDOUT,
        start_new_session=True, env=env, cwd=cwd or work,
    )
    state.setdefault("pids", {})[name] = proc.pid
    save_state(work, state)
    return proc


def run(argv: list[str], *, work: Path | None = None, env: dict | None = None, user: str | None = None,
        check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    if user is not None:
        argv = ["runuser", "-u", user, "--", *argv]
    cp = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=work, timeout=timeout)
    if check and cp.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, argv))}: exit {cp.returncode}\n{cp.stdout[-3000:]}\n{cp.stderr[-3000:]}")
    return cp


def stop_pid(pid: int, limit: float = 20.0) -> None:
    """SIGTERM to the process group `pid` leads, then SIGKILL after `limit` s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        except PermissionError:
            os.kill(pid, sig)
        start = time.monotonic()
        while time.monotonic() - start < limit:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            # A child of ours (up's own run) is reaped; otherwise the init reaps it.
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.05)


def state_path(work: Path) -> Path:
    return work / "halfstack.json"


def load_state(work: Path) -> dict:
    return json.loads(state_path(work).read_text())


def save_state(work: Path, state: dict) -> None:
    tmp = state_path(work).with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(state_path(work))


def mgr(work: Path, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    """`backend.ai mgr <args>` with this halfstack's manager.toml (the CLI reads etcd and the
    database from it)."""
    return run([str(BAI), "mgr", "-f", str(work / "manager.toml"), *args], work=work, check=check,
               timeout=timeout, env={**os.environ, "BACKEND_CONFIG_FILE": str(work / "manager.toml")})


# ---------------------------------------------------------------------------------------------
# up


def manager_toml(work: Path, p: dict[str, int]) -> str:
    return textwrap.dedent(f"""\
        [etcd]
        namespace = "local"
        addr = {{ host = "127.0.0.1", port = {p['etcd']} }}
        user = ""
        password = ""

        [db]
        type = "postgresql"
        addr = {{ host = "127.0.0.1", port = {p['pg']} }}
        name = "backend"
        user = "postgres"
        password = "develove"

        [manager]
        num-proc = 1
        service-addr = {{ host = "127.0.0.1", port = {p['manager']} }}
        internal-addr = {{ host = "127.0.0.1", port = {p['manager_internal']} }}
        announce-internal-addr = {{ host = "127.0.0.1", port = {p['manager_internal']} }}
        ssl-enabled = false
        heartbeat-timeout = 40.0
        rpc-auth-manager-keypair = "{work}/keys/manager.key_secret"
        pid-file = "{work}/manager.pid"
        ipc-base-path = "{work}/ipc"
        distributed-lock = "pg_advisory"
        hide-agents = false
        aiomonitor-termui-port = {p['aiomon_termui']}
        aiomonitor-webui-port = {p['aiomon_webui']}
        disabled-plugins = []

        [docker-registry]
        ssl-verify = false

        [logging]
        level = "INFO"
        drivers = ["console"]

        [logging.pkg-ns]
        "" = "WARNING"
        "ai.backend" = "INFO"
        "aiohttp" = "WARNING"
        "alembic" = "WARNING"
        "sqlalchemy" = "WARNING"

        [logging.console]
        colored = false
        format = "verbose"

        [debug]
        enabled = false
        """)


def alembic_ini(p: dict[str, int]) -> str:
    return textwrap.dedent(f"""\
        [alembic]
        script_location = ai.backend.manager.models:alembic
        sqlalchemy.url = postgresql+asyncpg://postgres:develove@127.0.0.1:{p['pg']}/backend

        [loggers]
        keys = root

        [handlers]
        keys = console

        [formatters]
        keys = generic

        [logger_root]
        level = WARN
        handlers = console
        qualname =

        [handler_console]
        class = StreamHandler
        args = (sys.stderr,)
        level = NOTSET
        formatter = generic

        [formatter_generic]
        format = %(levelname)-5.5s [%(name)s] %(message)s
        """)


def fixtures() -> dict[str, list[dict]]:
    """Upstream's example fixtures reduced to what the scenario needs (a domain, the `default`
    project and resource group, a superadmin and a user with their keypairs, the `local`
    registry, the cpu/mem slot types), written for the 26.9.6 schema; tables and columns the
    database lacks are dropped by `populate_fixtures`."""
    vfolder_perms = ["create-vfolder", "modify-vfolder", "delete-vfolder", "mount-in-session",
                     "upload-file", "download-file"]
    return {
        "domains": [{
            "id": DOMAIN_ID, "name": "default", "description": "The default domain",
            "is_active": True, "total_resource_slots": {}, "allowed_vfolder_hosts": {},
            "allowed_docker_registries": ["local"],
        }],
        "user_resource_policies": [{"name": "default", "max_vfolder_count": 0,
                                    "max_quota_scope_size": -1,
                                    "max_session_count_per_model_session": 10}],
        "project_resource_policies": [{"name": "default", "max_vfolder_count": 0,
                                       "max_quota_scope_size": -1, "max_network_count": 3}],
        "keypair_resource_policies": [{
            "name": "default", "is_default": True, "default_for_unspecified": "UNLIMITED",
            "total_resource_slots": {}, "max_session_lifetime": 0, "max_concurrent_sessions": 30,
            "max_containers_per_session": 1, "idle_timeout": 3600,
            "allowed_vfolder_hosts": {"local:volume1": vfolder_perms},
        }],
        "groups": [{
            "id": GROUP_ID, "name": "default", "description": "The default project",
            "is_active": True, "domain_name": "default", "resource_policy": "default",
            "total_resource_slots": {}, "allowed_vfolder_hosts": {}, "type": "general",
        }],
        "scaling_groups": [{
            "id": SGROUP_ID, "name": "default", "description": "The default resource group",
            "is_active": True, "is_default": True, "driver": "static", "driver_opts": {},
            "scheduler": "fifo", "scheduler_opts": {}, "wsproxy_addr": "",
            "wsproxy_api_token": "",
        }],
        "sgroups_for_domains": [{"resource_group_id": SGROUP_ID, "domain_id": DOMAIN_ID,
                                 "scaling_group": "default", "domain": "default"}],
        "sgroups_for_groups": [{"resource_group_id": SGROUP_ID, "group_id": GROUP_ID,
                                "scaling_group": "default", "group": GROUP_ID}],
        "users": [
            {"uuid": ADMIN_ID, "username": "admin", "email": ADMIN_EMAIL,
             "password": ADMIN_PASSWORD, "need_password_change": False,
             "full_name": "Admin", "description": "superadmin", "status": "active",
             "status_info": "admin-requested", "domain_name": "default",
             "domain_id": DOMAIN_ID, "resource_policy": "default", "role": "superadmin"},
            {"uuid": USER_ID, "username": "user", "email": "user@lablup.com",
             "password": "C8qnIo29", "need_password_change": False, "full_name": "User",
             "description": "user", "status": "active", "status_info": "admin-requested",
             "domain_name": "default", "domain_id": DOMAIN_ID, "resource_policy": "default",
             "role": "user"},
        ],
        "keypairs": [
            {"access_key": ADMIN_AK, "secret_key": ADMIN_SK, "is_active": True,
             "resource_policy": "default", "rate_limit": 30000, "num_queries": 0,
             "is_admin": True, "is_default": True, "user": ADMIN_ID,
             "user_id": ADMIN_EMAIL},
            {"access_key": USER_AK, "secret_key": USER_SK, "is_active": True,
             "resource_policy": "default", "rate_limit": 30000, "num_queries": 0,
             "is_admin": False, "is_default": True, "user": USER_ID,
             "user_id": "user@lablup.com"},
        ],
        "association_groups_users": [
            {"group_id": GROUP_ID, "user_id": ADMIN_ID},
            {"group_id": GROUP_ID, "user_id": USER_ID},
        ],
        "container_registries": [{
            "id": "fe878f09-06cc-4b91-9242-4c71015cce05", "registry_name": "local",
            "url": "http://localhost", "type": "local", "project": "kernelvisor",
        }],
        "resource_slot_types": [
            {"uuid": "eff6619c-a85c-40f4-ae59-608b0f683b4f", "slot_name": "cpu",
             "slot_type": "count", "required": True, "display_name": "CPU",
             "description": "CPU", "display_unit": "Core", "display_icon": "cpu",
             "number_format": {"binary": False, "round_length": 0}, "rank": 100},
            {"uuid": "9d1a589e-2a78-491e-97d0-32d2a0079564", "slot_name": "mem",
             "slot_type": "bytes", "required": True, "display_name": "RAM",
             "description": "Memory", "display_unit": "GiB", "display_icon": "ram",
             "number_format": {"binary": True, "round_length": 0}, "rank": 200},
        ],
    }


def psql(p: dict[str, int], sql: str) -> str:
    return run([str(PG_BIN / "psql"), "-h", "127.0.0.1", "-p", str(p["pg"]), "-U", "postgres",
                "-d", "backend", "-AtX", "-c", sql], user="postgres").stdout


def populate_fixtures(work: Path, p: dict[str, int]) -> None:
    """`mgr fixture populate` with `fixtures()`, keeping only the tables and columns this
    schema has (the published fixtures predate 26.9.6's)."""
    cols: dict[str, set[str]] = {}
    for line in psql(p, "select table_name, column_name from information_schema.columns "
                        "where table_schema = 'public'").splitlines():
        t, c = line.split("|", 1)
        cols.setdefault(t, set()).add(c)
    data: dict[str, list[dict]] = {}
    for table, rows in fixtures().items():
        if table not in cols:
            log(f"fixtures: the schema has no table {table}; left out")
            continue
        data[table] = [{k: v for k, v in r.items() if k in cols[table]} for r in rows]
    path = work / "fixtures.json"
    path.write_text(json.dumps(data, indent=1))
    mgr(work, "fixture", "populate", str(path))


def generate_keypair(keys: Path, name: str) -> None:
    """A CURVE keypair as `backend.ai mgr generate-rpc-keypair` writes it (zmq.auth)."""
    import zmq.auth

    zmq.auth.create_certificates(str(keys), name)


def client_env(state: dict, access_key: str = ADMIN_AK, secret_key: str = ADMIN_SK) -> dict:
    return {
        "BACKEND_ENDPOINT": f"http://127.0.0.1:{state['ports']['manager']}",
        "BACKEND_ENDPOINT_TYPE": "api",
        "BACKEND_ACCESS_KEY": access_key,
        "BACKEND_SECRET_KEY": secret_key,
        "BACKEND_DOMAIN": "default",
        "BACKEND_GROUP": "default",
        "BACKEND_SKIP_SSLCERT_VALIDATION": "true",
    }


def api_session(state: dict):
    from ai.backend.client.config import APIConfig
    from ai.backend.client.session import Session

    env = client_env(state)
    return Session(config=APIConfig(endpoint=env["BACKEND_ENDPOINT"], endpoint_type="api",
                                    access_key=ADMIN_AK, secret_key=ADMIN_SK,
                                    domain="default", group="default"))


def reserve_ports(spec: str) -> None:
    """Adds `spec` (`lo-hi`) to the kernel's ip_local_reserved_ports, so that no outgoing
    connection takes one of them as its ephemeral port (this range lies within Linux's
    32768-60999, and a kernel's host port once met `bind: address already in use` from one).
    Binding a reserved port explicitly works as before. Left as it is when already there."""
    path = Path("/proc/sys/net/ipv4/ip_local_reserved_ports")
    have = path.read_text().strip()
    if spec in have.split(","):
        return
    path.write_text(",".join(x for x in (have, spec) if x))


def cmd_up(args: argparse.Namespace) -> None:
    t0 = time.monotonic()
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    lo, hi = (int(x) for x in args.ports.split("-"))
    reserve_ports(args.reserve)
    p = pick_ports(lo, hi, ["pg", "valkey", "etcd", "etcd_peer", "manager", "manager_internal",
                            "aiomon_termui", "aiomon_webui"])
    state: dict[str, Any] = {"work": str(work), "ports": p, "pids": {}, "timings": {}}
    save_state(work, state)
    (work / "ipc").mkdir(exist_ok=True)
    keys = work / "keys"
    keys.mkdir(exist_ok=True)
    generate_keypair(keys, "manager")
    generate_keypair(keys, "agent")
    state["keys"] = {k: str(keys / k) for k in
                     ("manager.key", "manager.key_secret", "agent.key", "agent.key_secret")}

    # PostgreSQL 17: a cluster of its own (trust on loopback), fsync off (a test's database).
    pg = work / "pg"
    pg.mkdir(exist_ok=True)
    shutil.chown(pg, "postgres", "postgres")
    os.chmod(pg, 0o700)
    pgsock = work / "pgsock"
    pgsock.mkdir(exist_ok=True)
    shutil.chown(pgsock, "postgres", "postgres")
    os.chmod(work, 0o755)
    run([str(PG_BIN / "initdb"), "-D", str(pg), "-U", "postgres", "--auth=trust", "-E", "UTF8",
         "--no-sync"], user="postgres")
    pg_proc = spawn("postgres", [str(PG_BIN / "postgres"), "-D", str(pg), "-p", str(p["pg"]),
                                 "-k", str(pgsock), "-c", "listen_addresses=127.0.0.1",
                                 "-c", "fsync=off", "-c", "synchronous_commit=off",
                                 "-c", "full_page_writes=off", "-c", "max_connections=200"],
                    work, state, user="postgres")
    valkey_dir = work / "valkey"
    valkey_dir.mkdir(exist_ok=True)
    valkey = spawn("valkey", ["/usr/bin/valkey-server", "--port", str(p["valkey"]), "--bind", "127.0.0.1",
                              "--dir", str(valkey_dir), "--save", "", "--appendonly", "no",
                              "--protected-mode", "no"], work, state)
    etcd = spawn("etcd", ["/usr/bin/etcd", "--name", "halfstack", "--data-dir", str(work / "etcd"),
                          "--listen-client-urls", f"http://127.0.0.1:{p['etcd']}",
                          "--advertise-client-urls", f"http://127.0.0.1:{p['etcd']}",
                          "--listen-peer-urls", f"http://127.0.0.1:{p['etcd_peer']}",
                          "--initial-advertise-peer-urls", f"http://127.0.0.1:{p['etcd_peer']}",
                          "--initial-cluster", f"halfstack=http://127.0.0.1:{p['etcd_peer']}",
                          "--unsafe-no-fsync", "--log-level", "warn"], work, state)
    logs = work / "logs"
    wait_until("postgres", tcp_open(p["pg"]), SERVER_START_LIMIT, pg_proc, logs / "postgres.log")
    wait_until("valkey", tcp_open(p["valkey"]), SERVER_START_LIMIT, valkey, logs / "valkey.log")
    wait_until("etcd", tcp_open(p["etcd"]), SERVER_START_LIMIT, etcd, logs / "etcd.log")
    wait_until("postgres accepting", lambda: run([str(PG_BIN / "pg_isready"), "-h", "127.0.0.1", "-p",
                                                  str(p["pg"])], check=False).returncode == 0,
               SERVER_START_LIMIT, pg_proc, logs / "postgres.log")
    state["timings"]["servers"] = round(time.monotonic() - t0, 2)
    log(f"servers up in {state['timings']['servers']} s: {p}")

    (work / "manager.toml").write_text(manager_toml(work, p))
    (work / "alembic.ini").write_text(alembic_ini(p))
    run([str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(p["pg"]), "-U", "postgres", "backend"],
        user="postgres")
    # etcd's config (the manager reads Valkey's address from it) beside the schema.
    etcd_cfg = work / "etcd-config.json"
    etcd_cfg.write_text(json.dumps({
        "redis": {"addr": f"127.0.0.1:{p['valkey']}",
                  "redis_helper_config": {"socket_timeout": 5.0, "socket_connect_timeout": 2.0,
                                          "reconnect_poll_timeout": 0.3}},
    }))
    etcd_put = subprocess.Popen([str(BAI), "mgr", "-f", str(work / "manager.toml"), "etcd", "put-json",
                                 "config", str(etcd_cfg)], cwd=work, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    mgr(work, "schema", "oneshot", "-f", str(work / "alembic.ini"))
    out, _ = etcd_put.communicate(timeout=300)
    if etcd_put.returncode != 0:
        raise SystemExit(f"mgr etcd put-json config: exit {etcd_put.returncode}\n{out[-3000:]}")
    populate_fixtures(work, p)
    state["timings"]["bootstrap"] = round(time.monotonic() - t0, 2)
    log(f"schema, etcd and fixtures done at {state['timings']['bootstrap']} s")

    manager = spawn("manager", [str(BAI), "mgr", "start-server", "-f", str(work / "manager.toml")],
                    work, state)

    def answers() -> bool:
        import urllib.request
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{p['manager']}/", timeout=2) as r:
                return r.status == 200
        except Exception:
            return False

    wait_until("manager", answers, SERVER_START_LIMIT, manager, logs / "manager.log", every=0.2)
    state["timings"]["manager"] = round(time.monotonic() - t0, 2)
    log(f"manager answers at {state['timings']['manager']} s")

    # Project membership lives in 26.9.6's RBAC graph, which fixtures do not fill: add the users
    # to `default` through the manager's own GraphQL (modify_group, user_update_mode "add").
    with api_session(state) as s:
        q = ("mutation($gid: UUID!, $props: ModifyGroupInput!) {"
             " modify_group(gid: $gid, props: $props) { ok msg } }")
        r = s.Admin.query(q, {"gid": GROUP_ID,
                              "props": {"user_update_mode": "add", "user_uuids": [ADMIN_ID, USER_ID]}})
        if not r["modify_group"]["ok"]:
            raise SystemExit(f"modify_group: {r}")
    # The engine's labelled images, as `local/<repo>:<tag>`.
    mgr(work, "image", "rescan", "local")
    images = mgr(work, "image", "list").stdout
    state["images"] = images
    state["timings"]["up"] = round(time.monotonic() - t0, 2)
    save_state(work, state)
    log(f"up in {state['timings']['up']} s; images:\n{images}")
    print(json.dumps({"up": state["timings"], "ports": p}), flush=True)


def cmd_rescan(args: argparse.Namespace) -> None:
    """`mgr image rescan local` again (an image built after `up`)."""
    work = Path(args.work)
    cp = mgr(work, "image", "rescan", "local")
    log(cp.stdout[-3000:] + cp.stderr[-3000:])
    print(mgr(work, "image", "list").stdout, flush=True)


def cmd_down(args: argparse.Namespace) -> None:
    work = Path(args.work).resolve()
    if not state_path(work).exists():
        return
    state = load_state(work)
    # The manager and agents first (they hold connections to the servers), then the servers.
    order = ["upstream-agent", "manager", "etcd", "valkey", "postgres"]
    pids = state.get("pids", {})
    for name in sorted(pids, key=lambda n: order.index(n) if n in order else -1):
        stop_pid(int(pids[name]))
        log(f"stopped {name} ({pids[name]})")
    state["pids"] = {}
    save_state(work, state)
    agents = list(args.agent_id or [])
    if "upstream_agent" in state:
        agents.append(state["upstream_agent"]["id"])
    for agent_id in agents:
        remove_containers(agent_id)


def remove_containers(agent_id: str) -> None:
    """Removes every container of agent `agent_id` (label ai.backend.agent-id) and upstream's
    socket relay of it (`backendai-socket-relay.<id>`, which carries no agent label)."""
    ids = run(["docker", "ps", "-aq", "--filter", f"label=ai.backend.agent-id={agent_id}"],
              check=False).stdout.split()
    relay = f"backendai-socket-relay.{agent_id}"
    if run(["docker", "container", "inspect", relay], check=False).returncode == 0:
        ids.append(relay)
    if ids:
        run(["docker", "rm", "-f", *ids], check=False)
        log(f"removed {len(ids)} container(s) of {agent_id}")


# ---------------------------------------------------------------------------------------------
# Upstream's own agent


def upstream_agent_toml(state: dict, agent_id: str, p: dict[str, int], d: Path,
                        kernel_uid: int = -1) -> str:
    """The shape of upstream's configs/agent/halfstack.toml: etcd, CURVE keys, the resource
    group, scratch directories and ports of this halfstack. Every path is one the Docker engine
    sees at the same place (the work directory is mounted at its host path). `kernel_uid` is
    the kernels' uid and gid (-1: the agent's own, root here, as upstream's default)."""
    keys = state["keys"]
    lo, hi = p["container_lo"], p["container_hi"]
    return textwrap.dedent(f"""\
        [etcd]
        namespace = "local"
        addr = {{ host = "127.0.0.1", port = {state['ports']['etcd']} }}
        user = ""
        password = ""

        [agent]
        mode = "docker"
        id = "{agent_id}"
        rpc-listen-addr = {{ host = "127.0.0.1", port = {p['rpc']} }}
        service-addr = {{ host = "127.0.0.1", port = {p['service']} }}
        rpc-auth-manager-public-key = "{keys['manager.key']}"
        rpc-auth-agent-keypair = "{keys['agent.key_secret']}"
        agent-sock-port = {p['sock']}
        aiomonitor-termui-port = {p['aiomon_termui']}
        aiomonitor-webui-port = {p['aiomon_webui']}
        metadata-server-bind-host = "127.0.0.1"
        metadata-server-port = {p['metadata']}
        initial-resource-group-name = "default"
        pid-file = "{d}/agent.pid"
        ipc-base-path = "{d}/ipc"
        var-base-path = "{d}/var"
        image-commit-path = "{d}/commit"
        mount-path = "{d}/vfroot"
        cohabiting-storage-proxy = false

        [container]
        port-range = [{lo}, {hi}]
        kernel-uid = {kernel_uid}
        kernel-gid = {kernel_uid}
        bind-host = "127.0.0.1"
        sandbox-type = "docker"
        scratch-type = "hostdir"
        scratch-root = "{d}/scratches"
        scratch-size = "1G"

        [logging]
        level = "INFO"
        drivers = ["console"]

        [logging.pkg-ns]
        "" = "WARNING"
        "aiodocker" = "WARNING"
        "ai.backend" = "INFO"

        [logging.console]
        colored = false
        format = "verbose"

        [resource]
        reserved-cpu = 0
        reserved-mem = "0"
        reserved-disk = "0"

        [debug]
        enabled = false
        """)


def cmd_agent_up(args: argparse.Namespace) -> None:
    """Starts upstream's agent (backend.ai-agent 26.9.6) and waits until the manager lists it
    ALIVE in the resource group `default`."""
    work = Path(args.work)
    state = load_state(work)
    lo, hi = (int(x) for x in args.ports.split("-"))
    p = pick_ports(lo, lo + 19, ["rpc", "service", "sock", "aiomon_termui", "aiomon_webui", "metadata"])
    p["container_lo"], p["container_hi"] = lo + 20, hi
    d = work / "upstream-agent"
    for sub in ("ipc", "var", "commit", "vfroot", "scratches"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "agent.toml").write_text(upstream_agent_toml(state, args.agent_id, p, d, args.kernel_uid))
    t = time.monotonic()
    # `python -m` with this interpreter as halfstack.sh invoked it (ROOT/opt/bai/bin/python):
    # the agent's runner files then have their host paths (the `backend.ai` script's shebang
    # would make them /opt/bai/..., which the engine would create empty on the host).
    if sys.prefix == "/opt/bai":
        raise SystemExit(f"run under halfstack.sh (sys.prefix {sys.prefix} is not the host path)")
    # Upstream's CPU plugin allocates whole cores; its own overcommit factor (1-10, env) lets a
    # small node hold more kernels than cores (the benchmark's twenty).
    env = {**os.environ, "BACKEND_CPU_OVERCOMMIT_FACTOR": str(args.cpu_overcommit)}
    proc = spawn("upstream-agent", [sys.executable, "-m", "ai.backend.cli", "ag", "start-server",
                                    "-f", str(d / "agent.toml")], work, state, cwd=d, env=env)
    state = load_state(work)
    state["upstream_agent"] = {"id": args.agent_id, "ports": p, "dir": str(d)}
    save_state(work, state)
    start = time.monotonic()

    async def wait() -> None:
        async with async_session(state) as sess:
            while True:
                a = await agent_status(sess, args.agent_id)
                if a is not None and a["status"] == "ALIVE":
                    return
                if proc.poll() is not None:
                    raise SystemExit(f"upstream's agent exited ({proc.returncode}); log tail:\n"
                                     + (work / "logs" / "upstream-agent.log").read_text(errors="replace")[-4000:])
                if time.monotonic() - start > SERVER_START_LIMIT:
                    raise SystemExit(f"upstream's agent is {a} after {SERVER_START_LIMIT:.0f} s; log tail:\n"
                                     + (work / "logs" / "upstream-agent.log").read_text(errors="replace")[-4000:])
                await asyncio.sleep(0.2)

    asyncio.run(wait())
    print(json.dumps({"agent": args.agent_id, "alive_secs": round(time.monotonic() - t, 2)}), flush=True)


def cmd_agent_down(args: argparse.Namespace) -> None:
    work = Path(args.work)
    state = load_state(work)
    pid = state.get("pids", {}).pop("upstream-agent", None)
    if pid is not None:
        stop_pid(int(pid), limit=30.0)
    save_state(work, state)
    if "upstream_agent" in state:
        remove_containers(state["upstream_agent"]["id"])


# ---------------------------------------------------------------------------------------------
# The agent as the manager sees it


async def agent_status(sess, agent_id: str) -> dict | None:
    # `agent(agent_id)` answers an internal error for an id it does not know: list them all.
    q = ("query { agent_list(limit: 100, offset: 0) { items {"
         " id status scaling_group addr architecture } } }")
    r = await sess.Admin._query(q, {})
    for a in r["agent_list"]["items"]:
        if a["id"] == agent_id:
            return a
    return None


def async_session(state: dict, access_key: str = ADMIN_AK, secret_key: str = ADMIN_SK):
    from ai.backend.client.config import APIConfig
    from ai.backend.client.session import AsyncSession

    env = client_env(state)
    return AsyncSession(config=APIConfig(endpoint=env["BACKEND_ENDPOINT"], endpoint_type="api",
                                         access_key=access_key, secret_key=secret_key,
                                         domain="default", group="default"))


async def wait_agent(state: dict, agent_id: str, want: str = "ALIVE", limit: float = 90.0) -> float:
    """Seconds until the manager lists `agent_id` with status `want`."""
    start = time.monotonic()
    async with async_session(state) as sess:
        while True:
            a = await agent_status(sess, agent_id)
            if a is not None and a["status"] == want:
                return time.monotonic() - start
            if time.monotonic() - start > limit:
                raise RuntimeError(f"agent {agent_id}: {a} after {limit:.0f} s, not {want}")
            await asyncio.sleep(0.2)


def cmd_wait_agent(args: argparse.Namespace) -> None:
    state = load_state(Path(args.work))
    secs = asyncio.run(wait_agent(state, args.agent_id, args.status, args.limit))
    print(json.dumps({"agent": args.agent_id, "status": args.status, "secs": round(secs, 2)}),
          flush=True)


# ---------------------------------------------------------------------------------------------
# The session scenario


class Steps:
    """Runs named steps, printing one JSON line each; a step's body returns extra fields."""

    def __init__(self, label: str, only: set[str] | None = None) -> None:
        self.label = label
        self.only = only
        self.failed: set[str] = set()

    async def step(self, name: str, body, *, needs: tuple[str, ...] = ()) -> Any:
        if self.only is not None and name not in self.only:
            return None
        blocked = [n for n in needs if n in self.failed]
        if blocked:
            self.failed.add(name)
            self.emit({"step": name, "ok": False, "secs": 0.0,
                       "error": f"not run: {', '.join(blocked)} failed"})
            return None
        start = time.monotonic()
        try:
            extra = await body()
        except Exception as e:
            self.failed.add(name)
            self.emit({"step": name, "ok": False, "secs": round(time.monotonic() - start, 3),
                       "error": f"{type(e).__name__}: {e}"[:1500]})
            traceback.print_exc(file=sys.stderr)
            return None
        rec = {"step": name, "ok": True, "secs": round(time.monotonic() - start, 3)}
        if isinstance(extra, dict):
            rec.update(extra)
        self.emit(rec)
        return extra

    def emit(self, rec: dict) -> None:
        rec["agent"] = self.label
        print(json.dumps(rec), flush=True)


def console_text(result: dict, kind: str = "stdout") -> str:
    return "".join(r[1] for r in result.get("console", []) if r[0] == kind and isinstance(r[1], str))


async def ws_run(sess, code: str, mode: str = "query", opts: dict | None = None,
                 limit: float = 60.0) -> list[dict]:
    """One run over the WebSocket execute API, every message until `finished`."""
    import aiohttp

    out: list[dict] = []

    async def loop() -> None:
        async with sess.stream_execute(code, mode=mode, opts=opts) as stream:
            async for msg in stream:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    continue
                data = json.loads(msg.data)
                out.append(data)
                if data.get("status") == "finished":
                    return
            raise RuntimeError(f"the stream closed before `finished`: {out}")

    await asyncio.wait_for(loop(), limit)
    return out


async def wait_session_gone(api, sess, limit: float = 60.0) -> str:
    """Until the manager no longer lists the session as alive; its last status."""
    start = time.monotonic()
    last = ""
    while time.monotonic() - start < limit:
        try:
            info = await sess.get_info()
            last = str(info.get("status"))
        except Exception as e:
            # 404 once it is gone from the live list.
            if "404" in str(e) or "not found" in str(e).lower():
                return "TERMINATED"
            raise
        if last in ("TERMINATED", "CANCELLED", "ERROR"):
            return last
        await asyncio.sleep(0.2)
    raise RuntimeError(f"still {last} after {limit:.0f} s")


async def batch_session(api, image: str, command: str, want_event: str, want_reason: str) -> dict:
    """A batch session running `command`: the manager's `want_event` (`session_success` /
    `session_failure`) with reason `want_reason` (`task-finished` / `task-failed`) on its event
    stream. The stream is opened once the session exists (upstream's own suite opens it
    earlier, which 26.9.6 answers 404), and this session's events are picked by id (the stream
    also carries other sessions'). The exit code is reported as the SSE carries it: 26.9.6's
    propagator reads `exit_code` from event data that has none, so it is null on either agent
    (and the kernel's status_data says `exit_code: -1`)."""
    sess = await api.ComputeSession.get_or_create(
        image, type_="batch", startup_command=command, enqueue_only=True,
        resources={"cpu": 1, "mem": "512m"}, name=f"hs-batch-{uuid.uuid4().hex[:8]}")
    sid = str(sess.id)
    seen: list[tuple[str, Any, str]] = []

    async def listen() -> None:
        async with sess.listen_events() as events:
            async for ev in events:
                data = json.loads(ev.data) if ev.data else {}
                if data.get("sessionId") != sid:
                    continue
                seen.append((ev.event, data.get("exitCode"), data.get("reason", "")))
                if ev.event in ("session_success", "session_failure", "session_cancelled"):
                    return
                if ev.event == "session_terminated":
                    return

    try:
        await asyncio.wait_for(listen(), SESSION_LIMIT)
    except asyncio.TimeoutError:
        raise RuntimeError(f"no end of session in {SESSION_LIMIT:.0f} s; saw {seen}")
    finals = [e for e in seen if e[0] in ("session_success", "session_failure")]
    if not finals:
        raise RuntimeError(f"the session ended without session_success/session_failure: {seen}")
    name, code, reason = finals[-1]
    if name != want_event or reason != want_reason:
        raise RuntimeError(f"{name} (reason {reason!r}), not {want_event} ({want_reason}); saw {seen}")
    return {"events": [e[0] for e in seen], "exitCode": code}


async def scenario(state: dict, args: argparse.Namespace) -> None:
    image = args.image
    st = Steps(args.label, set(args.only.split(",")) if args.only else None)
    files_dir = Path(tempfile.mkdtemp(prefix="hs-files-", dir=state["work"]))
    async with async_session(state) as api:
        await st.step("agent_registered", lambda: agent_registered(api, args.agent_id))
        box: dict[str, Any] = {}

        async def create() -> dict:
            t = time.monotonic()
            sess = await api.ComputeSession.get_or_create(
                image, type_="interactive", resources={"cpu": 1, "mem": "512m"},
                name=f"hs-{args.label}-{uuid.uuid4().hex[:6]}", max_wait=int(SESSION_LIMIT))
            info = await sess.get_info()
            box["sess"] = sess
            if info.get("status") != "RUNNING":
                raise RuntimeError(f"status {info.get('status')}: {info}")
            return {"create_to_running": round(time.monotonic() - t, 2),
                    "agent_id": (info.get("agentIds") or info.get("agent_ids") or [None])[0]}

        made = await st.step("interactive_session_running", create, needs=("agent_registered",))
        needs = ("interactive_session_running",)

        async def rest_query() -> dict:
            sess = box["sess"]
            r1 = await sess.execute(None, "x = 41", mode="query")
            if r1.get("status") != "finished":
                raise RuntimeError(f"x = 41: {r1}")
            r2 = await sess.execute(None, "x + 1", mode="query")
            if r2.get("status") != "finished" or "42" not in console_text(r2):
                raise RuntimeError(f"x + 1: {r2}")
            return {"console": console_text(r2).strip()}

        async def ws_query() -> dict:
            msgs = await ws_run(box["sess"], "x + 1")
            text = "".join(console_text(m) for m in msgs)
            if "42" not in text:
                raise RuntimeError(f"x + 1 over the WebSocket: {msgs}")
            msgs = await ws_run(box["sess"], "print('ws', x * 2)")
            text = "".join(console_text(m) for m in msgs)
            if "ws 82" not in text:
                raise RuntimeError(f"print over the WebSocket: {msgs}")
            return {"console": text.strip()}

        async def batch_mode() -> dict:
            msgs = await ws_run(box["sess"], "", mode="batch",
                                opts={"exec": "python3 -c 'print(6 * 7)'; exit 4"})
            statuses = [m.get("status") for m in msgs]
            text = "".join(console_text(m) for m in msgs)
            last = msgs[-1]
            if last.get("exitCode") != 4 or "42" not in text:
                raise RuntimeError(f"batch: statuses {statuses} exit {last.get('exitCode')} console {text!r}")
            return {"statuses": statuses}

        async def files() -> dict:
            sess = box["sess"]
            src = files_dir / "hs-upload.txt"
            body = f"halfstack {uuid.uuid4()}\n" * 100
            src.write_text(body)
            await sess.upload([src], basedir=files_dir)
            listing = await sess.list_files(".")
            names = [f["filename"] for f in json.loads(listing["files"])] if isinstance(
                listing.get("files"), str) else [f.get("filename") for f in listing.get("files", [])]
            if "hs-upload.txt" not in names:
                raise RuntimeError(f"list_files: {listing}")
            dest = files_dir / "down"
            dest.mkdir()
            await sess.download(["hs-upload.txt"], dest=dest)
            got = (dest / "hs-upload.txt").read_text()
            if got != body:
                raise RuntimeError(f"downloaded {len(got)} bytes, not the {len(body)} uploaded")
            return {"listed": len(names)}

        async def logs() -> dict:
            r = await box["sess"].get_logs()
            text = r.get("result", {}).get("logs", "") if isinstance(r.get("result"), dict) else str(r)
            if not text.strip():
                raise RuntimeError(f"empty container log: {r}")
            return {"log_bytes": len(text)}

        async def service_ports() -> dict:
            # The apps a client can open (GET /stream/session/<id>/apps): the kernel's service
            # ports as the agent reported them in its creation info.
            apps = await box["sess"].stream_app_info()
            names = sorted(a.get("name") for a in apps)
            missing = {"ttyd", "sshd"} - set(names)
            if missing:
                raise RuntimeError(f"service ports {names} lack {sorted(missing)}")
            return {"service_ports": names}

        async def destroy() -> dict:
            sess = box["sess"]
            t = time.monotonic()
            await sess.destroy()
            last = await wait_session_gone(api, sess)
            return {"status": last, "destroy_secs": round(time.monotonic() - t, 2)}

        await st.step("rest_query_state", rest_query, needs=needs)
        await st.step("websocket_query_state", ws_query, needs=needs)
        await st.step("batch_mode_exec", batch_mode, needs=needs)
        await st.step("upload_list_download", files, needs=needs)
        await st.step("logs", logs, needs=needs)
        await st.step("service_ports_ttyd_sshd", service_ports, needs=needs)
        await st.step("destroy", destroy, needs=needs)
        await st.step("batch_session_success",
                      lambda: batch_session(api, image, "python3 -c 'print(6 * 7)'", "session_success",
                                            "task-finished"),
                      needs=("agent_registered",))
        await st.step("batch_session_failure",
                      lambda: batch_session(api, image, "python3 -c 'import sys; sys.exit(3)'",
                                            "session_failure", "task-failed"),
                      needs=("agent_registered",))

    async def cli_run() -> dict:
        env = {**os.environ, **client_env(state)}
        cp = await asyncio.to_thread(
            subprocess.run,
            [str(BAI), "run", "--rm", "-r", "cpu=1", "-r", "mem=512m", "-c", "print(6 * 7)", image],
            capture_output=True, text=True, env=env, timeout=SESSION_LIMIT)
        if cp.returncode != 0 or "42" not in cp.stdout:
            raise RuntimeError(f"exit {cp.returncode}; stdout {cp.stdout[-800:]!r}; stderr {cp.stderr[-800:]!r}")
        return {}

    await st.step("cli_run_rm", cli_run, needs=("agent_registered",))
    shutil.rmtree(files_dir, ignore_errors=True)


async def agent_registered(api, agent_id: str) -> dict:
    a = await agent_status(api, agent_id)
    if a is None or a["status"] != "ALIVE" or a["scaling_group"] != "default":
        raise RuntimeError(f"the manager lists {a}")
    return {"addr": a["addr"]}


def cmd_scenario(args: argparse.Namespace) -> None:
    state = load_state(Path(args.work))
    asyncio.run(scenario(state, args))


# ---------------------------------------------------------------------------------------------
# Backend.AI's own integration suite (backend.ai-test 26.9.6)

# Its single-node, single-container session specs that need neither a storage proxy (vfolders,
# imagify/commit to a registry) nor a webserver (login sessions): run one at a time.
SUITE_SPECS = [
    "single_node_single_container_creation_batch_session_success",
    "single_node_single_container_creation_interactive_session_success",
    "single_node_single_container_creation_interactive_session_success_with_bootstrap_script",
    "single_node_single_container_execution_command_on_interactive_session_success",
    "single_node_single_container_execution_command_on_interactive_session_failure_wrong_command",
    "single_node_single_container_execution_command_on_interactive_session_failure_with_custom_exitcode",
    "single_node_single_container_session_container_log_retriever",
    "single_node_single_container_session_dependency_graph_retriever",
    "single_node_single_container_session_status_history",
    "single_node_single_container_session_rename_success",
    "single_node_single_container_session_rename_fail_duplicated_name",
]


def tester_toml(state: dict, image: str) -> str:
    name = image
    return textwrap.dedent(f"""\
        [runner]
        concurrency = 1

        [context.endpoint]
        api-endpoint = "http://127.0.0.1:{state['ports']['manager']}"
        login-endpoint = "http://127.0.0.1:{state['ports']['manager']}"

        [context.keypair]
        access-key = "{ADMIN_AK}"
        secret-key = "{ADMIN_SK}"

        [context.user-resource-policy]
        name = "default"

        [context.login-credential]
        user-id = "{ADMIN_EMAIL}"
        password = "{ADMIN_PASSWORD}"

        [context.domain]
        name = "default"

        [context.scaling-group]
        name = "default"

        [context.group]
        name = "default"

        [context.image]
        name = "{name}"
        architecture = "x86_64"

        [context.session]
        resources = {{ cpu = 1, mem = "512m" }}

        [context.batch-session]
        startup-command = "ls -la"

        [context.sse]
        timeout = {SESSION_LIMIT}
        """)


def shim_suite() -> None:
    """The two shims backend.ai-test 26.9.6 needs against this manager, on either agent
    (docs/backend-ai.md): its templates open a session's event stream before the session exists,
    which the manager answers 404 (the shim opens it again until the session exists), and they
    expect the termination reason `user-requested` where 26.9.6 reports `triggered-by-scheduler`
    for a destroy the user asked for (the shim takes either). The stream also carries other
    sessions' events, which the shim skips."""
    import importlib

    from ai.backend.client.exceptions import BackendAPIError
    from ai.backend.common.json import load_json

    async def verify_session_events(client_session, session_name, expected_event, failure_events,
                                    *, expected_termination_reason=None,
                                    expected_failure_reason=None) -> None:
        while True:
            try:
                async with client_session.ComputeSession(session_name).listen_events() as evs:
                    async for ev in evs:
                        data = load_json(ev.data) if ev.data else {}
                        if data.get("sessionName") not in (None, "", session_name):
                            continue
                        if ev.event == "session_terminated" and expected_termination_reason:
                            want = {expected_termination_reason}
                            if expected_termination_reason == "user-requested":
                                want.add("triggered-by-scheduler")
                            assert data["reason"] in want, (
                                f"Unexpected termination reason: {data['reason']}")
                        if ev.event == "session_failure" and expected_failure_reason is not None:
                            assert data["reason"] == expected_failure_reason, (
                                f"Unexpected failure reason: {data['reason']}")
                        if ev.event == expected_event:
                            return
                        if ev.event in failure_events:
                            raise RuntimeError(f"Session failed with event: {ev.event}, "
                                               f"Expected event: {expected_event}")
                return
            except BackendAPIError as e:
                if e.status != 404:
                    raise
                await asyncio.sleep(0.1)

    for mod in ("ai.backend.test.templates.session.utils",
                "ai.backend.test.templates.session.interactive_session",
                "ai.backend.test.templates.session.batch_session",
                "ai.backend.test.templates.session.session_template",
                "ai.backend.test.templates.session.dependent_session",
                "ai.backend.test.testcases.session.creation_failure_wrong_command",
                "ai.backend.test.testcases.session.creation_failure_command_timeout"):
        m = importlib.import_module(mod)
        if hasattr(m, "verify_session_events"):
            m.verify_session_events = verify_session_events


async def run_suite(state: dict, args: argparse.Namespace) -> None:
    from ai.backend.test.testcases.spec_manager import TestSpecManager
    from ai.backend.test.testcases.testspecs import ROOT_TEST_SPECS
    from ai.backend.test.tester.exporter import TestExporter
    from ai.backend.test.tester.tester import Tester

    shim_suite()
    errors: list[str] = []

    class Recorder(TestExporter):
        @classmethod
        async def create(cls, sub_name):
            return cls()

        async def export_start(self) -> None:
            pass

        async def export_done(self) -> None:
            pass

        async def export_stage_done(self, stage: str) -> None:
            pass

        async def export_stage_exception(self, stage: str, exception: BaseException) -> None:
            errors.append(f"{stage}: {type(exception).__name__}: {exception}")

        async def export_exception(self, exception: BaseException) -> None:
            errors.append(f"{type(exception).__name__}: {exception}")

    config = Path(state["work"]) / f"tester-{args.label}.toml"
    config.write_text(tester_toml(state, args.image))
    st = Steps(args.label)
    for name in SUITE_SPECS:
        async def one(name=name) -> dict:
            errors.clear()
            tester = Tester(spec_manager=TestSpecManager(specs=ROOT_TEST_SPECS),
                            exporter_type=Recorder, config_file_path=config)
            await tester.run_by_name(name)
            if errors:
                raise RuntimeError("; ".join(errors)[:1200])
            return {}

        await st.step("suite:" + name.removeprefix("single_node_single_container_"), one,
                      needs=())


def cmd_suite(args: argparse.Namespace) -> None:
    state = load_state(Path(args.work))
    asyncio.run(run_suite(state, args))


def cmd_bench(args: argparse.Namespace) -> None:
    import bench

    state = load_state(Path(args.work))
    asyncio.run(bench.bench(state, args))


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up")
    up.add_argument("--work", default=os.environ.get("KV_HS_WORK"))
    up.add_argument("--ports", default="37000-37099")
    up.add_argument("--reserve", default="37000-37299",
                    help="ports kept out of the ephemeral range (the agents' ranges too)")
    down = sub.add_parser("down")
    down.add_argument("--work", default=os.environ.get("KV_HS_WORK"))
    down.add_argument("--agent-id", action="append",
                      help="also remove this agent's containers (repeatable)")
    wa = sub.add_parser("wait-agent")
    wa.add_argument("--work", default=os.environ.get("KV_HS_WORK"))
    wa.add_argument("--agent-id", required=True)
    wa.add_argument("--status", default="ALIVE")
    wa.add_argument("--limit", type=float, default=90.0)
    sc = sub.add_parser("scenario")
    sc.add_argument("--work", default=os.environ.get("KV_HS_WORK"))
    sc.add_argument("--agent-id", required=True)
    sc.add_argument("--label", required=True)
    sc.add_argument("--image", required=True)
    sc.add_argument("--only", help="run only these steps (comma-separated; for diagnosis)")
    au = sub.add_parser("agent-up")
    au.add_argument("--work", default=os.environ.get("KV_HS_WORK"))
    au.add_argument("--agent-id", required=True)
    au.add_argument("--ports", default="37200-37299")
    au.add_argument("--kernel-uid", type=int, default=-1,
                    help="the kernels' uid and gid (-1: the agent's, root)")
    au.add_argument("--cpu-overcommit", type=int, default=1,
                    help="upstream's BACKEND_CPU_OVERCOMMIT_FACTOR (1-10)")
    ad = sub.add_parser("agent-down")
    ad.add_argument("--work", default=os.environ.get("KV_HS_WORK"))
    bn = sub.add_parser("bench", help="one agent's figures (tests/bai_halfstack/bench.py)")
    bn.add_argument("--work", default=os.environ.get("KV_HS_WORK"))
    bn.add_argument("--agent-id", required=True)
    bn.add_argument("--agent-pid", type=int, default=None,
                    help="the agent's pid (default: upstream's agent started by agent-up)")
    bn.add_argument("--label", required=True)
    bn.add_argument("--image", required=True)
    bn.add_argument("--sessions", type=int, default=20)
    bn.add_argument("--queries", type=int, default=200)
    bn.add_argument("--rest-queries", type=int, default=30)
    bn.add_argument("--batches", type=int, default=3)
    bn.add_argument("--file-mib", type=int, default=256)
    bn.add_argument("--cpu-secs", type=float, default=60.0)
    rs = sub.add_parser("rescan")
    rs.add_argument("--work", default=os.environ.get("KV_HS_WORK"))
    su = sub.add_parser("suite")
    su.add_argument("--work", default=os.environ.get("KV_HS_WORK"))
    su.add_argument("--label", required=True)
    su.add_argument("--image", required=True)
    args = ap.parse_args()
    {"suite": cmd_suite, "rescan": cmd_rescan, "agent-up": cmd_agent_up, "agent-down": cmd_agent_down, "up": cmd_up,
     "down": cmd_down, "wait-agent": cmd_wait_agent, "scenario": cmd_scenario, "bench": cmd_bench}[args.cmd](args)


if __name__ == "__main__":
    main()
