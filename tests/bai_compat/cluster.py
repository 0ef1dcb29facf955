"""Drives a single-node cluster session on a kernelvisor agent with the real Backend.AI agent client.

Runs inside the Debian trixie root of `scripts/bai-compat-env.sh` (Python 3.13, `backend.ai-manager`
26.9.6 at /opt/bai), as `driver.py` does (tests/it/cluster_kernels.rs):

    chroot $KV_BAI_ROOT /opt/bai/bin/python /path/in/root/cluster.py \
        --addr tcp://127.0.0.1:PORT --agent-id ID \
        --manager-keypair manager.key_secret --agent-public-key agent.key \
        --image REPO:TAG --image-digest sha256:... --image-labels JSON \
        --kernels N [--restart] [--ssh] [--host]

The session (`main1`, `sub1` .. `sub<N-1>`, single-node, network type VOLATILE) is started by the
manager's own `SessionLauncher._start_single_session`: it calls `create_local_network`
(`bai-singlenode-<session id>`) on the agent, makes the session's RSA keypair and builds the
`ClusterInfo` and every kernel's config and environment, then calls `create_kernels` once with all
kernels. The driver only records what the launcher sent.

Steps, each one JSON line `{"step", "ok", "value"|"error"}` (a failed step does not stop the run):
`create_session` (the network created, the `ClusterInfo` as the launcher built it, one result per
kernel, service ports: the image's only on main1), `check_running` (every kernel), then the pause
`{"pause": "created", "network", "kernels": {hostname: kernel id}}`: the caller inspects the engine
and answers one line on stdin (`ok`, or what is wrong: step `host_created`).
`--ssh`: from main1, through `execute` (batch mode: the runner's shell): `getent_hosts` (`getent hosts
sub<N-1>` resolves), `ssh_sub1` (`ssh -o BatchMode=yes sub1 hostname` prints `sub1`: no password,
no prompt), `cluster_env` (`BACKENDAI_CLUSTER_HOSTS` and `..._REPLICAS` as the launcher set them).
`--agent-restart`: the pause `restart_agent` (the caller kills the agent process and starts it
again; step `agent_restarted`), then `check_running_after_agent_restart`.
`--restart`: `restart_kernel` of sub1 (the manager's arguments, no config update), then
`restart_kernel_updated` (an updated `environ`: upstream merges it over the stored config and
makes the container anew), each until `check_running`; `getent_after_restart` (main1 resolves
sub1 still), then the pause `restarted` (step `host_restarted`).
Then `destroy_kernels` (every kernel, as the terminator does) and `destroy_local_network` (as the
manager's `_destroy_network` hook does for a single-node session); with `--restart` also
`create_without_network` (the launcher's `create_kernels` again for a new kernel, its network gone:
refused with `ContainerCreationFailedError`); then the pause `destroyed` (step `host_destroyed`:
no container, no network left).
`--host`: the session's network type is HOST: no network is made, the launcher asks the agent for
an sshd port per kernel (`assign_port`, `cluster_ssh_port_mapping` keyed `node-<kernel id>`), and
`--ssh` reaches the peers by those names (`/etc/hosts` and the runner's ssh config from
`port-mapping.json`); no `destroy_local_network`.
"""

from __future__ import annotations

import argparse
import asyncio
import decimal
import json
import platform
import sys
import traceback
import types
import uuid
from typing import Any

FAILED: list[str] = []


def emit(step: str, ok: bool, value: Any = None, error: str | None = None) -> None:
    line: dict[str, Any] = {"step": step, "ok": ok}
    if ok:
        line["value"] = json.loads(json.dumps(value, default=repr))
    else:
        FAILED.append(step)
        line["error"] = (error or "")[:2000]
    print(json.dumps(line), flush=True)


def describe(e: BaseException) -> str:
    name = getattr(e, "name", None)
    rep = getattr(e, "repr", None)
    if isinstance(name, str) and isinstance(rep, str):
        return f"{type(e).__name__}: {name}: {rep}"
    return f"{type(e).__name__}: {str(e) or repr(e)}"


class StepFailed(Exception):
    pass


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise StepFailed(msg)


async def ask_host(pause: str, **fields: Any) -> str:
    """Prints a pause line and waits for the caller's one-line answer."""
    print(json.dumps({"pause": pause, **fields}), flush=True)
    line = await asyncio.to_thread(sys.stdin.readline)
    return line.strip()


async def main(args: argparse.Namespace) -> int:
    import zmq.auth

    from ai.backend.common.clients.agent.client import AgentClient
    from ai.backend.common.events.event_types.kernel.types import KernelLifecycleEventReason
    from ai.backend.common.types import (
        AccessKey,
        AgentId,
        ClusterMode,
        KernelId,
        ResourceSlot,
        SessionId,
        SessionTypes,
    )
    from ai.backend.manager.agent_cache import AgentRPCCache
    from ai.backend.manager.clients.agent import AgentClientPool, AgentPoolSpec
    from ai.backend.manager.models.network import NetworkType
    from ai.backend.manager.sokovan.scheduler.launcher.launcher import (
        SessionLauncher,
        SessionLauncherArgs,
    )
    from ai.backend.manager.views.sokovan.image import ImageConfigData
    from ai.backend.manager.views.sokovan.lifecycle import KernelBindingData, SessionDataForStart

    manager_pub, manager_sec = zmq.auth.load_certificate(args.manager_keypair)
    agent_pub, _ = zmq.auth.load_certificate(args.agent_public_key)
    agent_id = AgentId(args.agent_id)
    session_id = SessionId(uuid.uuid4())
    cache = AgentRPCCache(None, manager_pub, manager_sec)  # type: ignore[arg-type]
    cache.update(agent_id, args.addr, agent_pub)
    pool = AgentClientPool(
        cache,
        AgentPoolSpec(health_check_interval=30.0, failure_threshold=1000, recovery_timeout=60.0),
    )

    async def step(name: str, fn: Any, timeout: float = 60.0) -> Any:
        try:
            async with asyncio.timeout(timeout):
                async with pool.acquire(agent_id) as client:
                    value = await fn(client)
        except StepFailed as e:
            emit(name, False, error=str(e))
            return None
        except TimeoutError:
            emit(name, False, error=f"no reply within {timeout:.0f} s")
            return None
        except Exception as e:
            emit(name, False, error=describe(e))
            return None
        emit(name, True, value)
        return value if value is not None else True

    async def host_step(name: str, pause: str, **fields: Any) -> None:
        answer = await ask_host(pause, **fields)
        if answer == "ok":
            emit(name, True, "ok")
        else:
            emit(name, False, error=answer)

    # -- the session, as the scheduler hands it to the launcher ----------------------------------

    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine(), platform.machine())
    image_id = uuid.uuid4()
    image_canonical = f"local/{args.image}"
    image_config_data = ImageConfigData(
        id=image_id,
        canonical=image_canonical,
        architecture=arch,
        project=None,
        is_local=True,
        digest=args.image_digest,
        labels=json.loads(args.image_labels) or {},
        registry_name="local",
        registry_url="http://localhost",
        registry_username=None,
        registry_password=None,
    )
    roles = [("main", 1)] + [("sub", i) for i in range(1, args.kernels)]
    kernels = [
        KernelBindingData(
            kernel_id=KernelId(uuid.uuid4()),
            agent_id=agent_id,
            agent_addr=args.addr,
            resource_group="default",
            image=image_canonical,
            image_id=image_id,
            architecture=arch,
            cluster_role=role,
            cluster_idx=idx,
            local_rank=rank,
            cluster_hostname=None,
            uid=None,
            main_gid=None,
            gids=[],
            # Half a core each: N kernels on the test host's two.
            requested_slots=ResourceSlot({
                "cpu": decimal.Decimal("0.5"),
                "mem": decimal.Decimal("536870912"),
            }),
            resource_opts={},
            bootstrap_script=None,
            startup_command=None,
            preopen_ports=[],
            internal_data=None,
            vfolder_mounts=[],
        )
        for rank, (role, idx) in enumerate(roles)
    ]
    hostnames = {f"{role}{idx}": k.kernel_id for (role, idx), k in zip(roles, kernels)}
    session = SessionDataForStart(
        session_id=session_id,
        creation_id="kvcluster",
        access_key=AccessKey("AKIAIOSFODNN7EXAMPLE"),
        session_type=SessionTypes.INTERACTIVE,
        name="kv-cluster",
        cluster_mode=ClusterMode.SINGLE_NODE,
        kernels=kernels,
        user_uuid=uuid.uuid4(),
        user_email="admin@lablup.com",
        user_name="admin",
        environ={},
        # VOLATILE: a single-node network for more than one kernel; HOST: the host's network,
        # an sshd port assigned on the agent for each kernel.
        network_type=NetworkType.HOST if args.host else None,
    )

    class StubRepository:
        def __init__(self) -> None:
            self.error_info: Any = None
            self.network_name: Any = None

        async def update_session_error_info(self, _sid: Any, error_info: Any) -> None:
            self.error_info = error_info

        async def update_session_network_id(self, _sid: Any, name: Any) -> None:
            self.network_name = name

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

    # What the launcher sends, recorded on the way.
    sent: dict[str, Any] = {"networks": []}
    real_create_kernels = AgentClient.create_kernels
    real_create_local_network = AgentClient.create_local_network

    async def recording_create_kernels(self: AgentClient, *a: Any, **kw: Any) -> Any:
        sent["create_kernels"] = a
        sent["result"] = await real_create_kernels(self, *a, **kw)
        return sent["result"]

    async def recording_create_local_network(self: AgentClient, name: str) -> None:
        sent["networks"].append(name)
        await real_create_local_network(self, name)

    AgentClient.create_kernels = recording_create_kernels  # type: ignore[method-assign]
    AgentClient.create_local_network = recording_create_local_network  # type: ignore[method-assign]

    network = "host" if args.host else f"bai-singlenode-{session_id}"

    async def create_session(_c: AgentClient) -> Any:
        await launcher._start_single_session(session, {image_id: image_config_data})
        check(repository.error_info is None, f"launcher error: {repository.error_info!r}")
        want_networks = [] if args.host else [network]
        check(sent["networks"] == want_networks, f"create_local_network calls: {sent['networks']}")
        check(repository.network_name == network, f"network id {repository.network_name!r}")
        check("result" in sent, "the launcher did not call create_kernels")
        _sid, kernel_ids, configs, cluster_info, _refs = sent["create_kernels"]
        check(len(kernel_ids) == args.kernels, f"{len(kernel_ids)} kernel ids")
        want_config = (
            {"mode": "host"} if args.host else {"mode": "bridge", "network_name": network}
        )
        check(
            cluster_info["network_config"] == want_config,
            f"network_config {cluster_info['network_config']!r}",
        )
        mapping = cluster_info["cluster_ssh_port_mapping"]
        if args.host:
            # The launcher's keys (`node-<kernel id>`), each an `assign_port` of the agent.
            want_keys = {f"node-{k.kernel_id}" for k in kernels}
            check(
                mapping is not None and set(mapping) == want_keys,
                f"cluster_ssh_port_mapping {mapping!r}",
            )
        else:
            check(mapping is None, f"cluster_ssh_port_mapping {mapping!r}")
        check(cluster_info["size"] == args.kernels, f"size {cluster_info['size']!r}")
        pair = cluster_info["ssh_keypair"]
        check(
            pair["public_key"].startswith("ssh-rsa ")
            and "PRIVATE KEY" in pair["private_key"],
            "ssh_keypair is not the launcher's RSA pair",
        )
        result = sent["result"]
        check(len(result) == args.kernels, f"{len(result)} results for {args.kernels} kernels")
        by_id = {str(r["id"]): r for r in result}
        ports = {
            host: sorted(p["name"] for p in by_id[str(kid)]["service_ports"])
            for host, kid in hostnames.items()
        }
        return {
            "network": network,
            "cluster_info": {
                "mode": str(cluster_info["mode"]),
                "size": cluster_info["size"],
                "replicas": dict(cluster_info["replicas"]),
                "network_config": dict(cluster_info["network_config"]),
                "public_key": pair["public_key"],
            },
            "hostnames": {
                str(c["kernel_id"]): c["cluster_hostname"] for c in configs
            },
            "service_ports": ports,
            "port_mapping": {k: list(v) for k, v in (mapping or {}).items()},
        }

    created = await step("create_session", create_session, timeout=240)

    async def all_running(c: AgentClient) -> Any:
        polls: dict[str, int] = {}
        for host, kid in hostnames.items():
            for attempt in range(120):
                if await c.check_running(kid):
                    polls[host] = attempt + 1
                    break
                await asyncio.sleep(0.5)
            else:
                raise StepFailed(f"{host} ({kid}) not running after 60 s")
        return polls

    await step("check_running", all_running, timeout=90)
    await host_step(
        "host_created",
        "created",
        network=network,
        mode="host" if args.host else "bridge",
        port_mapping=(created or {}).get("port_mapping", {}) if isinstance(created, dict) else {},
        kernels={h: str(k) for h, k in hostnames.items()},
        public_key=(created or {}).get("cluster_info", {}).get("public_key", "")
        if isinstance(created, dict)
        else "",
    )

    # -- from main1, through the runner's shell --------------------------------------------------

    main_id = hostnames["main1"]

    async def run_sh(c: AgentClient, cmd: str) -> str:
        """`execute` in batch mode with `opts.exec` (the runner runs `cmd` through a shell),
        continued until finished; its stdout (an exit code other than 0 fails the step). Batch
        mode rather than a query: the runner disables query mode for the kernel's life when its
        Jupyter kernel is not ready within 10 s (ai/backend/kernel/base.py), which a loaded
        machine sees, and every query then answers exit 127."""
        run_id = uuid.uuid4().hex
        console: list[Any] = []
        r = await c.execute(session_id, main_id, 9, run_id, "batch", "", {"exec": cmd}, 2.0)
        for _ in range(120):
            console.extend(r.get("console") or [])
            if r.get("status") == "finished":
                break
            r = await c.execute(session_id, main_id, 9, run_id, "continue", "", {}, 2.0)
        check(r.get("status") == "finished", f"no finished reply: {dict(r)!r}")
        text = "".join(str(item[1]) for item in console if item and item[0] == "stdout")
        err = "".join(str(item[1]) for item in console if item and item[0] == "stderr")
        check(r.get("exitCode") == 0, f"exit {r.get('exitCode')}: {text!r} {err[-500:]!r}")
        return text

    last_sub = f"sub{args.kernels - 1}"

    def peer(host: str) -> str:
        """The name a kernel reaches `host` by: its alias on the session's network, or on the
        host's network its `/etc/hosts` and ssh config name (the launcher's
        `node-<kernel id>`)."""
        return f"node-{hostnames[host]}" if args.host else host

    async def getent(c: AgentClient, host: str) -> Any:
        line = (await run_sh(c, f"getent hosts {host}")).strip()
        check(host in line.split(), f"getent hosts {host}: {line!r}")
        return line

    if args.ssh:
        await step("getent_hosts", lambda c: getent(c, peer(last_sub)), timeout=60)

        async def ssh_sub1(c: AgentClient) -> Any:
            out = await run_sh(
                c,
                f"ssh -o BatchMode=yes -o ConnectTimeout=20 {peer('sub1')} hostname </dev/null",
            )
            check(out.strip() == "sub1", f"ssh sub1 hostname: {out!r}")
            return {"stdout": out.strip()}

        await step("ssh_sub1", ssh_sub1, timeout=90)

        async def cluster_env(c: AgentClient) -> Any:
            out = await run_sh(
                c,
                'echo "$BACKENDAI_CLUSTER_HOSTS $BACKENDAI_CLUSTER_REPLICAS $BACKENDAI_CLUSTER_HOST"',
            )
            hosts = ",".join(hostnames)
            want = f"{hosts} main:1,sub:{args.kernels - 1} main1"
            check(out.strip() == want, f"environment {out.strip()!r}, want {want!r}")
            return out.strip()

        await step("cluster_env", cluster_env)

    if args.agent_restart:
        # The caller kills the agent process (SIGKILL: a crash) and starts it again; its
        # kernels run on, and what it kept of the cluster must still be applied below.
        await host_step("agent_restarted", "restart_agent")

        async def running_after_agent_restart(c: AgentClient) -> Any:
            for attempt in range(120):
                if all([await c.check_running(k) for k in hostnames.values()]):
                    return attempt + 1
                await asyncio.sleep(0.5)
            raise StepFailed("the kernels are not all running after the agent's restart")

        await step("check_running_after_agent_restart", running_after_agent_restart, timeout=90)

    if args.restart:
        sub1 = hostnames["sub1"]
        _sid, _ids, configs, _info, image_refs = sent.get("create_kernels", (None,) * 5)
        image_refs = image_refs or {}
        sub1_config = next((c for c in configs or [] if c["kernel_id"] == str(sub1)), {})

        async def restart(c: AgentClient, update: dict[str, Any]) -> Any:
            r = await c.restart_kernel(session_id, sub1, image_refs[sub1], update)
            check(isinstance(r, dict) and r.get("container_id"), f"restart answered {r!r}")
            for attempt in range(120):
                if await c.check_running(sub1):
                    return {"container_id": r["container_id"], "polls": attempt + 1}
                await asyncio.sleep(0.5)
            raise StepFailed("sub1 not running after its restart")

        # As the manager's `restart_session` sends it (no update), then with an updated
        # environment (merged over the stored config: a container made anew).
        await step("restart_kernel", lambda c: restart(c, {}), timeout=180)
        environ = {**sub1_config.get("environ", {}), "KV_RESTARTED": "1"}
        await step(
            "restart_kernel_updated", lambda c: restart(c, {"environ": environ}), timeout=180
        )
        await step("getent_after_restart", lambda c: getent(c, "sub1"), timeout=60)
        await host_step("host_restarted", "restarted", kernel_id=str(sub1))

    # -- teardown, as the terminator and the status hook do ------------------------------------

    async def destroy_all(c: AgentClient) -> Any:
        for kid in hostnames.values():
            await c.destroy_kernel(
                kid, session_id, KernelLifecycleEventReason.USER_REQUESTED, suppress_events=False
            )
        return len(hostnames)

    await step("destroy_kernels", destroy_all, timeout=180)

    async def destroy_network(c: AgentClient) -> Any:
        await c.destroy_local_network(network)
        return network

    if not args.host:
        await step("destroy_local_network", destroy_network)

    if args.restart:
        # The launcher's call again for one new kernel, its network gone: refused by name as
        # upstream's agent refuses it (the engine's `network ... not found`).
        async def without_network(c: AgentClient) -> Any:
            check("create_kernels" in sent, "no create_kernels to send again")
            sid, _ids, configs, cluster_info, refs = sent["create_kernels"]
            kid = KernelId(uuid.uuid4())
            config = {**configs[0], "kernel_id": str(kid)}
            try:
                r = await c.create_kernels(sid, [kid], [config], cluster_info, {
                    kid: next(iter(refs.values()))
                })
            except Exception as e:
                name = getattr(e, "name", None)
                check(name == "ContainerCreationFailedError", f"refused with {describe(e)}")
                check(network in str(getattr(e, "repr", "")), f"the error names no network: {e!r}")
                return describe(e)
            raise StepFailed(f"created without its network: {r!r}")

        await step("create_without_network", without_network, timeout=120)
    await host_step(
        "host_destroyed",
        "destroyed",
        # The host's network is not the session's to remove.
        network=None if args.host else network,
        session_id=str(session_id),
    )

    await pool.close()
    print(json.dumps({"done": True, "failed": FAILED}), flush=True)
    return 1 if FAILED else 0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--addr", required=True)
    p.add_argument("--agent-id", required=True)
    p.add_argument("--manager-keypair", required=True)
    p.add_argument("--agent-public-key", required=True)
    p.add_argument("--image", required=True)
    p.add_argument("--image-digest", default="")
    p.add_argument("--image-labels", default="{}")
    p.add_argument("--kernels", type=int, default=2)
    p.add_argument("--restart", action="store_true")
    p.add_argument("--agent-restart", action="store_true", help="pause `restart_agent` first")
    p.add_argument("--ssh", action="store_true")
    p.add_argument("--host", action="store_true", help="network type HOST instead of VOLATILE")
    return p.parse_args()


if __name__ == "__main__":
    ns = parse_args()
    try:
        code = asyncio.run(main(ns))
    except Exception as e:
        emit("setup", False, error=f"{describe(e)}\n{traceback.format_exc()}")
        code = 2
    sys.exit(code)
