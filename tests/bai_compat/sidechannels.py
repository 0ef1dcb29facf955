#!/usr/bin/env python3
"""
What the real Backend.AI 26.9.6 manager reads of an agent from Valkey besides the event bus, read
with the manager's own clients, for tests/it/bai_sidechannels.rs. Run it with the Python of the
Backend.AI 26.9.6 root (`chroot $KV_BAI_ROOT /opt/bai/bin/python sidechannels.py ...`; the chroot
shares the host's network, so 127.0.0.1 reaches the test's redis-server). Every line on stdout is
one JSON object.

Modes (exactly one):

  --watch --redis-port P --agent-id A [--kernels K,..] [--containers C,..] [--occupied-mem BYTES]
      Every 0.5 s until killed, one line {"kind": "snapshot", ...} with:
        presence        {kernel: {"presence", "last_presence", "created_at"} | null}
                        ValkeyScheduleClient.get_kernel_presence_batch (db 2; read only)
        installed_images [InstalledImageInfo as dict]   ValkeyImageClient.get_agent_installed_images (db 3)
        agent_stats     ValkeyStatClient.get_agent_statistics_batch([agent])[0] (db 0)
        kernel_stats    {kernel: ValkeyStatClient.get_kernel_statistics(kernel)}
        process_stats   {container: msgpack.unpackb(get_user_kernel_statistics_batch([c])[0])}
        utilization     UtilizationIdleChecker.get_current_utilization(kernels, {"mem": BYTES})
                        (the idle checker's own code over a ValkeyStatClient, for cpu_util and mem)
        commit_status   AgentRegistry.get_commit_status(kernels) (db 0, the manager's method)

  --wait-bgtask ID --redis-port P [--timeout S]
      The manager's wait for an agent's background task: CommitSessionHandler.
      _wait_for_agent_bgtask (ai/backend/manager/bgtask/tasks/commit_session.py) over a real
      EventHub fed by a real EventDispatcher subscribed to the bgtask events on `events_all`
      (as the manager's dispatch.py `_dispatch_bgtask_events`) and a real EventFetcher over a
      RedisQueue (db 4). Prints {"kind": "ready"} once subscribed, then {"kind": "result",
      "result": "done" | "failed" | "cancelled" | "timeout", "message": ...}.

  --sweep --redis-port P --agent-id A --addr tcp://H:P --manager-keypair F --agent-public-key F
          --kernels K,..
      Runs the manager's stale-kernel sweep, SessionTerminator.check_stale_kernels
      (ai/backend/manager/sokovan/scheduler/terminator/terminator.py), with a real
      ValkeyScheduleClient (db 2) and the manager's real AgentClientPool to the agent, over
      KernelInfo-shaped rows of the given kernels on the agent. Prints {"kind": "sweep",
      "dead": [...], "check_running": [kernel ids the sweep asked the agent about]}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import uuid
from types import SimpleNamespace
from typing import Any

from ai.backend.common import msgpack
from ai.backend.common.clients.valkey_client.valkey_image.client import ValkeyImageClient
from ai.backend.common.clients.valkey_client.valkey_schedule.client import ValkeyScheduleClient
from ai.backend.common.clients.valkey_client.valkey_stat.client import ValkeyStatClient
from ai.backend.common.defs import (
    REDIS_IMAGE_DB,
    REDIS_LIVE_DB,
    REDIS_STATISTICS_DB,
    REDIS_STREAM_DB,
)
from ai.backend.common.types import AgentId, HostPortPair, KernelId, RedisTarget, ValkeyTarget


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj, default=str), flush=True)


def target(args: argparse.Namespace) -> ValkeyTarget:
    return ValkeyTarget(addr=f"127.0.0.1:{args.redis_port}")


def jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return v.decode(errors="replace")
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    return str(v)


def split(s: str | None) -> list[str]:
    return [x for x in (s or "").split(",") if x]


async def watch(args: argparse.Namespace) -> int:
    from ai.backend.manager.idle import UtilizationIdleChecker
    from ai.backend.manager.registry import AgentRegistry

    schedule = await ValkeyScheduleClient.create(
        target(args), db_id=REDIS_LIVE_DB, human_readable_name="test.schedule"
    )
    image = await ValkeyImageClient.create(
        target(args), db_id=REDIS_IMAGE_DB, human_readable_name="test.image"
    )
    stat = await ValkeyStatClient.create(
        target(args), db_id=REDIS_STATISTICS_DB, human_readable_name="test.stat"
    )
    kernels = [KernelId(uuid.UUID(k)) for k in split(args.kernels)]
    containers = split(args.containers)
    # The manager's methods over what they read: `self` holds only the client they use.
    checker = SimpleNamespace(
        _valkey_stat_client=stat, resource_names_to_check={"cpu_util", "mem"}
    )
    registry = SimpleNamespace(valkey_stat=stat)
    while True:
        presence = await schedule.get_kernel_presence_batch(kernels)
        images = await image.get_agent_installed_images(AgentId(args.agent_id))
        agent_stats = (await stat.get_agent_statistics_batch([args.agent_id]))[0]
        kernel_stats = {str(k): await stat.get_kernel_statistics(str(k)) for k in kernels}
        raw = await stat.get_user_kernel_statistics_batch(containers)
        process_stats = {
            c: (msgpack.unpackb(r) if r is not None else None)
            for c, r in zip(containers, raw, strict=True)
        }
        utilization = (
            await UtilizationIdleChecker.get_current_utilization(
                checker, kernels, {"mem": args.occupied_mem}
            )
            if kernels
            else None
        )
        commit = await AgentRegistry.get_commit_status(registry, kernels) if kernels else {}
        emit({
            "kind": "snapshot",
            "presence": {
                str(k): (
                    None
                    if s is None
                    else {
                        "presence": None if s.presence is None else str(s.presence),
                        "last_presence": s.last_presence,
                        "created_at": s.created_at,
                    }
                )
                for k, s in presence.items()
            },
            "installed_images": [i.model_dump() for i in images],
            "agent_stats": jsonable(agent_stats),
            "kernel_stats": jsonable(kernel_stats),
            "process_stats": jsonable(process_stats),
            "utilization": jsonable(utilization),
            "commit_status": {str(k): v for k, v in commit.items()},
        })
        await asyncio.sleep(0.5)


class Observer:
    def observe_event_success(self, *, event_type: str, duration: float) -> None:
        pass

    def observe_event_failure(self, *, event_type: str, duration: float, exception: BaseException) -> None:
        emit({"kind": "error", "name": event_type, "error": repr(exception)})


async def wait_bgtask(args: argparse.Namespace) -> int:
    from ai.backend.common.exception import BgtaskCancelledError, BgtaskFailedError
    from ai.backend.common.events.dispatcher import EventDispatcher
    from ai.backend.common.events.event_types.bgtask.broadcast import (
        BgtaskCancelledEvent,
        BgtaskDoneEvent,
        BgtaskFailedEvent,
        BgtaskPartialSuccessEvent,
        BgtaskUpdatedEvent,
    )
    from ai.backend.common.events.fetcher import EventFetcher
    from ai.backend.common.events.hub.hub import EventHub
    from ai.backend.common.message_queue.redis_queue import RedisMQArgs, RedisQueue
    from ai.backend.manager.bgtask.tasks.commit_session import CommitSessionHandler
    from ai.backend.manager.event_dispatcher.handlers.propagator import PropagatorEventHandler

    mq = await RedisQueue.create(
        RedisTarget(addr=HostPortPair("127.0.0.1", args.redis_port)),
        RedisMQArgs(
            anycast_stream_key="events",
            broadcast_channel="events_all",
            consume_stream_keys=None,
            subscribe_channels={"events_all"},
            group_name="manager",
            node_id=f"kv-test-{uuid.uuid4()}",
            db=REDIS_STREAM_DB,
        ),
    )
    hub = EventHub()
    propagate = PropagatorEventHandler(hub).propagate_event
    dispatcher = EventDispatcher(mq, event_observer=Observer())  # type: ignore[arg-type]
    for cls in (
        BgtaskUpdatedEvent,
        BgtaskDoneEvent,
        BgtaskPartialSuccessEvent,
        BgtaskCancelledEvent,
        BgtaskFailedEvent,
    ):
        dispatcher.subscribe(cls, None, propagate)
    await dispatcher.start()
    import redis

    r = redis.Redis(host="127.0.0.1", port=args.redis_port, db=REDIS_STREAM_DB)
    try:
        for _ in range(200):
            if dict(r.pubsub_numsub("events_all")).get(b"events_all", 0) > 0:
                break
            await asyncio.sleep(0.05)
    finally:
        r.close()
    emit({"kind": "ready"})
    handler = CommitSessionHandler(
        None,  # type: ignore[arg-type]  # session repository: unused by the wait
        None,  # type: ignore[arg-type]  # image repository: unused by the wait
        None,  # type: ignore[arg-type]  # agent registry: unused by the wait
        hub,
        EventFetcher(mq),
    )
    result: dict[str, Any] = {"kind": "result"}
    try:
        async with asyncio.timeout(args.timeout):
            await handler._wait_for_agent_bgtask(uuid.UUID(args.wait_bgtask), "Commit")
        result["result"] = "done"
    except BgtaskFailedError as e:
        result.update(result="failed", message=str(e))
    except BgtaskCancelledError as e:
        result.update(result="cancelled", message=str(e))
    except TimeoutError:
        result["result"] = "timeout"
    emit(result)
    await dispatcher.close()
    await mq.close()
    return 0


async def sweep(args: argparse.Namespace) -> int:
    import zmq.auth

    from ai.backend.manager.agent_cache import AgentRPCCache
    from ai.backend.manager.clients.agent import AgentClientPool, AgentPoolSpec
    from ai.backend.manager.sokovan.scheduler.terminator.terminator import (
        SessionTerminator,
        SessionTerminatorArgs,
    )

    manager_pub, manager_sec = zmq.auth.load_certificate(args.manager_keypair)
    agent_pub, _ = zmq.auth.load_certificate(args.agent_public_key)
    agent_id = AgentId(args.agent_id)
    cache = AgentRPCCache(None, manager_pub, manager_sec)  # type: ignore[arg-type]
    cache.update(agent_id, args.addr, agent_pub)
    real_pool = AgentClientPool(
        cache,
        AgentPoolSpec(health_check_interval=30.0, failure_threshold=1000, recovery_timeout=60.0),
    )
    asked: list[str] = []

    class Counting:
        """The real client, noting each `check_running` the sweep makes."""

        def __init__(self, client: Any) -> None:
            self._client = client

        async def check_running(self, kernel_id: Any) -> Any:
            asked.append(str(kernel_id))
            return await self._client.check_running(kernel_id)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._client, name)

    class Pool:
        @contextlib.asynccontextmanager
        async def acquire(self, aid: AgentId):  # type: ignore[no-untyped-def]
            async with real_pool.acquire(aid) as client:
                yield Counting(client)

    schedule = await ValkeyScheduleClient.create(
        target(args), db_id=REDIS_LIVE_DB, human_readable_name="test.sweep"
    )
    terminator = SessionTerminator(
        SessionTerminatorArgs(
            repository=None,  # type: ignore[arg-type]  # unused by the sweep
            agent_client_pool=Pool(),  # type: ignore[arg-type]
            valkey_schedule=schedule,
        )
    )
    # What the sweep reads of its rows (`KernelInfo.id`, `KernelInfo.resource.agent`).
    rows = [
        SimpleNamespace(id=uuid.UUID(k), resource=SimpleNamespace(agent=args.agent_id))
        for k in split(args.kernels)
    ]
    dead = await terminator.check_stale_kernels(rows)  # type: ignore[arg-type]
    emit({"kind": "sweep", "dead": [str(k) for k in dead], "check_running": asked})
    await real_pool.close()
    await schedule.close()
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--watch", action="store_true")
    mode.add_argument("--wait-bgtask", metavar="ID")
    mode.add_argument("--sweep", action="store_true")
    p.add_argument("--redis-port", type=int, required=True)
    p.add_argument("--agent-id", default="")
    p.add_argument("--kernels", default="")
    p.add_argument("--containers", default="")
    p.add_argument("--occupied-mem", type=int, default=0)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--addr", default="")
    p.add_argument("--manager-keypair", default="")
    p.add_argument("--agent-public-key", default="")
    args = p.parse_args()
    if args.watch:
        return asyncio.run(watch(args))
    if args.wait_bgtask:
        return asyncio.run(wait_bgtask(args))
    return asyncio.run(sweep(args))


if __name__ == "__main__":
    sys.exit(main())
