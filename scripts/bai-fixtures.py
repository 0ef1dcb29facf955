#!/usr/bin/env python3
"""Writes tests/fixtures/bai/*.msgpack: values packed by the real
`ai.backend.common.msgpack.packb` (backend.ai-common 26.9.6), one per file, and
`tests/fixtures/bai/expected.json` saying what each must decode to (src/rpc/bai_ext).

    python3 scripts/bai-fixtures.py [OUTDIR]

Run it with a Python that has backend.ai-common (e.g. the root `just bai-env` builds). When
`ai.backend.common` does not import, it re-runs itself inside that root
(`chroot $KV_BAI_ROOT /opt/bai/bin/python`, default /var/cache/kernelvisor/bai-trixie; needs
root) and copies the files back.

expected.json maps a fixture name to one of
  {"ext": [codes...], "value": <what the msgpack value decodes to, as JSON>}
  {"ext": [codes...], "refused": "<module.name of the class the reader must refuse>"}
  {"ext": [codes...], "error": "<ExtError name: InvalidExtValue, PickleRefused, ...>"}
"""

import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent / "tests" / "fixtures" / "bai"


def reexec_in_root(out: Path) -> None:
    root = Path(os.environ.get("KV_BAI_ROOT", "/var/cache/kernelvisor/bai-trixie"))
    python = root / "opt/bai/bin/python"
    if not python.exists():
        sys.exit(f"no backend.ai-common here and no {python}: run `just bai-env` first")
    with tempfile.TemporaryDirectory(dir=root / "tmp") as tmp:
        inner = Path(tmp)
        shutil.copy(__file__, inner / "bai-fixtures.py")
        rel = "/" + str(inner.relative_to(root))
        subprocess.run(
            ["chroot", str(root), "/opt/bai/bin/python", f"{rel}/bai-fixtures.py", f"{rel}/out"],
            check=True,
        )
        out.mkdir(parents=True, exist_ok=True)
        for f in (inner / "out").iterdir():
            shutil.copy(f, out / f.name)


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    try:
        import ai.backend.common.msgpack  # noqa: F401
    except ImportError:
        reexec_in_root(out)
        return

    import datetime
    import enum
    import uuid
    from decimal import Decimal
    from pathlib import PosixPath, PurePosixPath

    import msgpack as _msgpack

    import ai.backend.common.types as bai_types
    from ai.backend.common.docker import ImageRef
    from ai.backend.common.events.event_types.kernel.types import KernelLifecycleEventReason
    from ai.backend.common.msgpack import packb
    from ai.backend.common.typed_validators import AutoDirectoryPath
    from ai.backend.common.types import (
        AutoPullBehavior,
        BinarySize,
        ClusterMode,
        ResourceSlot,
        SessionTypes,
        SlotName,
    )

    fixtures: dict[str, bytes] = {}
    expected: dict[str, dict] = {}

    def ext_codes(packed: bytes) -> list[int]:
        codes: set[int] = set()

        def hook(code: int, data: bytes) -> None:
            codes.add(code)
            return None

        _msgpack.unpackb(packed, ext_hook=hook, strict_map_key=False)
        return sorted(codes)

    def good(name: str, value, want) -> None:
        packed = packb(value)
        fixtures[name] = packed
        expected[name] = {"ext": ext_codes(packed), "value": want}

    def ext(name: str, code: int, payload: bytes, **want) -> None:
        packed = _msgpack.packb(_msgpack.ExtType(code, payload), use_bin_type=True)
        fixtures[name] = packed
        expected[name] = {"ext": [code], **want}

    def image(ref: ImageRef) -> dict:
        return {
            "name": ref.name,
            "project": ref.project,
            "tag": ref.tag,
            "registry": ref.registry,
            "architecture": ref.architecture,
            "is_local": ref.is_local,
            "canonical": ref.canonical,
        }

    def iso(dt: datetime.datetime) -> str:
        # temporenc keeps the offset: the local time at that offset, as isoformat() writes it.
        return dt.isoformat()

    # 1: UUID, also as a map key.
    u = uuid.UUID("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
    good("uuid", u, str(u))
    good("uuid_key", {u: "kernel", "n": 1}, {str(u): "kernel", "n": 1})

    # 2: datetimes, aware (two offsets) and naive, with and without microseconds.
    kst = datetime.timezone(datetime.timedelta(hours=9))
    for name, dt in [
        ("datetime_utc", datetime.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=datetime.UTC)),
        ("datetime_kst", datetime.datetime(2025, 1, 1, 8, 30, 0, tzinfo=kst)),
        ("datetime_naive", datetime.datetime(2024, 2, 29, 23, 59, 59, 1)),
        ("datetime_naive_whole", datetime.datetime(1999, 12, 31, 0, 0, 0)),
    ]:
        good(name, dt, iso(dt))

    # 3: Decimals, as Python's str() writes them.
    for name, d in [
        ("decimal_1_5", Decimal("1.5")),
        ("decimal_neg_small", Decimal("-0.001")),
        ("decimal_exp", Decimal("1E+3")),
        ("decimal_tiny", Decimal("0.000000123")),
        ("decimal_big", Decimal("268435456")),
    ]:
        good(name, d, str(d))

    # 4, 5, 17: paths.
    good("posix_path", PosixPath("/home/work/.bashrc"), "/home/work/.bashrc")
    good("pure_posix_path", PurePosixPath("relative/dir"), "relative/dir")
    good("auto_directory_path", AutoDirectoryPath("/tmp/kv-scratch"), "/tmp/kv-scratch")

    # 6: every member of the enums the agent's RPC receives, and a lifecycle reason.
    for cls in (SessionTypes, ClusterMode, AutoPullBehavior):
        for member in cls:
            good(f"enum_{cls.__name__}_{member.name}".lower(), member, member.value)
    good(
        "enum_kernel_lifecycle_reason",
        KernelLifecycleEventReason.USER_REQUESTED,
        KernelLifecycleEventReason.USER_REQUESTED.value,
    )

    # 7: ImageRefs, local and with a registry and project.
    local = ImageRef.from_image_str(
        "kernelvisor-test:latest",
        project=None,
        registry="local",
        architecture="x86_64",
        is_local=True,
    )
    good("image_ref_local", local, image(local))
    remote = ImageRef.from_image_str(
        "cr.backend.ai/stable/python:3.9-ubuntu20.04",
        project="stable",
        registry="cr.backend.ai",
        architecture="aarch64",
    )
    good("image_ref_registry", remote, image(remote))

    # 8, 9, 16.
    slots = ResourceSlot({"cpu": Decimal("1"), "mem": Decimal("268435456")})
    good("resource_slot", slots, {"cpu": "1", "mem": "268435456"})
    gpu = ResourceSlot({"cpu": Decimal("0.5"), "cuda.shares": Decimal("0.25")})
    good("resource_slot_fraction", gpu, {"cpu": "0.5", "cuda.shares": "0.25"})
    good("slot_name", SlotName("cuda.device"), "cuda.device")
    good("binary_size", BinarySize(1024), 1024)
    good("binary_size_big", BinarySize(2**40), 2**40)

    # Several types at once, as a call's payload.
    kid = uuid.UUID("00000000-0000-0000-0000-00000000000a")
    good(
        "call_payload",
        {
            "args": [kid, KernelLifecycleEventReason.USER_REQUESTED],
            "kwargs": {"suppress_events": False, "size": BinarySize(268435456)},
        },
        {
            "args": [str(kid), "user-requested"],
            "kwargs": {"suppress_events": False, "size": 268435456},
        },
    )

    # Values we refuse although they are real packb output.
    ext("decimal_nan", 3, pickle.dumps(Decimal("NaN"), protocol=5), error="InvalidExtValue")
    ext("decimal_inf", 3, pickle.dumps(Decimal("-Infinity"), protocol=5), error="InvalidExtValue")

    # Hostile pickles: each must be refused, naming the class.
    class RunsSystem:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    class RunsEval:
        def __reduce__(self):
            return (eval, ("__import__('os').system('echo pwned')",))

    ext("hostile_os_system", 6, pickle.dumps(RunsSystem(), protocol=5), refused=f"{os.system.__module__}.system")
    ext("hostile_eval", 3, pickle.dumps(RunsEval(), protocol=5), refused="builtins.eval")
    # The protocol-0 form (text GLOBAL), as classic exploits write it.
    ext("hostile_global_text", 8, b"cos\nsystem\n(S'echo pwned'\ntR.", refused="os.system")

    class EvilSlot(ResourceSlot):  # a subclass of an allowed class is not allowed
        pass

    EvilSlot.__module__ = "__main__"
    EvilSlot.__qualname__ = "EvilSlot"
    sys.modules["__main__"].EvilSlot = EvilSlot
    ext("hostile_subclass", 8, pickle.dumps(EvilSlot({"cpu": Decimal("1")}), protocol=5), refused="__main__.EvilSlot")
    # An ai.backend enum not in the allow-list.
    ext("hostile_other_enum", 6, pickle.dumps(bai_types.Sentinel.TOKEN, protocol=5), refused="ai.backend.common.types.Sentinel")
    # A real ImageRef sent as a Decimal: classes are allowed per type.
    ext("hostile_cross_type", 3, pickle.dumps(local, protocol=5), refused="ai.backend.common.docker.ImageRef")
    # eval hidden inside an otherwise real ResourceSlot.
    hidden = ResourceSlot({"cpu": Decimal("1")})
    hidden.data["mem"] = RunsEval()
    slot_eval = pickle.dumps(hidden, protocol=5)
    assert b"builtins" in slot_eval and b"ResourceSlot" in slot_eval
    ext("hostile_nested_eval", 8, slot_eval, refused="builtins.eval")
    # Unknown extension code.
    ext("unknown_ext_42", 42, b"\x01", error="UnsupportedExtType")

    assert isinstance(KernelLifecycleEventReason.USER_REQUESTED, enum.Enum)
    out.mkdir(parents=True, exist_ok=True)
    for name, data in fixtures.items():
        (out / f"{name}.msgpack").write_bytes(data)
    lines = [f"  {json.dumps(k)}: {json.dumps(expected[k], sort_keys=True)}" for k in sorted(expected)]
    (out / "expected.json").write_text("{\n" + ",\n".join(lines) + "\n}\n")
    print(f"wrote {len(fixtures)} fixtures to {out}")


if __name__ == "__main__":
    main()
