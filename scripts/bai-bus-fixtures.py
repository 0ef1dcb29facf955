#!/usr/bin/env python3
"""Writes tests/fixtures/bai/events/<event>.json: what the real Backend.AI 26.9.6 classes
(backend.ai-common) put on the event bus for one example of each event kernelvisor's agent
publishes (src/agent/bus/encode.rs), built from the same inputs the Rust test
(`agent::bus::fixtures` in src/agent/bus/fixtures.rs) gives our encoder.

    python3 scripts/bai-bus-fixtures.py [OUTDIR]

Each file: {"name", "xadd_fields": {name, source, payload, metadata} as
`AnycastMessagePayload.to_stream_fields()` renders them (what the agent XADDs to the stream
`events`), "publish_message": `BroadcastMessagePayload.to_json()` (what it PUBLISHes on
`events_all`) or null for anycast-only events}. The upstream wire is JSON (the event body is
`model_dump_json()`), not msgpack.

Run it with the Python of the 26.9.6 root; when `ai.backend.common` does not import it re-runs
itself there (`chroot $KV_BAI_ROOT /opt/bai/bin/python`, default
/var/cache/kernelvisor/bai-trixie; needs root) and copies the files back.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from decimal import Decimal
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent / "tests" / "fixtures" / "bai" / "events"

AGENT_ID = "i-fixture-agent"
KID = uuid.UUID("5b2c6f6e-1d2a-4c4e-9a51-0c8f3d7b9e01")
SID = uuid.UUID("a1f0e4d2-3b5c-4e6f-8a7b-9c0d1e2f3a4b")
CONTAINER = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa99887766554433221100"
IMAGE = "cr.backend.ai/stable/python:3.9-ubuntu20.04"
PUBLIC_KEY = b"Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID"


def events():
    from ai.backend.common.data.agent.types import AgentInfo
    from ai.backend.common.events.event_types.agent.anycast import (
        AgentErrorEvent, AgentHeartbeatEvent, AgentStartedEvent, AgentTerminatedEvent,
    )
    from ai.backend.common.events.event_types.image.anycast import (
        ImagePullFailedEvent, ImagePullFinishedEvent, ImagePullStartedEvent,
    )
    from ai.backend.common.events.event_types.kernel import anycast as ka, broadcast as kb
    from ai.backend.common.events.event_types.kernel.types import (
        KernelCreationInfo, KernelLifecycleEventReason as R, ServicePortInfo, UsedDevices,
    )
    from ai.backend.common.events.event_types.session import anycast as sa, broadcast as sb
    from ai.backend.common.docker import ImageRef
    from ai.backend.common.types import ResourceSlot, ResourceSlotEntry, SlotTypes

    # ImageRef.from_image_config of a check_and_pull image config naming IMAGE.
    IMAGE_REF = ImageRef.from_image_str(IMAGE, "stable", "cr.backend.ai", architecture="x86_64",
                                        is_local=False)
    info = AgentInfo(
        ip="10.0.0.11", region="local", scaling_group="default", addr="tcp://10.0.0.11:6011",
        public_key=PUBLIC_KEY, public_host="10.0.0.11",
        available_resource_slots=ResourceSlotEntry.from_resource_slot(ResourceSlot({
            "cpu": Decimal("8"), "cuda.device": Decimal("2"), "mem": Decimal("17179869184"),
        })),
        slot_key_and_units={"cpu": SlotTypes.COUNT, "cuda.device": SlotTypes.COUNT, "mem": SlotTypes.BYTES},
        version="0.1.0",
        compute_plugins={
            "cpu": {"agent_version": "0.1.0", "machine": "x86_64", "os_type": "Linux", "version": "0.1.0"},
            "cuda": {"version": "0.1.0"},
            "mem": {"version": "0.1.0"},
        },
        architecture="x86_64", auto_terminate_abusing_kernel=False,
    )
    ci = KernelCreationInfo(
        container_id=CONTAINER, kernel_host="10.0.0.11", repl_in_port=0, repl_out_port=0,
        service_ports=[ServicePortInfo(name="jupyter", protocol="http", container_ports=[8888],
                                       host_ports=[30001], is_inference=False)],
        used_devices=UsedDevices.from_allocations(
            {
                "cpu": {"cpu": {"0": Decimal("1.5")}},
                "cuda": {"cuda.device": {"0": Decimal("1")}},
                "mem": {"mem": {"root": Decimal("1073741824")}},
            },
            {
                "cpu": [{"device_id": "0", "model_name": "", "data": {}}],
                "cuda": [{"device_id": "0", "model_name": "NVIDIA H100", "data": {"mem": 85899345920}}],
                "mem": [{"device_id": "root", "model_name": "", "data": {}}],
            },
        ),
    )
    k = dict(kernel_id=KID, session_id=SID)
    return {
        "agent_started": (AgentStartedEvent(reason="self-started"), None),
        "agent_terminated": (AgentTerminatedEvent(reason="shutdown"), None),
        "agent_heartbeat": (AgentHeartbeatEvent(agent_info=info), None),
        "agent_error": (AgentErrorEvent(message="boom", traceback="at stage image"), None),
        "kernel_preparing": (ka.KernelPreparingAnycastEvent(**k), kb.KernelPreparingBroadcastEvent(**k)),
        "kernel_pulling": (ka.KernelPullingAnycastEvent(**k, reason=IMAGE), kb.KernelPullingBroadcastEvent(**k, reason=IMAGE)),
        "kernel_creating": (ka.KernelCreatingAnycastEvent(**k), kb.KernelCreatingBroadcastEvent(**k)),
        "kernel_started": (ka.KernelStartedAnycastEvent(**k, creation_info=ci), kb.KernelStartedBroadcastEvent(**k, creation_info=ci)),
        "kernel_terminated": (
            ka.KernelTerminatedAnycastEvent(**k, reason=R.USER_REQUESTED),
            kb.KernelTerminatedBroadcastEvent(**k, reason=R.USER_REQUESTED),
        ),
        "kernel_terminated_oom": (
            ka.KernelTerminatedAnycastEvent(**k, reason=R.SELF_TERMINATED, exit_code=137),
            kb.KernelTerminatedBroadcastEvent(**k, reason=R.SELF_TERMINATED, exit_code=137),
        ),
        "session_success": (
            sa.SessionSuccessAnycastEvent(session_id=SID, reason=R.TASK_FINISHED, exit_code=0),
            sb.SessionSuccessBroadcastEvent(session_id=SID, reason=R.TASK_FINISHED, exit_code=0),
        ),
        "session_failure": (
            sa.SessionFailureAnycastEvent(session_id=SID, reason=R.TASK_FAILED, exit_code=3),
            sb.SessionFailureBroadcastEvent(session_id=SID, reason=R.TASK_FAILED, exit_code=3),
        ),
        "session_failure_timeout": (
            sa.SessionFailureAnycastEvent(session_id=SID, reason=R.TASK_TIMEOUT, exit_code=-2),
            sb.SessionFailureBroadcastEvent(session_id=SID, reason=R.TASK_TIMEOUT, exit_code=-2),
        ),
        "execution_started": (sa.ExecutionStartedAnycastEvent(session_id=SID), None),
        "execution_finished": (sa.ExecutionFinishedAnycastEvent(session_id=SID), None),
        "execution_timeout": (sa.ExecutionTimeoutAnycastEvent(session_id=SID), None),
        "image_pull_started": (ImagePullStartedEvent(image=IMAGE, image_ref=IMAGE_REF, agent_id=AGENT_ID, timestamp=1767225600.25), None),
        "image_pull_finished": (ImagePullFinishedEvent(image=IMAGE, image_ref=IMAGE_REF, agent_id=AGENT_ID, timestamp=1767225600.25, msg="Image already exists"), None),
        "image_pull_failed": (ImagePullFailedEvent(image=IMAGE, image_ref=IMAGE_REF, agent_id=AGENT_ID, msg="timeout (s:60)"), None),
        "do_sync_kernel_logs": (ka.DoSyncKernelLogsEvent(kernel_id=KID, container_id=CONTAINER), None),
    }


def write(out: Path) -> None:
    from ai.backend.common.message_queue.payload import AnycastMessagePayload, BroadcastMessagePayload
    from ai.backend.common.message_queue.types import MessageMetadata

    out.mkdir(parents=True, exist_ok=True)
    md = MessageMetadata.from_current_context()
    for fixture, (a, b) in events().items():
        m = a.to_message()
        fields = AnycastMessagePayload.from_event_body(name=m.name, source=AGENT_ID, payload=m.payload, metadata=md).to_stream_fields()
        doc = {
            "name": m.name,
            "xadd_fields": {k.decode(): v.decode() for k, v in fields.items()},
            "publish_message": None,
        }
        if b is not None:
            bm = b.to_message()
            doc["publish_message"] = BroadcastMessagePayload.from_event_body(
                name=bm.name, source=AGENT_ID, payload=bm.payload, metadata=md).to_json().decode()
        (out / f"{fixture}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    try:
        import ai.backend.common  # noqa: F401
    except ImportError:
        root = Path(os.environ.get("KV_BAI_ROOT", "/var/cache/kernelvisor/bai-trixie"))
        with tempfile.TemporaryDirectory(dir=root / "tmp") as tmp:
            shutil.copy(__file__, Path(tmp) / "gen.py")
            inside = "/" + str(Path(tmp).relative_to(root))
            subprocess.run(["chroot", str(root), "/opt/bai/bin/python", f"{inside}/gen.py", f"{inside}/out"], check=True)
            shutil.rmtree(out, ignore_errors=True)
            shutil.copytree(Path(tmp) / "out", out)
        return
    write(out)


if __name__ == "__main__":
    main()
