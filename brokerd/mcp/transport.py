"""The stdio transport of a confined MCP server: the SDK's streams over a sandboxed process.

The SDK's own stdio client starts the program bare and reads lines of any length. This one
starts it through ``brokerd.confine`` (bubblewrap, limits, a clean environment, the whole tree
killed at the end) and bounds what the server can make brokerd hold: a message longer than
``max_message_bytes`` stops the server (its calls fail, and it is restarted like a crashed one),
and of its stderr only the last few lines are kept, to say why it stopped.
"""

import collections
import logging
import subprocess
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from types import TracebackType
from typing import Final

import anyio
import mcp_types as types
from anyio.abc import ByteReceiveStream, Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client._transport import TransportStreams
from mcp.shared.message import SessionMessage

from loopcommon.sandbox import kill_group

logger = logging.getLogger(__name__)

READ_CHUNK: Final = 64 * 1024
STDERR_LINES: Final = 5
STDERR_LINE_CHARS: Final = 300
EXIT_GRACE_S: Final = 2.0
REAP_GRACE_S: Final = 5.0


class ConfinedStdio:
    """An SDK ``Transport``: the streams of one run of ``argv`` (already a sandbox command line).

    ``ended`` is set when the server's output ends (it exited, crashed or was stopped), and
    ``reason`` then says how, with its last stderr line.
    """

    def __init__(self, name: str, argv: Sequence[str], *, max_message_bytes: int) -> None:
        self.name = name
        self.argv = list(argv)
        self.max_message_bytes = max_message_bytes
        self.ended = anyio.Event()
        self.reason = ""
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._context: AbstractAsyncContextManager[TransportStreams] | None = None

    async def __aenter__(self) -> TransportStreams:
        self._context = self._run()
        return await self._context.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        assert self._context is not None
        return await self._context.__aexit__(exc_type, exc, traceback)

    def stderr_tail(self) -> str:
        return self._stderr[-1] if self._stderr else ""

    @asynccontextmanager
    async def _run(self) -> AsyncIterator[TransportStreams]:
        process = await anyio.open_process(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={},
            cwd="/",
            start_new_session=True,
        )
        incoming_send, incoming = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        outgoing, outgoing_receive = anyio.create_memory_object_stream[SessionMessage](0)
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._read_stdout, process, incoming_send)
                group.start_soon(self._write_stdin, process, outgoing_receive)
                group.start_soon(self._read_stderr, process)
                try:
                    yield incoming, outgoing
                finally:
                    with anyio.CancelScope(shield=True):
                        await self._stop(process)
                    group.cancel_scope.cancel()
        finally:
            for stream in (incoming, incoming_send, outgoing, outgoing_receive):
                stream.close()

    async def _read_stdout(
        self, process: Process, send: MemoryObjectSendStream[SessionMessage | Exception]
    ) -> None:
        assert process.stdout is not None
        buffer = bytearray()
        try:
            async with send:
                while True:
                    try:
                        chunk = await process.stdout.receive(READ_CHUNK)
                    except (
                        anyio.EndOfStream,
                        anyio.ClosedResourceError,
                        anyio.BrokenResourceError,
                    ):
                        break
                    buffer += chunk
                    while (end := buffer.find(b"\n")) >= 0:
                        line = bytes(buffer[:end])
                        del buffer[: end + 1]
                        if line.strip():
                            await send.send(parse_message(line))
                    if len(buffer) > self.max_message_bytes:
                        self._end(f"sent a message over {self.max_message_bytes} bytes")
                        kill_group(process.pid)
                        break
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the session is gone: brokerd is stopping this server
        finally:
            self._end(await _exit_description(process))

    async def _write_stdin(
        self, process: Process, receive: MemoryObjectReceiveStream[SessionMessage]
    ) -> None:
        assert process.stdin is not None
        try:
            async with receive:
                async for message in receive:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(text.encode() + b"\n")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            self._end("stopped reading its input")

    async def _read_stderr(self, process: Process) -> None:
        assert process.stderr is not None
        async for line in _lines(process.stderr, STDERR_LINE_CHARS):
            if line.strip():
                self._stderr.append(line)
                logger.debug("mcp server %s: %s", self.name, line)

    def _end(self, reason: str) -> None:
        if not self.ended.is_set():
            tail = self.stderr_tail()
            self.reason = f"{reason} (its last words: {tail})" if tail else reason
            self.ended.set()

    async def _stop(self, process: Process) -> None:
        """Close its input, give it a moment to exit, then kill the whole sandbox."""
        if process.stdin is not None:
            with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                await process.stdin.aclose()
        with anyio.move_on_after(EXIT_GRACE_S):
            await process.wait()
        kill_group(process.pid)  # what a clean exit left behind dies too (the group leader is gone)
        with anyio.move_on_after(REAP_GRACE_S):
            await process.aclose()


def parse_message(line: bytes) -> SessionMessage | Exception:
    """One line of the server's output; what is not a JSON-RPC message goes to the session as
    the error it is (the SDK logs it and carries on)."""
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc


async def _exit_description(process: Process) -> str:
    with anyio.move_on_after(EXIT_GRACE_S, shield=True):
        await process.wait()
    status = process.returncode
    if status is None:
        return "closed its output"
    if status < 0:
        return f"was killed by signal {-status}"
    return f"exited with status {status}"


async def _lines(stream: ByteReceiveStream, max_chars: int) -> AsyncIterator[str]:
    """Lines of ``stream``, each cut to ``max_chars``; a partial line never grows past that."""
    pending = bytearray()
    while True:
        try:
            chunk = await stream.receive(READ_CHUNK)
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            break
        *complete, rest = (pending + chunk).split(b"\n")
        for line in complete:
            yield line[:max_chars].decode("utf-8", errors="replace")
        pending = bytearray(rest[:max_chars])
    if pending:
        yield pending.decode("utf-8", errors="replace")
