#!/usr/bin/env python3
"""
The real Backend.AI 26.9.6 event consumer for tests/it/bai_events.rs: publish and consume Backend.AI
26.x agent events on a real Redis/Valkey, with the real Backend.AI 26.9.6 classes
(backend.ai-common / backend.ai-manager). tests/it/bai_events.rs runs `--consume` against the
redis-server it started and asserts on what kernelvisor's agent published there.

Run it with the Python of the Backend.AI 26.9.6 environment, e.g.

    chroot /var/cache/kernelvisor/bai-trixie /opt/bai/bin/python /path/in/root/consumer.py ...

(the chroot shares the host's network namespace, so 127.0.0.1 reaches a host redis-server).

Modes (exactly one):

  --show
      No Redis needed. For every example event prints (JSON lines on stdout) what the 26.x agent
      would put on the wire: event name, delivery, the event's Python repr, the XADD field map of
      the anycast entry (stream `events`, db 4) and, for events the agent also broadcasts, the
      PUBLISH message on channel `events_all`; bytes are given as text and as hex.

  --publish --redis-port P [--redis-host H] [--redis-password PW] [--agent-id ID]
      Publishes one example of each event the 26.x agent sends, the way the agent sends it:
      through the real `EventProducer` over a real `RedisQueue` built with the agent's
      `RedisMQArgs` (`AbstractAgent._make_message_queue` in ai/backend/agent/agent.py):
      anycast_event() for anycast-only events, anycast_and_broadcast_event() for the kernel and
      session events. Prints one JSON line per event sent.

  --consume --redis-port P --timeout S [--redis-host H] [--redis-password PW]
            [--group manager] [--group-start 0|$] [--max-events N] [--node-id ID]
      Runs the real 26.x manager-side consumer: a `RedisQueue` built with the manager's
      `RedisMQArgs` (ai/backend/manager/dependencies/messaging/message_queue.py: stream `events`,
      group `manager`, channel `events_all`, db 4) driven by the real `EventDispatcher`, with a
      consumer registered (dispatcher.consume) for every concrete anycast event class and a
      subscriber (dispatcher.subscribe) for every concrete broadcast event class in
      ai.backend.common.events.event_types. The dispatcher deserialises each message with the
      event class's `from_message()` and XACKs the anycast entry after the handler ran.
      Prints on stdout, one JSON object per line:
        {"kind": "ready", ...}                       once the group exists and the channel is
                                                     subscribed (publish only after this line)
        {"kind": "event", "delivery": "anycast"|"broadcast", "name": ..., "class": ...,
         "source": <agent id>, "msg_id": <stream entry id or null>, "retry_count": int|null,
         "metadata": {...}|null, "fields": <event.model_dump(mode="json")>}
        {"kind": "error", "stage": "decode"|"handler"|"envelope", "name": ..., "error": ...}
                                                     a message the consumer could not decode
        {"kind": "unhandled", "delivery": "anycast", "name": ..., "msg_id": ...}
                                                     an anycast name no event class has (acked
                                                     and dropped by the dispatcher, as upstream)
        {"kind": "done", "events": n, "errors": n, "unhandled": n}   at exit
      Exits after S seconds, or as soon as N events were printed with --max-events N.
      Exit status 0, or 3 when any error/unhandled line was printed.
      --group-start 0 (the default) creates the consumer group (XGROUP CREATE events <group> 0
      MKSTREAM) before the upstream code tries to, so entries XADDed before the consumer started
      are read too; --group-start '$' leaves the group creation to the upstream code, which uses
      '$' exactly as the manager does (only entries added after the group exists are delivered).
      Broadcast (PUBLISH) messages sent before the "ready" line are lost, as with any pub/sub.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import json
import logging
import pkgutil
import sys
import uuid
from contextvars import ContextVar
from decimal import Decimal
from typing import Any

from ai.backend.common.data.agent.types import AgentInfo
from ai.backend.common.defs import REDIS_STREAM_DB
from ai.backend.common.docker import ImageRef
from ai.backend.common.events.dispatcher import EventDispatcher, EventProducer
from ai.backend.common.events.event_types.agent.anycast import (
    AgentErrorEvent,
    AgentHeartbeatEvent,
    AgentStartedEvent,
    AgentTerminatedEvent,
)
from ai.backend.common.events.event_types.image.anycast import (
    ImagePullFailedEvent,
    ImagePullFinishedEvent,
    ImagePullStartedEvent,
)
from ai.backend.common.events.event_types.kernel.anycast import (
    DoSyncKernelLogsEvent,
    KernelCreatingAnycastEvent,
    KernelPreparingAnycastEvent,
    KernelPullingAnycastEvent,
    KernelStartedAnycastEvent,
    KernelTerminatedAnycastEvent,
)
from ai.backend.common.events.event_types.kernel.broadcast import (
    KernelCreatingBroadcastEvent,
    KernelPreparingBroadcastEvent,
    KernelPullingBroadcastEvent,
    KernelStartedBroadcastEvent,
    KernelTerminatedBroadcastEvent,
)
from ai.backend.common.events.event_types.kernel.types import (
    KernelCreationInfo,
    KernelLifecycleEventReason,
    ServicePortInfo,
    UsedDevices,
)
from ai.backend.common.events.event_types.session.anycast import (
    ExecutionFinishedAnycastEvent,
    ExecutionStartedAnycastEvent,
    SessionFailureAnycastEvent,
    SessionSuccessAnycastEvent,
)
from ai.backend.common.events.event_types.session.broadcast import (
    SessionFailureBroadcastEvent,
    SessionSuccessBroadcastEvent,
)
from ai.backend.common.events.exceptions import EventPayloadDecodingError
from ai.backend.common.events.types import AbstractAnycastEvent, AbstractBroadcastEvent
from ai.backend.common.message_queue.message import MQMessage
from ai.backend.common.message_queue.payload import (
    AnycastMessagePayload,
    BroadcastMessagePayload,
)
from ai.backend.common.message_queue.redis_queue import RedisMQArgs, RedisQueue
from ai.backend.common.message_queue.types import MessageMetadata
from ai.backend.common.types import (
    AgentId,
    ContainerId,
    DeviceId,
    DeviceName,
    HostPortPair,
    KernelId,
    RedisTarget,
    ResourceSlot,
    ResourceSlotEntry,
    SessionId,
    SlotName,
    SlotTypes,
)

# Names the 26.x agent and manager use (see the spec).
STREAM_KEY = "events"  # anycast stream
BROADCAST_CHANNEL = "events_all"  # broadcast pub/sub channel
AGENT_GROUP = "agent"  # agent.py EVENT_DISPATCHER_CONSUMER_GROUP (the agent consumes no stream)
MANAGER_GROUP = "manager"  # manager EVENT_DISPATCHER_CONSUMER_GROUP

# Fixed example identities, so --show is reproducible.
EX_AGENT_ID = "i-probe-agent"
EX_KERNEL_ID = KernelId(uuid.UUID("5b2c6f6e-1d2a-4c4e-9a51-0c8f3d7b9e01"))
EX_SESSION_ID = SessionId(uuid.UUID("a1f0e4d2-3b5c-4e6f-8a7b-9c0d1e2f3a4b"))
EX_CONTAINER_ID = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa99887766554433221100"
EX_TIMESTAMP = 1767225600.25  # datetime.now(UTC).timestamp() as the agent sends it (a float)
EX_PUBLIC_KEY = b"Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID"  # a Z85 CURVE public key (40 chars)


def example_agent_info(agent_id: str = EX_AGENT_ID) -> AgentInfo:
    """AgentInfo as AbstractAgent.heartbeat() builds it for a docker agent with the intrinsic
    cpu/mem plugins only (ai/backend/agent/agent.py, heartbeat())."""
    res_slots = {SlotName("cpu"): Decimal("8"), SlotName("mem"): Decimal("17179869184")}
    return AgentInfo(
        ip="127.0.0.1",  # str(self.rpc_addr.host)
        region=None,  # [agent] region, default None
        scaling_group="default",  # [agent] initial-resource-group-name (None when unset)
        addr="tcp://127.0.0.1:6001",  # f"tcp://{self.rpc_addr}"
        public_key=EX_PUBLIC_KEY,  # None without [agent] rpc-auth-agent-keypair
        public_host="127.0.0.1",  # agent.public-host or container.advertised-host or bind-host
        available_resource_slots=ResourceSlotEntry.from_resource_slot(ResourceSlot(res_slots)),
        slot_key_and_units={"cpu": SlotTypes.COUNT, "mem": SlotTypes.BYTES},
        version="26.9.6",
        compute_plugins={
            DeviceName("cpu"): {
                "version": "26.9.6",
                "agent_version": "26.9.6",
                "machine": "x86_64",
                "os_type": "Linux",
            },
            DeviceName("mem"): {"version": "26.9.6"},
        },
        architecture="x86_64",  # get_arch_name(): platform.machine() with amd64 -> x86_64
        auto_terminate_abusing_kernel=False,  # [agent] force-terminate-abusing-containers
    )


def example_creation_info() -> KernelCreationInfo:
    """KernelCreationInfo as AbstractAgent.create_kernel() builds it for a 1-core / 1 GiB kernel
    on the docker backend (intrinsic cpu and mem devices: model_name "" from
    get_attached_devices(), no proc/mem capacity)."""
    allocations = {
        DeviceName("cpu"): {SlotName("cpu"): {DeviceId("0"): Decimal("1")}},
        DeviceName("mem"): {SlotName("mem"): {DeviceId("root"): Decimal("1073741824")}},
    }
    attached_devices = {
        DeviceName("cpu"): [{"device_id": "0", "model_name": "", "data": {"cores": 1}}],
        DeviceName("mem"): [{"device_id": "root", "model_name": "", "data": {}}],
    }
    public_service_ports = [
        {
            "name": "sshd",
            "protocol": "tcp",
            "container_ports": (2200,),
            "host_ports": (30000,),
            "is_inference": False,
        },
        {
            "name": "ttyd",
            "protocol": "http",
            "container_ports": (7681,),
            "host_ports": (30001,),
            "is_inference": False,
        },
    ]
    return KernelCreationInfo(
        container_id=ContainerId(EX_CONTAINER_ID),
        kernel_host="127.0.0.1",
        repl_in_port=30002,
        repl_out_port=30003,
        service_ports=[ServicePortInfo.model_validate(sp) for sp in public_service_ports],
        used_devices=UsedDevices.from_allocations(allocations, attached_devices),  # type: ignore[arg-type]
    )


def example_image_ref() -> ImageRef:
    # ImageRef.from_image_config(img_conf) of a check_and_pull() image config
    return ImageRef.from_image_str(
        "cr.backend.ai/stable/python:3.9-ubuntu20.04",
        "stable",
        "cr.backend.ai",
        architecture="x86_64",
        is_local=False,
    )


def example_events(agent_id: str = EX_AGENT_ID) -> list[tuple[AbstractAnycastEvent, AbstractBroadcastEvent | None]]:
    """(anycast event, broadcast twin or None) in the order an agent would send them over one
    kernel's life. Each pair is sent as upstream sends it: anycast_event(a) when the twin is
    None, else anycast_and_broadcast_event(a, b)."""
    kid, sid = EX_KERNEL_ID, EX_SESSION_ID
    img = example_image_ref()
    ci = example_creation_info()
    aid = AgentId(agent_id)
    return [
        (AgentStartedEvent(reason="self-started"), None),
        (AgentHeartbeatEvent(agent_info=example_agent_info(agent_id)), None),
        (ImagePullStartedEvent(image=str(img), image_ref=img, agent_id=aid, timestamp=EX_TIMESTAMP), None),
        (ImagePullFinishedEvent(image=str(img), image_ref=img, agent_id=aid, timestamp=EX_TIMESTAMP), None),
        (ImagePullFailedEvent(image=str(img), image_ref=img, agent_id=aid, msg="TimeoutError()"), None),
        (
            KernelPreparingAnycastEvent(kernel_id=kid, session_id=sid),
            KernelPreparingBroadcastEvent(kernel_id=kid, session_id=sid),
        ),
        (
            KernelPullingAnycastEvent(kernel_id=kid, session_id=sid, reason=img.canonical),
            KernelPullingBroadcastEvent(kernel_id=kid, session_id=sid, reason=img.canonical),
        ),
        (
            KernelCreatingAnycastEvent(kernel_id=kid, session_id=sid),
            KernelCreatingBroadcastEvent(kernel_id=kid, session_id=sid),
        ),
        (
            KernelStartedAnycastEvent(kernel_id=kid, session_id=sid, creation_info=ci),
            KernelStartedBroadcastEvent(kernel_id=kid, session_id=sid, creation_info=ci),
        ),
        (ExecutionStartedAnycastEvent(session_id=sid), None),
        (ExecutionFinishedAnycastEvent(session_id=sid), None),
        (
            SessionSuccessAnycastEvent(
                session_id=sid, reason=KernelLifecycleEventReason.TASK_FINISHED, exit_code=0
            ),
            SessionSuccessBroadcastEvent(
                session_id=sid, reason=KernelLifecycleEventReason.TASK_FINISHED, exit_code=0
            ),
        ),
        (
            SessionFailureAnycastEvent(
                session_id=sid, reason=KernelLifecycleEventReason.TASK_FAILED, exit_code=1
            ),
            SessionFailureBroadcastEvent(
                session_id=sid, reason=KernelLifecycleEventReason.TASK_FAILED, exit_code=1
            ),
        ),
        (DoSyncKernelLogsEvent(kernel_id=kid, container_id=EX_CONTAINER_ID), None),
        (
            KernelTerminatedAnycastEvent(
                kernel_id=kid, session_id=sid, reason=KernelLifecycleEventReason.USER_REQUESTED
            ),
            KernelTerminatedBroadcastEvent(
                kernel_id=kid, session_id=sid, reason=KernelLifecycleEventReason.USER_REQUESTED
            ),
        ),
        (
            AgentErrorEvent(
                message="RuntimeError: boom",
                traceback='File "agent.py", line 1, in <module>',
            ),
            None,
        ),
        (AgentTerminatedEvent(reason="shutdown"), None),
    ]


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=False) + "\n")
    sys.stdout.flush()


def _redis_target(args: argparse.Namespace) -> RedisTarget:
    return RedisTarget(
        addr=HostPortPair(args.redis_host, args.redis_port),
        password=args.redis_password,
    )


# --------------------------------------------------------------------------------------------
# --show


def cmd_show(args: argparse.Namespace) -> int:
    # EventProducer.anycast_event(): MessageMetadata.from_current_context() -> to_message() ->
    # AnycastMessagePayload.from_event_body(...) -> ValkeyStreamClient.enqueue_stream_message()
    # which XADDs payload.to_stream_fields(). The broadcast twin goes through
    # BroadcastMessagePayload.to_json() and PUBLISH.
    metadata = MessageMetadata.from_current_context()
    for anycast, broadcast in example_events(args.agent_id):
        msg = anycast.to_message()
        ap = AnycastMessagePayload.from_event_body(
            name=msg.name, source=args.agent_id, payload=msg.payload, metadata=metadata
        )
        fields = ap.to_stream_fields()
        out: dict[str, Any] = {
            "name": msg.name,
            "delivery": "anycast+broadcast" if broadcast is not None else "anycast",
            "anycast_class": f"{type(anycast).__module__}.{type(anycast).__qualname__}",
            "python": repr(anycast),
            "xadd_fields": {k.decode(): v.decode() for k, v in fields.items()},
            "xadd_fields_hex": {k.decode(): v.hex() for k, v in fields.items()},
        }
        if broadcast is not None:
            bmsg = broadcast.to_message()
            bp = BroadcastMessagePayload.from_event_body(
                name=bmsg.name, source=args.agent_id, payload=bmsg.payload, metadata=metadata
            )
            wire = bp.to_json()
            out["broadcast_class"] = f"{type(broadcast).__module__}.{type(broadcast).__qualname__}"
            out["publish_message"] = wire.decode()
            out["publish_message_hex"] = wire.hex()
            out["broadcast_payload_equals_anycast_payload"] = bmsg.payload == msg.payload
        _emit(out)
    return 0


# --------------------------------------------------------------------------------------------
# --publish


async def cmd_publish(args: argparse.Namespace) -> int:
    # AbstractAgent._make_message_queue() (ai/backend/agent/agent.py), verbatim but for the target.
    mq = await RedisQueue.create(
        _redis_target(args),
        RedisMQArgs(
            anycast_stream_key=STREAM_KEY,
            broadcast_channel=BROADCAST_CHANNEL,
            consume_stream_keys=None,
            subscribe_channels={BROADCAST_CHANNEL},
            group_name=AGENT_GROUP,
            node_id=args.agent_id,
            db=REDIS_STREAM_DB,
        ),
    )
    producer = EventProducer(mq, source=AgentId(args.agent_id))
    try:
        for anycast, broadcast in example_events(args.agent_id):
            if broadcast is None:
                await producer.anycast_event(anycast)
            else:
                await producer.anycast_and_broadcast_event(anycast, broadcast)
            _emit({
                "kind": "published",
                "name": anycast.event_name(),
                "delivery": "anycast+broadcast" if broadcast is not None else "anycast",
            })
    finally:
        await producer.close()  # closes the queue
    return 0


# --------------------------------------------------------------------------------------------
# --consume


def _concrete_event_classes() -> tuple[dict[str, type[AbstractAnycastEvent]], dict[str, type[AbstractBroadcastEvent]]]:
    import ai.backend.common.events.event_types as pkg

    for mod in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        try:
            importlib.import_module(mod.name)
        except Exception:  # pragma: no cover - an optional module that does not import
            pass

    def walk(base: type) -> list[type]:
        seen: list[type] = []
        stack = list(base.__subclasses__())
        while stack:
            c = stack.pop()
            if c in seen:
                continue
            seen.append(c)
            stack.extend(c.__subclasses__())
        return seen

    anycast: dict[str, type[AbstractAnycastEvent]] = {}
    for c in walk(AbstractAnycastEvent):
        if inspect.isabstract(c):
            continue
        try:
            name = c.event_name()
        except NotImplementedError:
            continue
        anycast.setdefault(name, c)
    broadcast: dict[str, type[AbstractBroadcastEvent]] = dict(AbstractBroadcastEvent._register_dict)
    broadcast = {n: c for n, c in broadcast.items() if not inspect.isabstract(c)}
    return anycast, broadcast


_current: ContextVar[dict[str, Any]] = ContextVar("probe_current", default={})


class _Counters:
    events = 0
    errors = 0
    unhandled = 0


class ProbeDispatcher(EventDispatcher):
    """The real EventDispatcher; it only notes which entry a handler task is for (a context
    variable the handler task inherits) and reports anycast names that no class handles."""

    async def _dispatch_consumers(self, mq_msg: MQMessage) -> None:  # type: ignore[override]
        p = mq_msg.payload
        if not self._consumers.get(p.name):
            _Counters.unhandled += 1
            _emit({
                "kind": "unhandled",
                "delivery": "anycast",
                "name": p.name,
                "source": p.legacy_source,
                "msg_id": mq_msg.msg_id.decode(),
            })
        _current.set({
            "delivery": "anycast",
            "msg_id": mq_msg.msg_id.decode(),
            "retry_count": p.retry_count,
            "metadata": p.metadata.model_dump(mode="json") if p.metadata else None,
        })
        await super()._dispatch_consumers(mq_msg)

    async def _dispatch_subscribers(self, payload: BroadcastMessagePayload) -> None:  # type: ignore[override]
        _current.set({
            "delivery": "broadcast",
            "msg_id": None,
            "retry_count": None,
            "metadata": payload.metadata.model_dump(mode="json") if payload.metadata else None,
        })
        await super()._dispatch_subscribers(payload)


class ProbeObserver:
    def observe_event_success(self, *, event_type: str, duration: float) -> None:
        pass

    def observe_event_failure(self, *, event_type: str, duration: float, exception: BaseException) -> None:
        _Counters.errors += 1
        _emit({
            "kind": "error",
            "stage": "decode" if isinstance(exception, EventPayloadDecodingError) else "handler",
            "name": event_type,
            "delivery": _current.get().get("delivery"),
            "msg_id": _current.get().get("msg_id"),
            "error": f"{type(exception).__name__}: {exception}",
        })


class _EnvelopeErrorHandler(logging.Handler):
    """Entries whose envelope (name/source/payload fields, or the JSON of a PUBLISH) is
    malformed never reach the dispatcher: RedisConsumer._read_messages and
    RedisSubscriber._read_broadcast_messages log and skip them. Report those."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:
            text = str(record.msg)
        if "malformed" in text.lower():
            _Counters.errors += 1
            _emit({"kind": "error", "stage": "envelope", "name": None, "error": text})


def manager_view(source: AgentId, event: Any) -> dict[str, Any] | None:
    """What the 26.x manager's own code makes of the two events it books from, computed with
    that code (an exception here is reported as a `handler` error line, failing the test):

    - `agent_heartbeat`: `AgentHeartbeatUpsert.from_agent_info()` (AgentEventHandler.
      handle_agent_heartbeat, ai/backend/manager/event_dispatcher/handlers/agent.py) → the
      agent row's `addr`, `public_key`, `available_slots`, `slot_key_and_units`, ...
    - `kernel_started`: `creation_info` validated again as `KernelCreationInfo` from its JSON
      form, and the `occupied_slots` the scheduler's `update_kernel_status_running` books
      (`ResourceSlotEntry.inputs_to_resource_slot(used_devices.slot_totals)`,
      ai/backend/manager/repositories/scheduler/db_source/db_source.py).
    """
    if isinstance(event, AgentHeartbeatEvent):
        from datetime import UTC, datetime

        from ai.backend.manager.data.agent.types import AgentHeartbeatUpsert

        info = AgentInfo.model_validate(event.agent_info.model_dump(mode="json"))
        up = AgentHeartbeatUpsert.from_agent_info(
            agent_id=source, agent_info=info, heartbeat_received=datetime.now(UTC)
        )
        pk = up.network_info.public_key
        return {
            "addr": up.network_info.addr,
            "public_host": up.network_info.public_host,
            "public_key": pk.decode() if isinstance(pk, bytes) else pk,
            "resource_group": up.metadata.resource_group,
            "architecture": up.metadata.architecture,
            "available_slots": {str(k): str(v) for k, v in up.resource_info.available_slots.items()},
            "slot_key_and_units": {
                str(k): str(getattr(v, "value", v)) for k, v in up.resource_info.slot_key_and_units.items()
            },
        }
    creation_info = getattr(event, "creation_info", None)
    if creation_info is not None:
        ci = KernelCreationInfo.model_validate(creation_info.model_dump(mode="json"))
        occupied = ResourceSlotEntry.inputs_to_resource_slot(ci.used_devices.slot_totals)
        return {
            "creation_info_class": f"{type(ci).__module__}.{type(ci).__qualname__}",
            "container_id": str(ci.container_id),
            "kernel_host": ci.kernel_host,
            "repl_in_port": ci.repl_in_port,
            "repl_out_port": ci.repl_out_port,
            "occupied_slots": {str(k): str(v) for k, v in occupied.items()},
        }
    return None


async def cmd_consume(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    h = _EnvelopeErrorHandler(level=logging.WARNING)
    for lname in (
        "ai.backend.common.message_queue.redis_queue.consumer",
        "ai.backend.common.message_queue.redis_queue.subscriber",
    ):
        logging.getLogger(lname).addHandler(h)

    anycast_classes, broadcast_classes = _concrete_event_classes()
    target = _redis_target(args)

    if args.group_start == "0":
        import redis  # redis-py, installed with backend.ai-common

        r = redis.Redis(
            host=args.redis_host, port=args.redis_port, db=REDIS_STREAM_DB, password=args.redis_password
        )
        try:
            r.xgroup_create(STREAM_KEY, args.group, id="0", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise
        finally:
            r.close()

    # ai/backend/manager/dependencies/messaging/message_queue.py MessageQueueDependency.provide()
    mq = await RedisQueue.create(
        target,
        RedisMQArgs(
            anycast_stream_key=STREAM_KEY,
            broadcast_channel=BROADCAST_CHANNEL,
            consume_stream_keys={STREAM_KEY},
            subscribe_channels={BROADCAST_CHANNEL},
            group_name=args.group,
            node_id=args.node_id,
            db=REDIS_STREAM_DB,
        ),
    )
    dispatcher = ProbeDispatcher(mq, event_observer=ProbeObserver())
    done = asyncio.Event()

    def handler(delivery: str):
        def cb(_ctx: None, source: AgentId, event: Any) -> None:
            cur = _current.get()
            _Counters.events += 1
            _emit({
                "kind": "event",
                "delivery": delivery,
                "name": event.event_name(),
                "class": f"{type(event).__module__}.{type(event).__qualname__}",
                "source": str(source),
                "msg_id": cur.get("msg_id"),
                "retry_count": cur.get("retry_count"),
                "metadata": cur.get("metadata"),
                "fields": event.model_dump(mode="json"),
                "manager_view": manager_view(source, event),
            })
            if args.max_events and _Counters.events >= args.max_events:
                done.set()

        return cb

    for name, cls in anycast_classes.items():
        dispatcher.consume(cls, None, handler("anycast"), name=f"probe.consume.{name}")
    for name, cls in broadcast_classes.items():
        dispatcher.subscribe(cls, None, handler("broadcast"), name=f"probe.subscribe.{name}")
    await dispatcher.start()

    # The consumer's group is created in RedisQueue.create(); the subscriber's SUBSCRIBE is
    # issued when its glide client connects. Wait until the channel shows a subscriber.
    import redis

    r = redis.Redis(host=args.redis_host, port=args.redis_port, db=REDIS_STREAM_DB, password=args.redis_password)
    try:
        for _ in range(100):
            counts = dict(r.pubsub_numsub(BROADCAST_CHANNEL))
            if counts.get(BROADCAST_CHANNEL.encode(), 0) > 0:
                break
            await asyncio.sleep(0.05)
        groups = [g["name"].decode() for g in r.xinfo_groups(STREAM_KEY)]
    finally:
        r.close()
    _emit({
        "kind": "ready",
        "stream": STREAM_KEY,
        "group": args.group,
        "groups": groups,
        "channel": BROADCAST_CHANNEL,
        "db": REDIS_STREAM_DB,
        "anycast_names": sorted(anycast_classes),
        "broadcast_names": sorted(broadcast_classes),
    })
    try:
        await asyncio.wait_for(done.wait(), timeout=args.timeout)
    except TimeoutError:
        pass
    # let in-flight handler tasks (and their XACKs) finish
    await asyncio.sleep(0.2)
    await dispatcher.close()
    await mq.close()
    _emit({
        "kind": "done",
        "events": _Counters.events,
        "errors": _Counters.errors,
        "unhandled": _Counters.unhandled,
    })
    return 3 if (_Counters.errors or _Counters.unhandled) else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--show", action="store_true")
    mode.add_argument("--publish", action="store_true")
    mode.add_argument("--consume", action="store_true")
    ap.add_argument("--redis-host", default="127.0.0.1")
    ap.add_argument("--redis-port", type=int, default=6379)
    ap.add_argument("--redis-password", default=None)
    ap.add_argument("--agent-id", default=EX_AGENT_ID, help="the source of published events")
    ap.add_argument("--node-id", default="bai-consumer-probe", help="consumer node id (consumer name hash)")
    ap.add_argument("--group", default=MANAGER_GROUP)
    ap.add_argument("--group-start", choices=["0", "$"], default="0")
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--max-events", type=int, default=0)
    args = ap.parse_args()
    if args.show:
        return cmd_show(args)
    if args.publish:
        return asyncio.run(cmd_publish(args))
    return asyncio.run(cmd_consume(args))


if __name__ == "__main__":
    sys.exit(main())
