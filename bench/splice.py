"""``python -m bench.splice LISTEN UPSTREAM``: a byte relay between two Unix sockets, the floor
of what any relay on asyncio costs per streamed token (``bench.relay`` sets brokerd beside it).

No HTTP is parsed and nothing is checked: each connection accepted on ``LISTEN`` gets one to
``UPSTREAM``, and what either side sends is written to the other from the protocol's own
callback (no task wakes for it). It writes ``listening`` once it accepts connections.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence


class _Half(asyncio.Protocol):
    """One side of a relayed connection: what it receives goes to ``peer``."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: asyncio.Transport | None = None
        self.early: list[bytes] = []  # received before the other side was connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.peer is None:
            self.early.append(data)
        else:
            self.peer.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None:
            self.peer.close()


class _Accepted(_Half):
    def __init__(self, upstream: str) -> None:
        super().__init__()
        self.upstream = upstream

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        assert self.transport is not None
        far, half = await asyncio.get_running_loop().create_unix_connection(_Half, self.upstream)
        half.peer, self.peer = self.transport, far
        for data in self.early:
            far.write(data)


async def serve(listen: str, upstream: str) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_unix_server(lambda: _Accepted(upstream), listen)
    sys.stdout.write("listening\n")
    sys.stdout.flush()
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> int:
    listen, upstream = sys.argv[1:] if argv is None else argv
    asyncio.run(serve(listen, upstream))
    return 0


if __name__ == "__main__":
    sys.exit(main())
