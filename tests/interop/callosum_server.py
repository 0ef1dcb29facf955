"""A stock callosum 1.0 server for kernelvisor's AgentPool to call.

Usage: callosum_server.py PORT [--keypair SERVER.key_secret --client-key MANAGER.key]
Methods: ping(msg) → msg; add(a, b) → a + b; fail() raises ValueError; slow(secs) sleeps.
Prints "READY" once bound; serves until killed.
"""

import argparse
import asyncio
import signal

import msgpack
import zmq.auth
from callosum.auth import AbstractServerAuthenticator, AuthResult, Identity
from callosum.lower.zeromq import ZeroMQAddress, ZeroMQRPCTransport
from callosum.rpc import Peer


class ServerAuth(AbstractServerAuthenticator):
    def __init__(self, public: bytes, secret: bytes, allowed: bytes) -> None:
        self.public, self.secret, self.allowed = public, secret, allowed

    async def server_identity(self) -> Identity:
        return Identity("local", self.secret)

    async def check_client(self, creds) -> AuthResult:
        ok = creds.public_key == self.allowed
        return AuthResult(success=ok, user_id="manager" if ok else None)

    async def server_public_key(self) -> bytes:
        return self.public


def body(request):
    return request.body["args"], request.body["kwargs"]


async def ping(request):
    args, kwargs = body(request)
    return args[0] if args else kwargs["msg"]


async def add(request):
    args, _ = body(request)
    return args[0] + args[1]


async def fail(request):
    raise ValueError("deliberate failure")


async def slow(request):
    args, _ = body(request)
    await asyncio.sleep(args[0])
    return "done"


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--keypair")
    ap.add_argument("--client-key")
    args = ap.parse_args()
    auth = None
    if args.keypair:
        public, secret = zmq.auth.load_certificate(args.keypair)
        allowed, _ = zmq.auth.load_certificate(args.client_key)
        auth = ServerAuth(public, secret, allowed)
    peer = Peer(
        bind=ZeroMQAddress(f"tcp://127.0.0.1:{args.port}"),
        transport=ZeroMQRPCTransport,
        authenticator=auth,
        serializer=lambda o: msgpack.packb(o, use_bin_type=True),
        deserializer=lambda b: msgpack.unpackb(b, raw=False),
    )
    for name, fn in [("ping", ping), ("add", add), ("fail", fail), ("slow", slow)]:
        peer.handle_function(name, fn)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with peer:
        print("READY", flush=True)
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
