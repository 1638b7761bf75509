"""The floor: a bare ``grpc.aio`` server that answers every call with its request.

It measures what Python gRPC alone costs per call on this machine, so Warden's
throughput can be read as a share of it. ``--processes N`` starts N servers on
one port with SO_REUSEPORT, as ``warden serve --processes`` does, so both share
the kernel's spreading of connections the same way; with one process per CPU,
each runs on a CPU of its own, as Warden's do (``warden_server/placement.py``).

``python -m benchmarks.peers.echo --port 50099 --processes 2``
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys

import grpc

from warden_server.placement import cpus_for, pin_to

SERVICE = "bench.Echo"
METHOD = "Echo"
PATH = f"/{SERVICE}/{METHOD}"


async def _echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return request


async def serve(port: int) -> None:
    """Serve the echo method on 127.0.0.1:``port`` until SIGTERM."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 1)])
    # No (de)serializers: the handler sees and returns the raw message bytes.
    handler = grpc.unary_unary_rpc_method_handler(_echo)
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler(SERVICE, {METHOD: handler})]
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(grace=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--cpu", type=int, help="the CPU to run on (a child's)")
    args = parser.parse_args()
    cpus = cpus_for(args.processes, pin=True)
    cpu = cpus[0] if cpus else args.cpu
    if cpu is not None:
        pin_to(cpu)
    # The first server runs here; the others are children, so the CPU of the
    # whole tree is this process and its descendants.
    children = [
        subprocess.Popen(
            [sys.executable, "-m", __spec__.name, "--port", str(args.port)]
            + (["--cpu", str(cpus[child])] if cpus else [])
        )
        for child in range(1, args.processes)
    ]
    try:
        asyncio.run(serve(args.port))
    finally:
        for child in children:
            child.terminate()
        for child in children:
            child.wait(timeout=10)


if __name__ == "__main__":
    main()
