"""Drives one kernel's whole life on a kernelvisor agent with the real Backend.AI agent client.

Runs inside the Debian trixie root that `scripts/bai-compat-env.sh` builds (Python 3.13 and a venv
with `backend.ai-manager` 26.9.6 at /opt/bai):

    chroot $KV_BAI_ROOT /opt/bai/bin/python /path/in/root/driver.py \
        --addr tcp://127.0.0.1:PORT --agent-id ID \
        --manager-keypair manager.key_secret --agent-public-key agent.key \
        [--session-id UUID] [--kernel-id UUID] [--image-digest sha256:...] [--image-labels JSON] \
        [--host-hook] [--registry HOST:PORT --registry-user USER] [--write-fixtures DIR]
        [--only STEP,...] [--scenario lifecycle|runner]

The client is built the way the 26.x manager builds it: `AgentRPCCache(None, manager_pub,
manager_sec).update(agent_id, addr, agent_pub)`, then `AgentClientPool` → `AgentClient` → callosum
`PeerInvoker` with CURVE and `ai.backend.common.msgpack`. `create_kernels` is not called by hand: the
manager's own `SessionLauncher._start_single_session` builds the `KernelCreationConfig`,
`ClusterInfo` and `kernel_image_refs` and calls the pool (only its database, Valkey and config
inputs are stubbed). The other calls take the arguments the 26.x manager's registry/terminator pass.

Each step prints one JSON line `{"step": ..., "ok": bool, "value"|"error": ...}`; a failed step does
not stop the run (one run shows every gap); the exit status is 1 when any step failed.

`--host-hook`: after the kernel is running the driver prints `{"pause": "remove_find",
"kernel_id": ...}` and waits for one line on stdin: the caller removes the image's `find` from the
container meanwhile (`docker exec -u 0 CID rm /bin/find`). Without it the driver tries that itself
with `execute` (which may lack the permission).

`--registry`: the registry (plain HTTP on loopback, basic auth: `--registry-user`, the password in
`$KV_REGISTRY_PASSWORD`) that `commit` names its image in and `push_image` pushes to; the steps
`commit`, `get_commit_status`, `push_image` and `purge_images` (`image_steps`) need it. The driver
prints `{"pushed": canonical}` once the push is done.

`--scenario runner` (the default is `lifecycle`, the steps above): after `create_kernels` and
`check_running`, a kernel that Backend.AI's own kernel runner serves (an image with upstream's
labels, `kernelvisor-test-py:latest`) is driven as a persistent Python REPL (`runner_steps`:
`kernel_uid`, `query_state`, `query_error`, `query_input`, `query_continuation`, `interrupt`,
`batch`, `get_completions`, `start_service_ttyd`, `start_service_hello`,
`shutdown_service_hello`, `start_service_hello_again`), then `destroy_kernel` and
`check_running_after_destroy`.

`--scenario retries --hold-file PATH`: the answers upstream's manager expects when it sends a
call again (`retries_steps`). The launcher's `create_kernels` is sent twice at once, each kernel
config carrying kernelvisor's test-only `_inject` `hold_before` (its container stage waits until
PATH exists on the agent's host): the driver prints `{"pause": "creates_sent"}` and waits for one
line on stdin, while the caller sees the second call join the first (the agent's
`kernelvisor_create_kernels_retries_total{answer="joined"}`) and creates PATH; both answers must
be the same (`create_kernels`, `create_kernels_joined`). Once the kernel runs:
`create_kernels_again` (the launcher a third time, the real configs: the creation result again),
`one_container` (a `{"pause": "count_containers"}` answered with the number of containers
labelled with the kernel id, which must be 1), `restart_kernel_partial` (`restart_kernel` with
only `environ` in `updated_config`, merged over the stored config as upstream's agent does) and
`check_running_after_restart` (the new environment seen by `execute`), then `destroy_kernel`.

`--only STEP,...`: only the named steps run (`create_kernels`, through the launcher, always does);
tests/it/bai_events.rs creates and destroys one kernel this way while the real consumer reads the
agent's events off Redis.

`--write-fixtures DIR`: for every method called, the real `ai.backend.common.msgpack.packb` bytes of
its first request body (`{"args", "kwargs", "metadata"}`, exactly the callosum FUNCTION body) go to
`DIR/<method>.msgpack`, and `DIR/<method>.json` gets a readable view of the same value with each
msgpack ext type spelled out (`$uuid`, `$enum`, `$image_ref`, ...) plus the ext type codes it holds.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextvars
import decimal
import enum
import json
import os
import pathlib
import platform
import sys
import traceback
import types
import uuid
from typing import Any

# ---------------------------------------------------------------------------------------------
# Output


def _jsonable(v: Any, depth: int = 0) -> Any:
    if depth > 12:
        return repr(v)
    # Enums first: a StrEnum is also a str.
    if isinstance(v, enum.Enum):
        cls = type(v)
        return {"$enum": f"{cls.__module__}.{cls.__qualname__}", "name": v.name, "value": v.value}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        return {"$bin": base64.b64encode(b[:4096]).decode(), "len": len(b)}
    if isinstance(v, uuid.UUID):
        return {"$uuid": str(v)}
    if isinstance(v, decimal.Decimal):
        return {"$decimal": str(v)}
    if isinstance(v, pathlib.PurePath):
        return {"$path": str(v), "class": type(v).__name__}
    if type(v).__name__ == "ImageRef":
        return {
            "$image_ref": {
                "name": v.name,
                "project": v.project,
                "registry": v.registry,
                "tag": v.tag,
                "architecture": v.architecture,
                "is_local": v.is_local,
                "canonical": v.canonical,
            }
        }
    if isinstance(v, dict):
        if all(isinstance(k, str) for k in v):
            return {k: _jsonable(x, depth + 1) for k, x in v.items()}
        return {"$map": [[_jsonable(k, depth + 1), _jsonable(x, depth + 1)] for k, x in v.items()]}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x, depth + 1) for x in v]
    return {"$repr": repr(v), "class": f"{type(v).__module__}.{type(v).__qualname__}"}


def _clip(v: Any, limit: int = 3000) -> Any:
    text = json.dumps(v)
    if len(text) <= limit:
        return v
    return {"$clipped": text[:limit], "len": len(text)}


FAILED: list[str] = []
REPORTED: list[str] = []


def emit(step: str, ok: bool, value: Any = None, error: str | None = None) -> None:
    REPORTED.append(step)
    line: dict[str, Any] = {"step": step, "ok": ok}
    if ok:
        line["value"] = _clip(_jsonable(value))
    else:
        FAILED.append(step)
        text = error or ""
        line["error"] = text if len(text) <= 1500 else f"{text[:1500]}... ({len(text)} chars)"
    print(json.dumps(line), flush=True)


def describe(e: BaseException) -> str:
    name = getattr(e, "name", None)
    rep = getattr(e, "repr", None)
    if isinstance(name, str) and isinstance(rep, str):
        # callosum's RPCUserError (a FAILURE) / RPCInternalError (an ERROR)
        return f"{type(e).__name__}: {name}: {rep}"
    text = str(e) or repr(e)
    return f"{type(e).__name__}: {text}"


class StepFailed(Exception):
    """A reply arrived but is not what upstream answers (or not what the step expects)."""


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise StepFailed(msg)


# ---------------------------------------------------------------------------------------------
# Request bodies as packed on the wire (for fixtures)

RECORDED: list[bytes] = []


def install_packb_recorder() -> None:
    """Records the output of the real `ai.backend.common.msgpack.packb` for request bodies.

    `AgentClientPool._create_peer` reads `msgpack.packb` when it makes the peer, so replacing the
    module attribute before the pool makes its first peer routes the peer's serializer through
    this wrapper, which returns the real function's bytes unchanged.
    """
    from ai.backend.common import msgpack as bai_msgpack

    real_packb = bai_msgpack.packb

    def recording_packb(data: Any, **kwargs: Any) -> bytes:
        out = real_packb(data, **kwargs)
        if isinstance(data, dict) and "args" in data and "kwargs" in data:
            RECORDED.append(out)
        return out

    bai_msgpack.packb = recording_packb  # type: ignore[assignment]


FIXTURES: dict[str, bytes] = {}


def record_fixture(method: str, since: int) -> None:
    """The first request body packed since `since` whose call is `method` (not a health ping)."""
    if method in FIXTURES or method == "-":
        return
    from ai.backend.common import msgpack as bai_msgpack

    for raw in RECORDED[since:]:
        body = bai_msgpack.unpackb(raw)
        if method != "ping" and tuple(body.get("args", ())) == ("ping",):
            continue
        FIXTURES[method] = raw
        return


def _without_private_keys(raw: bytes) -> bytes:
    """`raw` re-packed by the real `packb` with the cluster SSH key pair the launcher generated
    and a registry's password (`push_image`) replaced by placeholders: a fixture in the
    repository holds no private key nor password, even a throwaway one (secret scanners flag
    it)."""
    from ai.backend.common import msgpack as bai_msgpack

    def scrub(v: Any) -> Any:
        if isinstance(v, dict):
            return {
                k: (
                    {"public_key": "ssh-rsa <placeholder>", "private_key": "<placeholder>"}
                    if k == "ssh_keypair" and isinstance(x, dict)
                    else "<placeholder>"
                    if k == "password" and isinstance(x, str)
                    else scrub(x)
                )
                for k, x in v.items()
            }
        if isinstance(v, (list, tuple)):
            return [scrub(x) for x in v]
        return v

    body = bai_msgpack.unpackb(raw)
    scrubbed = scrub(body)
    return raw if scrubbed == body else bai_msgpack.packb(scrubbed)


def write_fixtures(directory: str) -> None:
    import msgpack as plain_msgpack

    from ai.backend.common import msgpack as bai_msgpack

    d = pathlib.Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    for method, raw in sorted(FIXTURES.items()):
        raw = _without_private_keys(raw)
        (d / f"{method}.msgpack").write_bytes(raw)
        codes: set[int] = set()

        def hook(code: int, data: bytes) -> Any:
            codes.add(code)
            return plain_msgpack.ExtType(code, data)

        plain_msgpack.unpackb(raw, ext_hook=hook, strict_map_key=False, raw=False)
        view = {
            "method": method,
            "packed_by": "ai.backend.common.msgpack.packb (backend.ai-common 26.9.6)",
            "ext_types": sorted(codes),
            "value": _jsonable(bai_msgpack.unpackb(raw)),
        }
        (d / f"{method}.json").write_text(json.dumps(view, indent=2, sort_keys=True) + "\n")
    print(
        json.dumps({"fixtures": sorted(FIXTURES), "dir": str(d)}),
        flush=True,
    )


# ---------------------------------------------------------------------------------------------
# Diagnosis: the same call without pickled ext types


def without_pickles(v: Any) -> Any:
    """`v` with every value that `packb` would pickle (ext 6 Enum, 7 ImageRef, 3 Decimal) made
    plain: an enum its value, an ImageRef the map of its fields, a Decimal its text; UUID map
    keys (ext 1) become text. For `--diagnose-without-pickles` only: what the agent answers once
    its codec reads those types, before it does."""
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, decimal.Decimal):
        return str(v)
    if type(v).__name__ == "ImageRef":
        return {
            "name": v.name,
            "project": v.project,
            "registry": v.registry,
            "tag": v.tag,
            "architecture": v.architecture,
            "is_local": v.is_local,
        }
    if isinstance(v, dict):
        return {
            (str(k) if isinstance(k, uuid.UUID) else k): without_pickles(x) for k, x in v.items()
        }
    if isinstance(v, (list, tuple)):
        return [without_pickles(x) for x in v]
    return v


# ---------------------------------------------------------------------------------------------
# Images: commit, get_commit_status, push_image, purge_images


async def wait_bgtask(c: Any, bgtask_id: str, agent_id: Any, limit: float = 90.0) -> dict[str, Any]:
    """Polls kernelvisor's `get_bgtask` (upstream's manager waits for `bgtask_*` events) until
    the agent's background task ends; its last state."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while True:
        state = dict(await c._peer.call.get_bgtask(bgtask_id, agent_id=agent_id))
        if state.get("status") != "ongoing":
            return state
        check(loop.time() < deadline, f"task {bgtask_id} still ongoing after {limit:.0f} s")
        await asyncio.sleep(0.2)


async def image_steps(step: Any, args: argparse.Namespace, ids: dict[str, Any]) -> None:
    """`commit` (as `AgentRegistry.commit_session` calls it: the kernel, the owner's e-mail with
    `@` as `_`, `canonical` and `extra_labels` as keywords), `get_commit_status` (the agent
    method, on the raw peer: the 26.x client reads the status from Valkey instead),
    `push_image` (an `ImageRef` and the registry's `ImageRegistry` map, as
    `AgentRegistry.push_image` passes them), `purge_images` (the request's images, `force`,
    `noprune`; the reply read as `AgentRegistry.purge_images` reads it). Each reply is checked
    against upstream's shape; the background tasks are followed with kernelvisor's
    `get_bgtask`."""
    import uuid as uuid_mod

    from ai.backend.common.docker import ImageRef
    from ai.backend.common.dto.agent.response import PurgeImageResp, PurgeImagesResp

    kernel_id, agent_id, arch = ids["kernel_id"], ids["agent_id"], ids["arch"]
    registry = args.registry
    tag_run = uuid_mod.uuid4().hex[:8]
    canonical = f"{registry}/kv/bai-compat-{tag_run}:1" if registry else None
    email = "admin_lablup.com"

    async def commit(c: Any) -> Any:
        check(canonical is not None, "no --registry given")
        r = await c.commit(kernel_id, email, canonical=canonical, extra_labels={"kv.bai": "1"})
        check(isinstance(r, dict), f"commit answered {r!r}, not a map")
        check(set(r) == {"bgtask_id", "kernel", "path"}, f"commit keys {sorted(r)}")
        uuid_mod.UUID(str(r["bgtask_id"]))
        check(r["kernel"] == str(kernel_id), f"kernel {r['kernel']!r} != {kernel_id}")
        check(r["path"] is None, f"path {r['path']!r}: upstream answers None without filename")
        state = await wait_bgtask(c, str(r["bgtask_id"]), agent_id)
        check(state.get("status") == "done", f"the commit task ended {state!r}")
        return {**r, "task": state}

    await step("commit", "commit", commit, timeout=120)

    async def commit_status(c: Any) -> Any:
        r = await c._peer.call.get_commit_status(str(kernel_id), email, agent_id=agent_id)
        check(isinstance(r, dict), f"get_commit_status answered {r!r}, not a map")
        check(set(r) == {"kernel", "status"}, f"get_commit_status keys {sorted(r)}")
        check(r["kernel"] == str(kernel_id), f"kernel {r['kernel']!r}")
        check(r["status"] == "ready", f"status {r['status']!r}, want 'ready' after the commit")
        return r

    await step("get_commit_status", "get_commit_status", commit_status)

    async def push_image(c: Any) -> Any:
        check(canonical is not None, "no --registry given")
        image_ref = ImageRef.from_image_str(
            canonical, "kv", registry, architecture=arch, is_local=False
        )
        conf = {
            "name": registry,
            "url": f"http://{registry}",
            "username": args.registry_user,
            "password": os.environ.get("KV_REGISTRY_PASSWORD"),
        }
        r = await c.push_image(image_ref, conf)
        check(isinstance(r, dict), f"push_image answered {r!r}, not a map")
        check(set(r) == {"bgtask_id", "canonical"}, f"push_image keys {sorted(r)}")
        check(r["canonical"] == image_ref.canonical, f"canonical {r['canonical']!r}")
        state = await wait_bgtask(c, str(r["bgtask_id"]), agent_id)
        check(state.get("status") == "done", f"the push task ended {state!r}")
        print(json.dumps({"pushed": image_ref.canonical}), flush=True)
        return {**r, "task": state}

    await step("push_image", "push_image", push_image, timeout=120)

    async def purge_images(c: Any) -> Any:
        check(canonical is not None, "no --registry given")
        in_use = args.image  # the running kernel's image: refused, never removed
        images = [canonical, "kv-no-such-image:0", in_use]
        r = await c.purge_images(images, False, False)
        check(isinstance(r, dict) and set(r) == {"responses"}, f"purge_images answered {r!r}")
        resp = PurgeImagesResp(
            responses=[
                PurgeImageResp(image=x["image"], error=x.get("error")) for x in r["responses"]
            ]
        )
        check([x.image for x in resp.responses] == images, f"images {resp!r}")
        for x in r["responses"]:
            check(set(x) == {"image", "error"}, f"entry keys {sorted(x)}")
        removed, missing, used = resp.responses
        check(removed.error is None, f"{canonical} not removed: {removed.error!r}")
        check(missing.error is not None, "a missing image reported as removed")
        check(
            used.error is not None and str(kernel_id) in used.error,
            f"the running kernel's image: {used.error!r}",
        )
        return r

    await step("purge_images", "purge_images", purge_images, timeout=120)


# ---------------------------------------------------------------------------------------------
# A Python REPL through Backend.AI's kernel runner (`--scenario runner`)


def console_text(console: Any, kind: str) -> str:
    """The `kind` (`stdout`, `stderr`) text of an `execute` reply's `console` items."""
    text = []
    for item in console or []:
        check(
            isinstance(item, (list, tuple)) and len(item) == 2,
            f"console item {item!r} is not a [type, data] pair",
        )
        if item[0] == kind:
            text.append(str(item[1]))
    return "".join(text)


async def runner_steps(step: Any, run_code: Any, ids: dict[str, Any]) -> None:
    """What a kernel whose image carries upstream's labels answers once Backend.AI's own kernel
    runner serves it (`kernelvisor-test-py`, a persistent Python REPL): state across runs, an
    error, `input()`, continuation, an interrupt that keeps the REPL, batch steps,
    `get_completions`, and the services (the intrinsic `ttyd`, the image's service-def `hello`).
    Each through the real `AgentClient`, with the manager's arguments: major API version 9,
    `flush_timeout` 2.0 unless a step needs another. `trigger_batch_execution` is not called: its
    result is only an event (`session_success` / `session_failure`), read off the event bus."""
    import urllib.request

    session_id, kernel_id = ids["session_id"], ids["kernel_id"]
    created = ids.get("created")

    async def execute(
        c: Any, run_id: str, mode: str, code: str, opts: dict[str, Any], flush: float
    ) -> dict[str, Any]:
        r = await c.execute(session_id, kernel_id, 9, run_id, mode, code, opts, flush)
        check(isinstance(r, dict) or hasattr(r, "get"), f"execute answered {r!r}, not a map")
        r = dict(r)
        check(str(r.get("runId")) == run_id, f"runId {r.get('runId')!r} != {run_id}: {r!r}")
        return r

    async def continue_until_finished(
        c: Any, run_id: str, first: dict[str, Any], flush: float, limit: int = 120
    ) -> list[dict[str, Any]]:
        replies = [first]
        while replies[-1].get("status") != "finished":
            status = replies[-1].get("status")
            check(
                status in ("continued", "build-finished", "clean-finished"),
                f"execute answered status {status!r}: {replies[-1]!r}",
            )
            check(len(replies) < limit, f"no `finished` after {limit} replies")
            replies.append(await execute(c, run_id, "continue", "", {}, flush))
        return replies

    def summary(replies: list[dict[str, Any]]) -> dict[str, Any]:
        console: list[Any] = []
        for rep in replies:
            console.extend(rep.get("console") or [])
        return {
            "statuses": [rep.get("status") for rep in replies],
            "exitCode": replies[-1].get("exitCode"),
            "stdout": console_text(console, "stdout"),
            "stderr": console_text(console, "stderr")[-300:],
        }

    async def query(c: Any, code: str) -> dict[str, Any]:
        """`run_code` (query, flush 2.0, `continue` until `finished`) plus its texts."""
        out = await run_code(c, code)
        check(out["run_ids"] == [out["run_id"]], f"runId {out['run_ids']} != {out['run_id']}")
        return {
            "run_id": out["run_id"],
            "statuses": out["statuses"],
            "exitCode": out["exitCode"],
            "stdout": console_text(out["console"], "stdout"),
            "stderr": console_text(out["console"], "stderr"),
        }

    async def x_is_41(c: Any) -> None:
        out = await query(c, "print(x)")
        check((out["stdout"], out["exitCode"]) == ("41\n", 0), f"print(x) afterwards: {out!r}")

    # -- who runs the REPL: the launcher sends `uid` None, so the agent's `kernel-uid` (1000) ----

    async def kernel_uid(c: Any) -> Any:
        out = await query(c, "import os; print(os.getuid(), os.getgid())")
        if out["exitCode"] == 127 and not out["stdout"] and not out["stderr"]:
            # The runner answers every query so once its Jupyter kernel did not answer within
            # its own 10 s at boot (`jupyter channel is not active!` in its log).
            logs = await c.get_logs(kernel_id)
            tail = "\n".join(str(logs.get("logs", "")).splitlines()[-15:])
            raise StepFailed(f"the runner's query mode is off (exit 127 at once); its log:\n{tail}")
        check(out["stdout"] == "1000 1000\n", f"uid/gid {out['stdout']!r}, want '1000 1000': {out}")
        return out

    await step("kernel_uid", "execute", kernel_uid, timeout=60)

    # -- state across runs -------------------------------------------------------------------------

    async def query_state(c: Any) -> Any:
        first = await query(c, "x = 41")
        check(first["statuses"][-1] == "finished", f"x = 41: {first!r}")
        check(first["exitCode"] == 0, f"x = 41: exitCode {first['exitCode']!r}: {first!r}")
        second = await query(c, "print(x + 1)")
        check(second["run_id"] != first["run_id"], "the same run id twice")
        check(
            second["stdout"] == "42\n",
            f"print(x + 1): stdout {second['stdout']!r}, want '42\\n'",
        )
        check(second["exitCode"] == 0, f"print(x + 1): exitCode {second['exitCode']!r}")
        return {"x = 41": first, "print(x + 1)": second}

    await step("query_state", "execute", query_state, timeout=60)

    # -- an error: exit code 1, the traceback on stderr, the REPL keeps `x` ------------------------

    async def query_error(c: Any) -> Any:
        out = await query(c, "1/0")
        check(out["exitCode"] == 1, f"1/0: exitCode {out['exitCode']!r}, want 1: {out!r}")
        check(
            "ZeroDivisionError" in out["stderr"] and "Traceback" in out["stderr"],
            f"1/0: no traceback with ZeroDivisionError on stderr: {out!r}",
        )
        await x_is_41(c)
        return {**out, "stderr": out["stderr"][-200:]}

    await step("query_error", "execute", query_error, timeout=60)

    # -- input(): waiting-input, then mode `input` with the line -----------------------------------

    async def query_input(c: Any) -> Any:
        run_id = uuid.uuid4().hex
        r = await execute(c, run_id, "query", "name = input('who? ')", {}, 2.0)
        check(r.get("status") == "waiting-input", f"status {r.get('status')!r}: {r!r}")
        check(r.get("options") == {"is_password": False}, f"options {r.get('options')!r}")
        check(
            console_text(r.get("console"), "stdout") == "who? ",
            f"the prompt: console {r.get('console')!r}, want stdout 'who? '",
        )
        fed = await execute(c, run_id, "input", "bob", {}, 2.0)
        replies = await continue_until_finished(c, run_id, fed, 2.0)
        check(replies[-1].get("exitCode") == 0, f"after the input: {replies!r}")
        out = await query(c, "print(name)")
        check(out["stdout"] == "bob\n", f"print(name): stdout {out['stdout']!r}, want 'bob\\n'")
        return {"prompt": r, "after_input": summary(replies), "print(name)": out["stdout"]}

    await step("query_input", "execute", query_input, timeout=60)

    # -- continuation: 3 s of output with flush_timeout 0.5 ----------------------------------------

    async def query_continuation(c: Any) -> Any:
        run_id = uuid.uuid4().hex
        code = "import time\nfor i in range(15):\n    print(i, flush=True)\n    time.sleep(0.2)"
        first = await execute(c, run_id, "query", code, {}, 0.5)
        check(
            first.get("status") == "continued",
            f"first status {first.get('status')!r}: {first!r}",
        )
        replies = await continue_until_finished(c, run_id, first, 0.5)
        out = summary(replies)
        want = "".join(f"{i}\n" for i in range(15))
        check(out["stdout"] == want, f"stdout {out['stdout']!r}, want 0..14 once each, in order")
        check(out["exitCode"] == 0, f"exitCode {out['exitCode']!r}")
        first_stdout = console_text(first["console"], "stdout")
        return {**out, "replies": len(replies), "first_stdout": first_stdout}

    await step("query_continuation", "execute", query_continuation, timeout=60)

    # -- interrupt: KeyboardInterrupt ends the run, the REPL and `x` stay --------------------------

    async def interrupt(c: Any) -> Any:
        run_id = uuid.uuid4().hex
        code = "import time\nwhile True:\n    time.sleep(0.1)"
        first = await execute(c, run_id, "query", code, {}, 1.0)
        check(
            first.get("status") == "continued",
            f"first status {first.get('status')!r}: {first!r}",
        )
        answered = await c.interrupt_kernel(kernel_id)
        replies = await continue_until_finished(c, run_id, first, 2.0)
        out = summary(replies)
        check(out["exitCode"] == 1, f"exitCode {out['exitCode']!r}, want 1: {out!r}")
        check("KeyboardInterrupt" in out["stderr"], f"no KeyboardInterrupt on stderr: {out!r}")
        await x_is_41(c)
        return {"interrupt_kernel": answered, **out}

    await step("interrupt", "interrupt_kernel", interrupt, timeout=60)

    # -- batch: clean, build, exec, each with its own end status -----------------------------------

    async def batch(c: Any) -> Any:
        run_id = uuid.uuid4().hex
        opts = {"clean": "", "build": "echo b", "exec": "python3 -c 'print(6*7)'; exit 4"}
        first = await execute(c, run_id, "batch", "", opts, 2.0)
        replies = [first]
        while replies[-1].get("status") != "finished":
            status = replies[-1].get("status")
            check(
                status in ("continued", "build-finished", "clean-finished"),
                f"execute answered status {status!r}: {replies[-1]!r}",
            )
            check(len(replies) < 60, "no `finished` after 60 replies")
            replies.append(await execute(c, run_id, "continue", "", {}, 2.0))
        # Each end status with its exit code and the stdout since the previous one.
        ends: list[Any] = []
        pending = ""
        for rep in replies:
            pending += console_text(rep.get("console"), "stdout")
            if rep.get("status") != "continued":
                ends.append([rep.get("status"), rep.get("exitCode"), pending])
                pending = ""
        got = [e[:2] for e in ends]
        want = [["clean-finished", 0], ["build-finished", 0], ["finished", 4]]
        check(got == want, f"end statuses {got!r}, want {want!r}: {ends!r}")
        check(ends[1][2] == "b\n", f"build stdout {ends[1][2]!r}, want 'b\\n'")
        check(ends[2][2] == "42\n", f"exec stdout {ends[2][2]!r}, want '42\\n'")
        return {"ends": ends, "replies": len(replies)}

    await step("batch", "execute", batch, timeout=90)

    # -- get_completions: upstream's CodeCompletionResult, read as the manager does ----------------

    async def get_completions(c: Any) -> Any:
        from ai.backend.common.dto.agent.response import CodeCompletionResp

        r = await c.get_completions(kernel_id, "pri", {})
        # Upstream's agent answers `CodeCompletionResp.as_dict()`: `{"result": {...}}`.
        check(isinstance(r, dict), f"get_completions answered {r!r}, not a map")
        check(set(r) == {"result"}, f"get_completions keys {sorted(r)}: CodeCompletionResp's is result")
        res = r["result"]
        check(
            isinstance(res, dict) and set(res) == {"status", "error", "suggestions"},
            f"result {res!r}: CodeCompletionResult's keys are status, error, suggestions",
        )
        check(res["status"] == "finished", f"status {res['status']!r}")
        check(res["error"] is None, f"error {res['error']!r}")
        check(
            isinstance(res["suggestions"], (list, tuple))
            and all(isinstance(s, str) for s in res["suggestions"]),
            f"suggestions {res['suggestions']!r}, not a list of text",
        )
        # As AgentRegistry.get_completions reads it: the same, not a default.
        manager_view = CodeCompletionResp.from_dict(r).as_dict()
        sent = dict(res, suggestions=list(res["suggestions"]))  # msgpack gives a tuple
        check(manager_view == {"result": sent}, f"the manager reads {manager_view!r}, not {sent!r}")
        return {"reply": r, "manager_reads": manager_view}

    await step("get_completions", "get_completions", get_completions)

    # -- services: the intrinsic ttyd, the image's service-def `hello` -----------------------------

    def service_port(name: str) -> tuple[str, int] | None:
        """`(kernel_host, host port)` of service `name` in the create_kernels reply, as the
        manager's `start_service` reads `service_ports`."""
        if not (isinstance(created, (list, tuple)) and created and isinstance(created[0], dict)):
            return None
        host = created[0].get("kernel_host") or "127.0.0.1"
        for sport in created[0].get("service_ports") or []:
            if sport.get("name") == name and sport.get("host_ports"):
                return host, int(sport["host_ports"][0])
        return None

    async def fetch_hello(tries: int = 50) -> str:
        """`GET /` of `hello` on its host port, tried `tries` times 0.2 s apart."""
        where = service_port("hello")
        check(where is not None, f"no `hello` in the create_kernels service_ports: {created!r}")
        url = f"http://{where[0]}:{where[1]}/"
        loop = asyncio.get_running_loop()
        last: Any = None
        for _ in range(tries):
            try:
                body = await loop.run_in_executor(
                    None, lambda: urllib.request.urlopen(url, timeout=2).read().decode()
                )
                return body
            except Exception as e:  # not listening yet
                last = e
                await asyncio.sleep(0.2)
        raise StepFailed(f"GET {url}: {last!r}")

    async def start_ttyd(c: Any) -> Any:
        r = await c.start_service(kernel_id, "ttyd", {})
        check(isinstance(r, dict), f"start_service answered {r!r}, not a map")
        check(r.get("status") in ("running", "started"), f"ttyd: {r!r}")
        return r

    await step("start_service_ttyd", "start_service", start_ttyd)

    async def start_hello(c: Any) -> Any:
        r = await c.start_service(kernel_id, "hello", {})
        check(isinstance(r, dict), f"start_service answered {r!r}, not a map")
        check(r.get("status") == "started", f"hello: {r!r}, want status 'started'")
        body = await fetch_hello()
        check(body == "hello from a service-def\n", f"GET hello: {body!r}")
        return {"reply": r, "GET /": body}

    await step("start_service_hello", "start_service", start_hello)

    async def shutdown_hello(c: Any) -> Any:
        r = await c.shutdown_service(kernel_id, "hello")
        # Stopped: its port no longer serves (refused, or closed by Docker's proxy).
        for _ in range(50):
            try:
                await fetch_hello(tries=1)
            except StepFailed as e:
                return {"reply": r, "GET /": str(e)}
            await asyncio.sleep(0.1)
        raise StepFailed("hello still serves GET / 5 s after shutdown_service")

    await step("shutdown_service_hello", "shutdown_service", shutdown_hello)

    async def restart_hello(c: Any) -> Any:
        r = await c.start_service(kernel_id, "hello", {})
        check(isinstance(r, dict), f"start_service answered {r!r}, not a map")
        check(r.get("status") == "started", f"hello again: {r!r}, want status 'started'")
        body = await fetch_hello()
        check(body == "hello from a service-def\n", f"GET hello: {body!r}")
        return {"reply": r, "GET /": body}

    await step("start_service_hello_again", "start_service", restart_hello)


# ---------------------------------------------------------------------------------------------
# Retries: create_kernels again, restart_kernel with a partial config

# The keys of upstream's `create_kernels` reply (`AgentRPCServer.create_kernels`,
# ai/backend/agent/server.py): a retry must answer them as the first call did.
CREATION_RESULT_KEYS = (
    "id",
    "kernel_host",
    "repl_in_port",
    "repl_out_port",
    "stdin_port",
    "stdout_port",
    "service_ports",
    "container_id",
    "resource_spec",
    "attached_devices",
    "agent_addr",
    "scaling_group",
)


# The answer of one launcher call (`start_session` in `main`), per asyncio task.
ANSWER: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("ANSWER")


def same_creation_result(first: Any, again: Any, what: str) -> None:
    """`again` answers every kernel of `first` with the same `KernelCreationResult` keys."""
    check(isinstance(again, (list, tuple)), f"{what} answered {again!r}, not a list")
    check(len(again) == len(first), f"{what}: {len(again)} results for {len(first)} kernels")
    for a, b in zip(first, again, strict=True):
        for k in CREATION_RESULT_KEYS:
            check(k in b, f"{what}: no {k!r} in {b!r}")
            check(a[k] == b[k], f"{what}: {k} is {b[k]!r}, the first call answered {a[k]!r}")


async def ask_host(pause: str, **fields: Any) -> str:
    """Prints `{"pause": pause, ...}` and waits (at most 180 s) for the caller's one line."""
    print(json.dumps({"pause": pause, **fields}), flush=True)
    loop = asyncio.get_running_loop()
    reply = await asyncio.wait_for(loop.run_in_executor(None, sys.stdin.readline), 180)
    return reply.strip() or "no answer on stdin"


async def retries_steps(
    step: Any, start_session: Any, run_code: Any, poll_running: Any, ids: dict[str, Any]
) -> None:
    """After `create_kernels` (sent twice at once, the second joining the first):
    `create_kernels_again` through the launcher once the kernel runs, `one_container`,
    `restart_kernel_partial` and `check_running_after_restart`."""
    session_id, kernel_id = ids["session_id"], ids["kernel_id"]
    first = ids["created"]

    async def create_again(c: Any) -> Any:
        check(first is not None, "create_kernels answered nothing")
        again = await start_session()
        same_creation_result(first, again, "create_kernels again")
        running = await c.check_running(kernel_id)
        check(running is True, f"check_running answered {running!r} after the retry")
        return again

    await step("create_kernels_again", "create_kernels", create_again, timeout=120)

    answer = await ask_host("count_containers", kernel_id=str(kernel_id))
    emit(
        "one_container",
        answer == "1",
        value=answer,
        error=f"{answer} containers labelled with the kernel id, want 1",
    )

    mark = "kv-partial-42"

    async def restart_partial(c: Any) -> Any:
        # Only `environ` (all of it, as upstream's merge replaces the key whole): upstream's
        # agent merges `{**stored, **update}` (AbstractAgent.restart_kernel, agent.py).
        environ = {**ids["kernel_config"]["environ"], "KV_RESTART_MARK": mark}
        r = await c.restart_kernel(session_id, kernel_id, ids["image_ref"], {"environ": environ})
        check(isinstance(r, dict), f"restart_kernel answered {r!r}, not a map")
        old = first[0]["container_id"] if first else None
        check(
            r.get("container_id") not in (None, old),
            f"restart_kernel answered container {r.get('container_id')!r}, the old one was {old}",
        )
        return r

    await step("restart_kernel_partial", "restart_kernel", restart_partial, timeout=180)

    async def running_after_restart(c: Any) -> Any:
        r = await poll_running(c, "restart_kernel", "restart_kernel_partial" in FAILED)
        out = await run_code(c, "echo mark=$KV_RESTART_MARK")
        text = console_text(out["console"], "stdout")
        check(f"mark={mark}" in text, f"the updated environ is not seen: {out!r}")
        return {**r, "stdout": text}

    await step("check_running_after_restart", "check_running", running_after_restart, timeout=90)


# ---------------------------------------------------------------------------------------------
# The run


async def main(args: argparse.Namespace) -> int:
    import zmq.auth

    from ai.backend.common.clients.agent.client import AgentClient
    from ai.backend.common.docker import ImageRef
    from ai.backend.common.events.event_types.kernel.types import KernelLifecycleEventReason
    from ai.backend.common.types import (
        AccessKey,
        AgentId,
        AutoPullBehavior,
        ClusterMode,
        KernelId,
        ResourceSlot,
        SessionId,
        SessionTypes,
    )
    from ai.backend.manager.agent_cache import AgentRPCCache
    from ai.backend.manager.clients.agent import AgentClientPool, AgentPoolSpec
    from ai.backend.manager.defs import DEFAULT_ROLE
    from ai.backend.manager.sokovan.scheduler.launcher.launcher import (
        SessionLauncher,
        SessionLauncherArgs,
    )
    from ai.backend.manager.views.sokovan.image import ImageConfigData
    from ai.backend.manager.views.sokovan.lifecycle import (
        KernelBindingData,
        SessionDataForStart,
    )

    install_packb_recorder()

    manager_pub, manager_sec = zmq.auth.load_certificate(args.manager_keypair)
    agent_pub, _ = zmq.auth.load_certificate(args.agent_public_key)
    agent_id = AgentId(args.agent_id)
    session_id = SessionId(uuid.UUID(args.session_id) if args.session_id else uuid.uuid4())
    kernel_id = KernelId(uuid.UUID(args.kernel_id) if args.kernel_id else uuid.uuid4())
    print(
        json.dumps({"session_id": str(session_id), "kernel_id": str(kernel_id)}),
        flush=True,
    )

    # As the manager: the RPC cache (no database: `update` fills it), then the client pool with
    # the manager's spec (AgentClientPoolDependency) except `failure_threshold`, raised so that a
    # step timing out does not mark the connection unhealthy and hide the later steps' results.
    cache = AgentRPCCache(None, manager_pub, manager_sec)  # type: ignore[arg-type]
    cache.update(agent_id, args.addr, agent_pub)
    pool = AgentClientPool(
        cache,
        AgentPoolSpec(health_check_interval=30.0, failure_threshold=1000, recovery_timeout=60.0),
    )

    async def step(name: str, method: str, fn, timeout: float = 60.0) -> Any:
        if args.only is not None and name not in args.only:
            return None
        since = len(RECORDED)
        try:
            async with asyncio.timeout(timeout):
                async with pool.acquire(agent_id) as client:
                    value = await fn(client)
        except StepFailed as e:
            record_fixture(method, since)
            emit(name, False, error=str(e))
            return None
        except TimeoutError:
            record_fixture(method, since)
            emit(name, False, error=f"no reply within {timeout:.0f} s")
            return None
        except Exception as e:
            record_fixture(method, since)
            emit(name, False, error=describe(e))
            return None
        record_fixture(method, since)
        emit(name, True, value)
        return value if value is not None else True

    # -- ping, health, hwinfo ----------------------------------------------------------------

    async def ping(c: AgentClient) -> Any:
        r = await c.ping()
        check(r == "ping", f"ping answered {r!r}, upstream echoes 'ping'")
        return r

    await step("ping", "ping", ping)

    async def health(c: AgentClient) -> Any:
        r = await c.health()  # health_v2, validated into HealthResp
        return r.model_dump(mode="json")

    await step("health", "health_v2", health)

    async def hwinfo(c: AgentClient) -> Any:
        r = await c.gather_hwinfo()  # gather_hwinfo_v2, validated into GatherHwinfoResp
        return r.model_dump(mode="json")

    await step("gather_hwinfo", "gather_hwinfo_v2", hwinfo)

    # -- create_kernels, through the manager's own SessionLauncher ------------------------------

    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine(), platform.machine())
    image_id = uuid.uuid4()
    image_canonical = f"local/{args.image}"  # LocalRegistry names a local image `local/<repo>:<tag>`
    image_config_data = ImageConfigData(
        id=image_id,
        canonical=image_canonical,
        architecture=arch,
        project=None,
        is_local=True,
        digest=args.image_digest,
        labels=json.loads(args.image_labels) or {},
        registry_name="local",
        registry_url="http://localhost",  # the local registry's placeholder URL
        registry_username=None,
        registry_password=None,
    )
    kernel = KernelBindingData(
        kernel_id=kernel_id,
        agent_id=agent_id,
        agent_addr=args.addr,
        resource_group="default",
        image=image_canonical,
        image_id=image_id,
        architecture=arch,
        cluster_role=DEFAULT_ROLE,
        cluster_idx=1,
        local_rank=0,
        cluster_hostname=None,
        uid=None,
        main_gid=None,
        gids=[],
        requested_slots=ResourceSlot({
            "cpu": decimal.Decimal("1"),
            # The Python REPL (runner, Jupyter kernel) gets some room above its 256m minimum.
            "mem": decimal.Decimal("536870912" if args.scenario == "runner" else "268435456"),
        }),
        resource_opts={},
        bootstrap_script=None,
        startup_command=None,
        preopen_ports=[],
        internal_data=None,
        vfolder_mounts=[],
    )
    session = SessionDataForStart(
        session_id=session_id,
        creation_id="kvbaicompat",
        access_key=AccessKey("AKIAIOSFODNN7EXAMPLE"),
        session_type=SessionTypes.INTERACTIVE,
        name="kv-bai-compat",
        cluster_mode=ClusterMode.SINGLE_NODE,
        kernels=[kernel],
        user_uuid=uuid.uuid4(),
        user_email="admin@lablup.com",
        user_name="admin",
        environ={},
        network_type=None,  # VOLATILE, one kernel: no network to create
    )

    class StubRepository:
        """The scheduler repository's two calls on this path (no database)."""

        def __init__(self) -> None:
            self.error_info: Any = None

        async def update_session_error_info(self, _sid: Any, error_info: Any) -> None:
            self.error_info = error_info

        async def update_session_network_id(self, _sid: Any, _name: Any) -> None:
            return None

    class StubValkey:
        async def record_session_failed_agents(self, *_a: Any) -> None:
            return None

    config = types.SimpleNamespace(
        docker=types.SimpleNamespace(
            image=types.SimpleNamespace(auto_pull=types.SimpleNamespace(value="digest"))
        ),
        debug=types.SimpleNamespace(enabled=True),
    )
    repository = StubRepository()
    launcher = SessionLauncher(
        SessionLauncherArgs(
            repository=repository,  # type: ignore[arg-type]
            agent_client_pool=pool,
            network_plugin_ctx=None,  # type: ignore[arg-type]
            config_provider=types.SimpleNamespace(config=config),  # type: ignore[arg-type]
            valkey_schedule=StubValkey(),  # type: ignore[arg-type]
        )
    )

    # -- check_and_pull, as the launcher's prepare phase sends it (before create_kernels) -------

    async def check_and_pull(c: AgentClient) -> Any:
        # `SessionLauncher._trigger_image_pulling_for_sessions` converts the same way, then
        # gathers the replies with `return_exceptions=True` (dropping them): called directly here
        # so that the answer can be checked.
        image_config = image_config_data.to_image_config(AutoPullBehavior("digest"))
        r = await c.check_and_pull({image_canonical: image_config})
        check(
            isinstance(r, dict) and set(r) == {image_canonical},
            f"check_and_pull answered {r!r}, upstream maps each image to its bgtask id",
        )
        bgtask_id = r[image_canonical]
        check(
            isinstance(bgtask_id, str) and uuid.UUID(hex=bgtask_id).hex == bgtask_id,
            f"bgtask id {bgtask_id!r} is not a UUID's hex",
        )
        return r

    await step("check_and_pull", "check_and_pull", check_and_pull)

    def first_container_id(result: Any) -> Any:
        """`container_id` of the first `KernelCreationResult` of a create_kernels reply."""
        if isinstance(result, (list, tuple)) and result and isinstance(result[0], dict):
            return result[0].get("container_id")
        return None

    # Keep what the launcher passed and what came back (the launcher itself drops both).
    created: dict[str, Any] = {}
    real_create_kernels = AgentClient.create_kernels
    # `--scenario retries`: the launcher's configs held at the agent's container stage until
    # the caller creates the file (kernelvisor's test-only `_inject`), while `hold` is set.
    hold = {"on": args.scenario == "retries"}

    async def capturing_create_kernels(self: AgentClient, *a: Any, **kw: Any) -> Any:
        if hold["on"]:
            for config in a[2]:
                config["_inject"] = {"hold_before": ["container", args.hold_file]}
        created["args"] = a
        try:
            created["result"] = await real_create_kernels(self, *a, **kw)
            box = ANSWER.get(None)
            if box is not None:
                box["result"] = created["result"]
        except BaseException as e:
            created["error"] = e
            raise
        return created["result"]

    AgentClient.create_kernels = capturing_create_kernels  # type: ignore[method-assign]

    async def start_session() -> Any:
        """The launcher's `create_kernels` for the session; what the agent answered (the
        launcher drops it, and puts an error into the repository)."""
        answer: dict[str, Any] = {}
        # Each task its own: `capturing_create_kernels` puts the answer there.
        ANSWER.set(answer)
        repository.error_info = None
        await launcher._start_single_session(session, {image_id: image_config_data})
        check(repository.error_info is None, f"launcher error: {repository.error_info!r}")
        check("result" in answer, "the launcher did not call create_kernels")
        return answer["result"]

    async def joined_failed(_c: AgentClient) -> Any:
        raise StepFailed("create_kernels failed: nothing to compare")

    since = len(RECORDED)
    if args.scenario == "retries":
        # The launcher twice at once: whichever call reaches the agent second joins the first.
        calls = [asyncio.create_task(start_session()) for _ in range(2)]
        released = await ask_host("creates_sent", kernel_id=str(kernel_id))
        hold["on"] = False
        try:
            async with asyncio.timeout(180):
                answers = await asyncio.gather(*calls, return_exceptions=True)
        except TimeoutError as e:
            answers = [e, e]
        errors = [a for a in answers if isinstance(a, BaseException)]
        if released != "ok":
            created.setdefault("error", StepFailed(f"the caller answered {released!r}"))
        elif errors:
            created.setdefault("error", errors[0])
        else:
            created["result"] = answers[0]

            async def joined(_c: AgentClient) -> Any:
                same_creation_result(answers[0], answers[1], "the joined create_kernels")
                return answers[1]

            created["joined"] = joined
    else:
        try:
            async with asyncio.timeout(180):
                await launcher._start_single_session(session, {image_id: image_config_data})
        except Exception as e:
            created.setdefault("error", e)
    record_fixture("create_kernels", since)
    if "error" in created:
        emit("create_kernels", False, error=describe(created["error"]))
    elif "args" not in created:
        emit(
            "create_kernels",
            False,
            error=f"the launcher did not call create_kernels: {repository.error_info!r}",
        )
    elif repository.error_info is not None:
        emit("create_kernels", False, error=f"launcher error: {repository.error_info!r}")
    else:
        emit("create_kernels", True, created.get("result"))
        created["container_id"] = first_container_id(created.get("result"))
    if args.scenario == "retries":
        await step("create_kernels_joined", "-", created.get("joined") or joined_failed)
    if args.diagnose_without_pickles and "create_kernels" in FAILED and "args" in created:

        async def create_plain(c: AgentClient) -> Any:
            a = created["args"]
            r = await c._peer.call.create_kernels(
                str(a[0]), [str(k) for k in a[1]], *without_pickles(a[2:]), agent_id=agent_id
            )
            created["container_id"] = first_container_id(r)
            return r

        await step("create_kernels:without_pickles", "-", create_plain, timeout=180)

    kernel_configs = created.get("args", (None, None, [None]))[2]
    kernel_config = kernel_configs[0] if kernel_configs else None
    image_refs = created.get("args", (None,) * 5)[4] or {}
    image_ref = image_refs.get(kernel_id) or ImageRef.from_image_str(
        image_canonical, None, "local", architecture=arch, is_local=True
    )

    # -- check_running (poll: upstream's create answers once started, ours may answer earlier) --

    async def running(c: AgentClient) -> Any:
        return await poll_running(c, "create_kernels", failed("create_kernels"))

    def failed(name: str) -> bool:
        """Whether call `name` failed (and its diagnostic plain retry, if one ran, too)."""
        plain = f"{name}:without_pickles"
        return name in FAILED and (plain in FAILED or plain not in REPORTED)

    async def poll_running(c: AgentClient, after: str, failed: bool) -> Any:
        # Poll for up to 30 s after a call that succeeded; once after one that failed.
        polls = 1 if failed else 60
        for attempt in range(polls):
            r = await c.check_running(kernel_id)
            check(isinstance(r, bool), f"check_running answered {r!r}, not a bool")
            if r:
                return {"running": r, "polls": attempt + 1}
            if attempt + 1 < polls:
                await asyncio.sleep(0.5)
        raise StepFailed(f"check_running answered False after {after} ({polls} polls)")

    await step("check_running", "check_running", running, timeout=45)

    # -- running code (query mode, continued until finished) --------------------------------

    async def run_code(c: AgentClient, code: str, limit: int = 60) -> dict[str, Any]:
        """execute in query mode, then `continue` until `finished`, as the client SDK does
        through the manager (major API version 9, flush_timeout 2.0 as in SessionService)."""
        run_id = uuid.uuid4().hex
        replies: list[dict[str, Any]] = []
        r = await c.execute(session_id, kernel_id, 9, run_id, "query", code, {}, 2.0)
        replies.append(dict(r))
        while r.get("status") != "finished":
            status = r.get("status")
            check(
                status in ("continued", "build-finished", "clean-finished"),
                f"execute answered status {status!r}: {dict(r)!r}",
            )
            check(len(replies) < limit, f"no `finished` after {limit} replies")
            r = await c.execute(session_id, kernel_id, 9, run_id, "continue", "", {}, 2.0)
            replies.append(dict(r))
        console: list[Any] = []
        for rep in replies:
            console.extend(rep.get("console") or [])
        return {
            "run_id": run_id,
            "replies": len(replies),
            "statuses": [rep.get("status") for rep in replies],
            "run_ids": sorted({str(rep.get("runId")) for rep in replies}),
            "exitCode": replies[-1].get("exitCode"),
            "console": console,
        }

    def stdout_text(out: dict[str, Any]) -> str:
        return console_text(out["console"], "stdout")

    if args.scenario == "retries":
        # -- create_kernels again, restart_kernel with a partial config (retries_steps) -------

        await retries_steps(
            step,
            start_session,
            run_code,
            poll_running,
            {
                "session_id": session_id,
                "kernel_id": kernel_id,
                "created": created.get("result"),
                "kernel_config": kernel_config,
                "image_ref": image_ref,
            },
        )
    elif args.scenario == "runner":
        # -- a Python REPL through Backend.AI's kernel runner (runner_steps) ------------------

        await runner_steps(
            step,
            run_code,
            {"session_id": session_id, "kernel_id": kernel_id, "created": created.get("result")},
        )
    else:
        # -- remove the image's `find` (list_files must not need it) ---------------------------

        if args.host_hook:
            print(json.dumps({"pause": "remove_find", "kernel_id": str(kernel_id)}), flush=True)
            loop = asyncio.get_running_loop()
            reply = await asyncio.wait_for(loop.run_in_executor(None, sys.stdin.readline), 120)
            answer = reply.strip() or "no answer on stdin"
            emit("remove_find", answer == "ok", value=answer, error=answer)
        else:

            async def remove_find(c: AgentClient) -> Any:
                out = await run_code(c, "rm -f /bin/find; command -v find || echo no-find")
                check("no-find" in stdout_text(out), f"`find` is still there: {out!r}")
                return out

            await step("remove_find", "execute", remove_find)

        # -- execute with continuation -------------------------------------------------------------

        marker = "kv-bai-compat-42"

        async def execute(c: AgentClient) -> Any:
            # Longer than flush_timeout, so an agent that honours it answers `continued` first.
            out = await run_code(c, "echo started; sleep 3; echo kv-bai-compat-$((6*7))")
            text = stdout_text(out)
            check(marker in text, f"marker {marker!r} not in stdout {text!r}: {out!r}")
            check(out["exitCode"] == 0, f"exitCode {out['exitCode']!r}, want 0")
            check(out["run_ids"] == [out["run_id"]], f"runId {out['run_ids']} != {out['run_id']}")
            return out

        await step("execute", "execute", execute, timeout=90)

        # -- files ---------------------------------------------------------------------------------

        payload = b"kv-bai-compat upload \x00\x01\xff\n" * 64
        fname = "kv-bai-compat.bin"

        async def upload(c: AgentClient) -> Any:
            return await c.upload_file(kernel_id, fname, payload)

        await step("upload_file", "upload_file", upload)

        async def download(c: AgentClient) -> Any:
            r = await c.download_single(kernel_id, fname)
            check(isinstance(r, bytes), f"download_single answered {type(r).__name__}, not bytes")
            check(
                r == payload,
                f"downloaded {len(r)} bytes differ from the {len(payload)} uploaded",
            )
            return {"len": len(r)}

        await step("download_single", "download_single", download)

        async def list_files(c: AgentClient) -> Any:
            r = await c.list_files(kernel_id, ".")
            check(isinstance(r, dict), f"list_files answered {r!r}, not a map")
            check(
                {"files", "errors", "abspath"} <= set(r),
                f"list_files keys {sorted(r)}, upstream has files, errors, abspath",
            )
            check(
                isinstance(r["files"], str),
                f"`files` is {type(r['files']).__name__}, not JSON text",
            )
            files = json.loads(r["files"])
            names = [f.get("filename") for f in files]
            check(
                fname in names,
                f"{fname} not among the entries' `filename`s {names!r} (errors: {r['errors']!r})",
            )
            entry = next(f for f in files if f.get("filename") == fname)
            check(entry.get("size") == len(payload), f"entry {entry!r}: size != {len(payload)}")
            check(
                {"mode", "size", "mtime"} <= set(entry),
                f"entry {entry!r} lacks one of mode, size, mtime",
            )
            return r

        await step("list_files", "list_files", list_files)

        # -- logs, interrupt, registry sync, GPU map -----------------------------------------------

        async def get_logs(c: AgentClient) -> Any:
            r = await c.get_logs(kernel_id)
            check(
                isinstance(r, dict) and isinstance(r.get("logs"), str),
                f"get_logs answered {r!r}",
            )
            return r

        await step("get_logs", "get_logs", get_logs)

        async def interrupt(c: AgentClient) -> Any:
            return await c.interrupt_kernel(kernel_id)

        await step("interrupt_kernel", "interrupt_kernel", interrupt)

        async def sync_registry(c: AgentClient) -> Any:
            r = await c.sync_kernel_registry([(kernel_id, session_id)])
            check(r is None, f"sync_kernel_registry answered {r!r}, upstream answers None")
            still = await c.check_running(kernel_id)
            check(
                still is True,
                f"the listed kernel is no longer running (check_running {still!r})",
            )
            return r

        await step("sync_kernel_registry", "sync_kernel_registry", sync_registry)

        async def gpu_map(c: AgentClient) -> Any:
            r = await c.scan_gpu_alloc_map()
            check(isinstance(r, dict), f"scan_gpu_alloc_map answered {r!r}, not a map")
            check(
                all(isinstance(k, str) and isinstance(v, str) for k, v in r.items()),
                f"scan_gpu_alloc_map {r!r}: upstream's shape is flat, device id -> amount as text",
            )
            return r

        await step("scan_gpu_alloc_map", "scan_gpu_alloc_map", gpu_map)

        # -- images: commit, get_commit_status, push_image, purge_images (image_steps) -------------

        await image_steps(step, args, {"kernel_id": kernel_id, "agent_id": agent_id, "arch": arch})

        # -- restart (same kernel id, config as created) -------------------------------------------

        async def restart(c: AgentClient) -> Any:
            check(kernel_config is not None, "no kernel config (create_kernels was not called)")
            r = await c.restart_kernel(session_id, kernel_id, image_ref, kernel_config)
            return checked_restart_reply(r)

        def checked_restart_reply(r: Any) -> Any:
            # Upstream destroys the container and creates a new one for the same kernel id, and
            # answers its container_id, repl/stdin/stdout ports and service_ports.
            check(isinstance(r, dict), f"restart_kernel answered {r!r}, not a map")
            check("container_id" in r, f"restart_kernel answered {r!r}: no container_id")
            old = created.get("container_id")
            check(
                old is None or r["container_id"] != old,
                f"restart_kernel kept container {old} (upstream recreates the container)",
            )
            return r

        await step("restart_kernel", "restart_kernel", restart, timeout=180)
        if args.diagnose_without_pickles and "restart_kernel" in FAILED and kernel_config:

            async def restart_plain(c: AgentClient) -> Any:
                r = await c._peer.call.restart_kernel(
                    str(session_id),
                    str(kernel_id),
                    without_pickles(image_ref),
                    without_pickles(kernel_config),
                    agent_id=agent_id,
                )
                return checked_restart_reply(r)

            await step("restart_kernel:without_pickles", "-", restart_plain, timeout=180)

        async def running_after_restart(c: AgentClient) -> Any:
            r = await poll_running(c, "restart_kernel", failed("restart_kernel"))
            out = await run_code(c, "echo after-restart-$((6*7))")
            check("after-restart-42" in stdout_text(out), f"execute after restart: {out!r}")
            return {**r, "execute": out["statuses"]}

        await step(
            "check_running_after_restart", "check_running", running_after_restart, timeout=90
        )

    # -- destroy -----------------------------------------------------------------------------------

    async def destroy(c: AgentClient) -> Any:
        # As the terminator: the reason is the enum member, suppress_events False.
        return await c.destroy_kernel(
            kernel_id, session_id, KernelLifecycleEventReason.USER_REQUESTED, suppress_events=False
        )

    await step("destroy_kernel", "destroy_kernel", destroy, timeout=120)
    if args.diagnose_without_pickles and "destroy_kernel" in FAILED:

        async def destroy_plain(c: AgentClient) -> Any:
            return await c._peer.call.destroy_kernel(
                str(kernel_id),
                str(session_id),
                KernelLifecycleEventReason.USER_REQUESTED.value,
                suppress_events=False,
                agent_id=agent_id,
            )

        await step("destroy_kernel:without_pickles", "-", destroy_plain, timeout=120)

    async def not_running(c: AgentClient) -> Any:
        r = await c.check_running(kernel_id)
        check(r is False, f"check_running answered {r!r} after destroy_kernel, want False")
        return r

    await step("check_running_after_destroy", "check_running", not_running)

    await pool.close()
    if args.write_fixtures:
        write_fixtures(args.write_fixtures)
    print(json.dumps({"done": True, "failed": FAILED}), flush=True)
    return 1 if FAILED else 0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--addr", required=True, help="the agent's RPC address, tcp://HOST:PORT")
    p.add_argument("--agent-id", required=True)
    p.add_argument("--manager-keypair", required=True, help="manager.key_secret (ZeroMQ cert)")
    p.add_argument("--agent-public-key", required=True, help="agent.key (ZeroMQ cert)")
    p.add_argument("--session-id", default=None)
    p.add_argument("--kernel-id", default=None)
    p.add_argument("--image", default="kernelvisor-test:latest", help="a local image, repo:tag")
    p.add_argument("--image-digest", default="", help="the image's config digest (its Id)")
    p.add_argument("--image-labels", default="{}", help="the image's labels, JSON")
    p.add_argument("--host-hook", action="store_true")
    p.add_argument(
        "--scenario",
        default="lifecycle",
        choices=["lifecycle", "runner", "retries"],
        help="lifecycle (the default): files, logs, images, restart on a busybox kernel;\n"
        "runner: a Python REPL through Backend.AI's kernel runner (an image with upstream's\n"
        "labels, e.g. kernelvisor-test-py:latest), then destroy;\n"
        "retries: create_kernels sent again (joined, then answered running), restart_kernel\n"
        "with a partial config (needs --hold-file)",
    )
    p.add_argument(
        "--hold-file",
        default=None,
        metavar="PATH",
        help="retries: the file (a path on the agent's host) the first creation waits for",
    )
    p.add_argument(
        "--registry",
        default=None,
        metavar="HOST:PORT",
        help="a registry for commit/push_image (its password in $KV_REGISTRY_PASSWORD)",
    )
    p.add_argument("--registry-user", default=None)
    p.add_argument(
        "--only",
        default=None,
        type=lambda v: set(filter(None, v.split(","))),
        metavar="STEP,...",
        help="run only these steps (create_kernels, through the launcher, always runs), e.g.\n"
        "ping,check_running,destroy_kernel,check_running_after_destroy for one kernel's\n"
        "creation and destruction (tests/it/bai_events.rs)",
    )
    p.add_argument("--write-fixtures", default=None, metavar="DIR")
    p.add_argument(
        "--diagnose-without-pickles",
        action="store_true",
        help="when create_kernels / restart_kernel / destroy_kernel fail, call them again with\n"
        "their pickled values made plain (steps `<name>:without_pickles`), so the later steps\n"
        "show what else fails; the real calls' results still count",
    )
    return p.parse_args()


if __name__ == "__main__":
    ns = parse_args()
    try:
        code = asyncio.run(main(ns))
    except Exception as e:  # setup itself failed (imports, keys): one line saying so
        emit("setup", False, error=f"{describe(e)}\n{traceback.format_exc()}")
        code = 2
    sys.exit(code)
