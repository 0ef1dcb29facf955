"""`halfstack.py bench`: one agent's figures on a running halfstack, for `just bench backend-ai`.

Run in the trixie root's venv (like every subcommand of halfstack.py), against the agent
`--agent-id` the manager lists ALIVE, whose process (and its children) is `--agent-pid` in the
host's pid namespace. Everything goes through the real 26.9.6 manager and client, or the
manager's own agent client, as a Backend.AI deployment would drive the agent:

- `rss_idle_mib`: the agent's resident memory (its process tree, `/proc/<pid>/status` VmRSS
  summed by psutil) before any session.
- `create`: `--sessions` interactive sessions on `--image`, one after the other. Per session
  `total` (the client's `get_or_create` until RUNNING, through the manager's scheduler) and
  `agent` (the agent's part: its first event of the kernel, `kernel_preparing`, to its
  `kernel_started`, both as received on the bus's broadcast channel `events_all`, where
  upstream's agent and kernelvisor's both put them as soon as they happen), split by the
  engine's own times of the container (`docker inspect`'s `Created`, `State.StartedAt`) into
  `prepare` (`kernel_preparing` → created), `engine` (created → started) and `boot` (started →
  `kernel_started`: the runner's boot and the agent's readiness check).
- `query_rpc`: `--queries` executes of `pass` (query mode, continued until `finished`) on the
  first session through the manager's own `AgentClientPool` → `AgentClient` (callosum, CURVE),
  round trip each; `ping_rpc`: the same client's `ping` (the agent answers it itself: the
  client's, callosum's and CURVE's share of a query); `query_rest`: the same through the manager's REST API (`session.execute`).
- `files`: a `--file-mib` MiB file through the manager's agent client as its registry relays
  one (`upload_file`, `download_single`; the REST API takes files under 1 MiB only), and the
  same bytes `docker cp`'d into and out of the same container, in MiB/s each way.
- `batch`: a batch session of `true`, from the create call to the manager's `session_success`
  on the session's event stream, `--batches` times.
- `rss_loaded_mib` and `cpu_pct`: with all `--sessions` kernels running, the agent's resident
  memory, and its CPU time (user + system of its tree) over `--cpu-secs` seconds as a percent
  of one core: what heartbeats and stats cost it.

Every session made is destroyed at the end. Prints one JSON line with the figures.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

from halfstack import (SESSION_LIMIT, agent_status, async_session, log, wait_session_gone)


# Each session's slots: the image's minimum (one core, its memory and shared memory). Twenty
# of them fit a 2-core node only with 20 CPU slots: upstream's agent gets them by its own
# BACKEND_CPU_OVERCOMMIT_FACTOR=10 (its CPU plugin allocates whole cores), kernelvisor's by
# `[resource] cpu = 20` (`halfstack.py agent-up --cpu-overcommit`, benches/backend_ai.rs).
BENCH_SLOTS = {"cpu": 1, "mem": "512m"}


def tree(pid: int) -> list[psutil.Process]:
    p = psutil.Process(pid)
    return [p, *p.children(recursive=True)]


def rss_mib(pid: int) -> float:
    total = 0
    for p in tree(pid):
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return round(total / 2**20, 1)


def cpu_secs(pid: int) -> float:
    total = 0.0
    for p in tree(pid):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


class BusWatch:
    """Every kernel event on the broadcast channel `events_all`, with the monotonic time it
    arrived: `seen[(name, kernel_id)]`."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.seen: dict[tuple[str, str], float] = {}
        # The same arrivals in Unix seconds, to set against the engine's container times.
        self.wall: dict[tuple[str, str], float] = {}
        self.task: asyncio.Task | None = None
        self.ready = asyncio.Event()

    async def run(self) -> None:
        import redis.asyncio as redis

        r = redis.Redis(host="127.0.0.1", port=self.port, db=4)
        ps = r.pubsub()
        await ps.subscribe("events_all")
        self.ready.set()
        async for msg in ps.listen():
            if msg.get("type") != "message":
                continue
            now, wall = time.monotonic(), time.time()
            try:
                outer = json.loads(msg["data"])
                body = json.loads(outer["payload"]) if isinstance(outer.get("payload"), str) else {}
            except Exception:
                continue
            kid = body.get("kernel_id")
            if kid:
                self.seen.setdefault((outer.get("name", ""), str(kid)), now)
                self.wall.setdefault((outer.get("name", ""), str(kid)), wall)

    async def start(self) -> None:
        self.task = asyncio.create_task(self.run())
        await asyncio.wait_for(self.ready.wait(), 10)

    async def wait_for(self, name: str, kernel_id: str, limit: float = 30.0) -> float:
        start = time.monotonic()
        while (name, kernel_id) not in self.seen:
            if time.monotonic() - start > limit:
                raise RuntimeError(f"no {name} of {kernel_id} on events_all in {limit:.0f} s")
            await asyncio.sleep(0.02)
        return self.seen[(name, kernel_id)]


def kernel_of(container_id: str) -> str:
    """The kernel id of a session's container, from its label (both agents set it)."""
    return subprocess.run(
        ["docker", "inspect", "-f", '{{index .Config.Labels "ai.backend.kernel-id"}}', container_id],
        capture_output=True, text=True, check=True).stdout.strip()


def unix_time(rfc3339: str) -> float:
    """Unix seconds of the engine's RFC 3339 time with nanoseconds (`…T06:10:00.123456789Z`)."""
    head, _, frac = rfc3339.rstrip("Z").partition(".")
    return datetime.datetime.fromisoformat(head).replace(
        tzinfo=datetime.timezone.utc).timestamp() + float(f"0.{frac or 0}")


def phases(watch: "BusWatch", kid: str, container_id: str) -> dict[str, float]:
    """Where an agent's part of a create goes, from the bus's arrivals and the engine's own
    times of the container: `prepare` (`kernel_preparing` → the container created: the agent's
    work before it, image check, ports, scratch, the runner's files), `engine` (created →
    started) and `boot` (started → `kernel_started`: the runner's boot inside the container and
    the agent's readiness check), in seconds."""
    created, started = subprocess.run(
        ["docker", "inspect", "-f", "{{.Created}} {{.State.StartedAt}}", container_id],
        capture_output=True, text=True, check=True).stdout.split()
    c, s = unix_time(created), unix_time(started)
    return {"prepare": c - watch.wall[("kernel_preparing", kid)], "engine": s - c,
            "boot": watch.wall[("kernel_started", kid)] - s}


def docker_cp(args: list[str]) -> float:
    """Seconds `docker cp` takes (the root's Docker CLI, on the host's engine)."""
    t = time.monotonic()
    subprocess.run(["docker", *args], check=True, capture_output=True)
    return time.monotonic() - t


async def bench(state: dict, args: Any) -> None:
    pid = args.agent_pid or int(state["pids"]["upstream-agent"])
    image = args.image
    figures: dict[str, Any] = {"agent": args.label}
    figures["rss_idle_mib"] = rss_mib(pid)
    watch = BusWatch(int(state["ports"]["valkey"]))
    await watch.start()
    sessions: list[Any] = []
    infos: list[dict] = []
    async with async_session(state) as api:
        try:
            # -- create → RUNNING ---------------------------------------------------------------
            totals: list[float] = []
            agent_parts: list[float] = []
            split: list[dict[str, float]] = []
            for i in range(args.sessions):
                t = time.monotonic()
                sess = await api.ComputeSession.get_or_create(
                    image, type_="interactive", resources=BENCH_SLOTS,
                    name=f"bench-{args.label}-{i}-{uuid.uuid4().hex[:6]}", max_wait=int(SESSION_LIMIT))
                total = time.monotonic() - t
                sessions.append(sess)
                info = await sess.get_info()
                if info.get("status") != "RUNNING":
                    raise RuntimeError(f"session {i}: {info.get('status')} {info.get('statusInfo')}")
                kid = kernel_of(info["containerId"])
                started = await watch.wait_for("kernel_started", kid)
                preparing = await watch.wait_for("kernel_preparing", kid)
                infos.append({"session": str(sess.id), "kernel": kid, "container": info["containerId"]})
                split.append(phases(watch, kid, info["containerId"]))
                totals.append(total)
                agent_parts.append(started - preparing)
                log(f"{args.label}: session {i} RUNNING in {total:.2f} s (agent {started - preparing:.2f} s)")
            figures["create_total_s"] = totals
            figures["create_agent_s"] = agent_parts
            for phase in ("prepare", "engine", "boot"):
                figures[f"create_{phase}_s"] = [p[phase] for p in split]

            # -- queries --------------------------------------------------------------------------
            first = infos[0]
            addr = (await agent_status(api, args.agent_id))["addr"]
            pool = agent_pool(state, args.agent_id, addr)
            figures["query_rpc_ms"] = await rpc_queries(pool, args.agent_id, first, args.queries)
            figures["ping_rpc_ms"] = await rpc_pings(pool, args.agent_id, args.queries)
            rest: list[float] = []
            for _ in range(args.rest_queries):
                t = time.monotonic()
                r = await sessions[0].execute(None, "pass", mode="query")
                rest.append((time.monotonic() - t) * 1000)
                if r.get("status") != "finished":
                    raise RuntimeError(f"REST execute: {r}")
            figures["query_rest_ms"] = rest

            # -- files ----------------------------------------------------------------------------
            figures["files"] = await files(pool, args.agent_id, first, args.file_mib, pid)

            # -- batch sessions -------------------------------------------------------------------
            batch: list[float] = []
            for _ in range(args.batches):
                batch.append(await batch_true(api, image))
            figures["batch_s"] = batch

            # -- the agent at `--sessions` kernels ------------------------------------------------
            figures["rss_loaded_mib"] = rss_mib(pid)
            log(f"{args.label}: agent CPU with {len(sessions)} kernels, over {args.cpu_secs} s")
            c0, t0 = cpu_secs(pid), time.monotonic()
            await asyncio.sleep(args.cpu_secs)
            c1, t1 = cpu_secs(pid), time.monotonic()
            figures["cpu_pct"] = round((c1 - c0) / (t1 - t0) * 100, 2)
            figures["kernels"] = len(sessions)
        finally:
            for sess in sessions:
                try:
                    await sess.destroy()
                except Exception as e:
                    log(f"destroy {sess.id}: {e}")
            for sess in sessions:
                try:
                    await wait_session_gone(api, sess)
                except Exception as e:
                    log(f"wait for {sess.id} to end: {e}")
            if watch.task is not None:
                watch.task.cancel()
    print(json.dumps(figures), flush=True)


def agent_pool(state: dict, agent_id: str, addr: str):
    """The manager's own agent client pool (`AgentRPCCache` → `AgentClientPool`), CURVE with
    the halfstack's keys, as the manager builds it."""
    import zmq.auth

    from ai.backend.common.types import AgentId
    from ai.backend.manager.agent_cache import AgentRPCCache
    from ai.backend.manager.clients.agent import AgentClientPool, AgentPoolSpec

    keys = state["keys"]
    manager_pub, manager_sec = zmq.auth.load_certificate(keys["manager.key_secret"])
    agent_pub, _ = zmq.auth.load_certificate(keys["agent.key"])
    cache = AgentRPCCache(None, manager_pub, manager_sec)  # type: ignore[arg-type]
    cache.update(AgentId(agent_id), addr, agent_pub)
    return AgentClientPool(cache, AgentPoolSpec(health_check_interval=30.0, failure_threshold=1000,
                                                recovery_timeout=60.0))


async def rpc_queries(pool: Any, agent_id: str, first: dict, n: int) -> list[float]:
    """`pass` in query mode through the manager's own agent client, continued to `finished`,
    `n` times after ten that warm the connection up; milliseconds each."""
    from ai.backend.common.types import AgentId, KernelId, SessionId

    sid, kid = SessionId(uuid.UUID(first["session"])), KernelId(uuid.UUID(first["kernel"]))
    out: list[float] = []
    async with pool.acquire(AgentId(agent_id)) as client:
        for i in range(n + 10):
            run_id = uuid.uuid4().hex
            t = time.monotonic()
            r = await client.execute(sid, kid, 9, run_id, "query", "pass", {}, 2.0)
            while r.get("status") != "finished":
                if r.get("status") not in ("continued", "build-finished", "clean-finished"):
                    raise RuntimeError(f"execute: {dict(r)}")
                r = await client.execute(sid, kid, 9, run_id, "continue", "", {}, 2.0)
            if i >= 10:
                out.append((time.monotonic() - t) * 1000)
    return out


async def rpc_pings(pool: Any, agent_id: str, n: int) -> list[float]:
    """The floor under a query's round trip: `ping` (answered by the agent itself, no kernel)
    through the same client, `n` times after ten warm-ups; milliseconds each."""
    from ai.backend.common.types import AgentId

    out: list[float] = []
    async with pool.acquire(AgentId(agent_id)) as client:
        for i in range(n + 10):
            t = time.monotonic()
            await client.ping()
            if i >= 10:
                out.append((time.monotonic() - t) * 1000)
    return out


async def files(pool: Any, agent_id: str, first: dict, mib: int, pid: int) -> dict[str, Any]:
    """A `mib` MiB file through the manager's agent client, as the manager's registry relays
    it (`upload_file(kernel_id, name, bytes)`, `download_single(kernel_id, path)`), against
    `docker cp` of the same bytes into and out of the same container. A refusal is recorded
    as the agent's error (upstream's agent refuses downloads over 1 MiB, docker/kernel.py).
    Where an upload's time goes: the CPU seconds the agent's process tree
    (`upload_agent_cpu_s`) and this client's process (`upload_client_cpu_s`: callosum's
    msgpack, pyzmq and libzmq's CURVE, all of its threads) spent on it, against its wall
    time (`upload_s`)."""
    from ai.backend.common.types import AgentId, KernelId

    kid = KernelId(uuid.UUID(first["kernel"]))
    data = bytes(range(256)) * 4096 * mib
    out: dict[str, Any] = {"mib": mib}
    async with pool.acquire(AgentId(agent_id)) as client:
        a0, c0, t = cpu_secs(pid), time.process_time(), time.monotonic()
        await client.upload_file(kid, "blob.bin", data)
        wall = time.monotonic() - t
        out["upload_mib_s"] = round(mib / wall, 1)
        out["upload_s"] = round(wall, 3)
        out["upload_agent_cpu_s"] = round(cpu_secs(pid) - a0, 3)
        out["upload_client_cpu_s"] = round(time.process_time() - c0, 3)
        t = time.monotonic()
        try:
            got = await client.download_single(kid, "blob.bin")
            secs = time.monotonic() - t
            if len(got) != len(data):
                raise RuntimeError(f"downloaded {len(got)} bytes of {len(data)}")
            out["download_mib_s"] = round(mib / secs, 1)
        except Exception as e:
            out["download_mib_s"] = None
            out["download_error"] = f"{type(e).__name__}: {e}"[:300]
    del data
    d = Path(tempfile.mkdtemp(prefix="bench-files-"))
    src = d / "blob.bin"
    with open(src, "wb") as f:
        chunk = bytes(range(256)) * 4096
        for _ in range(mib):
            f.write(chunk)
    container = first["container"]
    out["docker_cp_in_mib_s"] = round(mib / docker_cp(["cp", str(src), f"{container}:/tmp/blob-cp.bin"]), 1)
    out["docker_cp_out_mib_s"] = round(
        mib / docker_cp(["cp", f"{container}:/tmp/blob-cp.bin", str(d / "back.bin")]), 1)
    subprocess.run(["rm", "-rf", str(d)], check=False)
    return out


async def batch_true(api: Any, image: str) -> float:
    """Seconds from a batch session's create call to the manager's `session_success`."""
    t = time.monotonic()
    sess = await api.ComputeSession.get_or_create(
        image, type_="batch", startup_command="true", enqueue_only=True,
        resources=BENCH_SLOTS, name=f"bench-batch-{uuid.uuid4().hex[:8]}")
    sid = str(sess.id)

    async def listen() -> float:
        async with sess.listen_events() as events:
            async for ev in events:
                data = json.loads(ev.data) if ev.data else {}
                if data.get("sessionId") != sid:
                    continue
                if ev.event == "session_success":
                    return time.monotonic() - t
                if ev.event in ("session_failure", "session_cancelled", "session_terminated"):
                    raise RuntimeError(f"the batch session of `true` ended with {ev.event}: {data}")
        raise RuntimeError("the event stream ended")

    return await asyncio.wait_for(listen(), SESSION_LIMIT)
