"""The transport towards llama-server: one httpx client over TCP or a Unix socket.

It knows HTTP and the server's error envelope, nothing about turns. Every foreign error becomes
loopd's own (``loopd.errors``) inside this module, with the URL the operator configured named in
the message and the original kept as ``__cause__``: a call, the wait for a streamed answer's status
line, and each read of its body run under ``_mapped`` (as httpx's own transports run their byte
iterators under ``map_httpcore_exceptions``; a chunk's read inlines it), so nothing above the
client sees httpx.

A streamed answer is a ``ChatStream``: its body as chunks of bytes, or, wrapped in an
``EventStream``, as batches of typed events.

Every read of a body is bounded in bytes (``loopcommon.bodies``): an error answer is read up to
``ERROR_PREFIX_BYTES`` (enough for the server's envelope) and the connection closed; a small
call's answer, and a streamed answer read whole, up to ``ANSWER_MAX_BYTES`` (far above a
``/slots`` or ``/props``); a stream's unfinished event up to the SSE decoder's bound
(``loopd.wire.sse``). A server that sends more gets one line saying so, not loopd's memory.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, Protocol

import anyio
import httpx

from loopcommon.bodies import ERROR_PREFIX_BYTES, error_text, read_at_most
from loopcommon.transport import AsyncioTransport
from loopd.engine.liveness import slot_busy
from loopd.engine.modelstate import ModelReading, ModelStatus, read_reading
from loopd.engine.quiet import Purpose, router_params
from loopd.engine.thinkcap import control_answer
from loopd.errors import (
    ConnectionDropped,
    InferenceError,
    ServerRejected,
    ServerUnreachable,
    StreamBroken,
    StreamCut,
)
from loopd.requestscope import inference_hooks
from loopd.wire.events import EventDecoder, StreamEvent

CHAT_PATH = "/v1/chat/completions"
CONTROL_PATH = "/v1/chat/completions/control"
# A save or restore writes or reads the whole state: far more than a small call's wait.
SLOT_FILE_WAIT_S = 120.0
ANSWER_MAX_BYTES: Final = 16 * 1024 * 1024  # a whole answer read at once (/slots, /props, ...)


@dataclass(frozen=True)
class SlotFile:
    """The server's answer of success to a save or a restore (``loopd.engine.durable``)."""

    filename: str
    n_tokens: int  # saved or restored
    n_bytes: int
    ms: float


def make_async_client(url: str, connect_s: float) -> httpx.AsyncClient:
    """An httpx client for ``http(s)://host:port`` or ``unix:/path``.

    Reads have no httpx timeout: the turn engine owns the first-byte and silence limits, which
    differ by phase and which a single read timeout cannot express.

    Connections are not kept alive: the router sometimes closes a kept-alive connection after
    proxying a stream without saying so, and the next request on it fails with "Server
    disconnected without sending a response" (measured on build 11434). A fresh connection per
    request costs nothing on a Unix socket or loopback, and a request that then fails that way
    means the server really hung up.
    """
    timeout = httpx.Timeout(connect=connect_s, read=None, write=connect_s, pool=connect_s)
    limits = httpx.Limits(max_keepalive_connections=0)
    uds = url[len("unix:") :] if url.startswith("unix:") else None
    return httpx.AsyncClient(
        transport=AsyncioTransport(limits=limits, uds=uds),
        base_url="http://llama-server" if uds is not None else url,
        timeout=timeout,
        # Bodies are read as sent (``aiter_raw``), so that what is bounded is what arrives.
        headers={"Accept-Encoding": "identity"},
        event_hooks=inference_hooks(),
    )


def error_message(body: bytes, *, cut: bool = False) -> tuple[str, str]:
    """(message, type) from the server's ``{"error": {...}}`` envelope, or the raw text;
    ``cut``: ``body`` is the first bytes of a longer answer (``error_text`` says so)."""
    try:
        obj = json.loads(body)
        err = obj["error"]
        return str(err.get("message", "")), str(err.get("type", ""))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return error_text(body, cut=cut), ""


class _Stage(Enum):
    CALL = "call"  # a small call, answered whole (/health, /slots, the control call)
    SEND = "send"  # a streamed request, until its status line
    READ = "read"  # the body of a streamed answer


@contextmanager
def _mapped(url: str, stage: _Stage) -> Iterator[None]:
    """Every httpx error raised inside becomes loopd's own (``raise ... from``)."""
    try:
        yield
    except httpx.HTTPError as exc:
        raise _translated(exc, url, stage) from exc


def _translated(exc: httpx.HTTPError, url: str, stage: _Stage) -> InferenceError:
    reason = str(exc) or type(exc).__name__
    if stage is _Stage.READ:
        return StreamCut(f"the connection to {url} broke mid-stream: {reason}")
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return ServerUnreachable(url, reason)
    if stage is _Stage.SEND:
        # Connected, then closed unanswered: the server died while the request waited.
        return StreamBroken(
            f"llama-server at {url} closed the connection before answering: {reason}"
        )
    if isinstance(exc, httpx.RemoteProtocolError):
        return ConnectionDropped(url, reason)
    if isinstance(exc, httpx.TransportError):
        return ServerUnreachable(url, reason)
    return InferenceError(f"llama-server at {url} sent an answer that could not be read: {reason}")


class ByteReceiver(Protocol):
    async def receive(self) -> bytes:
        """The next chunk; ``anyio.EndOfStream`` at the end."""
        ...


class ChatStream:
    """A chat answer as it streams in (a ``ByteReceiver``). Read it by ``receive``,
    ``aiter_raw`` or ``aread``; each raises loopd's errors only (``StreamCut`` when the
    connection breaks)."""

    def __init__(self, response: httpx.Response, url: str) -> None:
        self.status_code = response.status_code
        self._response = response
        self._url = url
        self._chunks: AsyncIterator[bytes] | None = None

    async def receive(self) -> bytes:
        if self._chunks is None:
            self._chunks = self._response.aiter_raw()
        try:  # ``_mapped`` by hand: a context manager per chunk is a cost per token
            chunk = await anext(self._chunks, None)
        except httpx.HTTPError as exc:
            raise _translated(exc, self._url, _Stage.READ) from exc
        if chunk is None:
            raise anyio.EndOfStream
        return chunk

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        while True:
            try:
                yield await self.receive()
            except anyio.EndOfStream:
                return

    async def aread(self) -> bytes:
        """The whole body, up to ``ANSWER_MAX_BYTES`` (``StreamBroken`` past it)."""
        with _mapped(self._url, _Stage.READ):
            body, cut = await read_at_most(self._response, ANSWER_MAX_BYTES)
        if cut:
            raise StreamBroken(
                f"the answer from {self._url} passed {ANSWER_MAX_BYTES:,} bytes; it was closed"
            )
        return body

    async def error_prefix(self) -> tuple[bytes, bool]:
        """The first ``ERROR_PREFIX_BYTES`` of an error answer, and whether there was more."""
        with _mapped(self._url, _Stage.READ):
            return await read_at_most(self._response, ERROR_PREFIX_BYTES)


class EventStream:
    """A byte stream's typed events, one chunk's worth at a time: ``EventDecoder`` wrapped as a
    stream, as anyio's ``TextReceiveStream`` wraps a codec decoder."""

    def __init__(self, chunks: ByteReceiver) -> None:
        self._chunks = chunks
        self._decoder = EventDecoder()
        self.at_end = False  # the last batch has been received

    async def receive(self) -> list[StreamEvent]:
        """The events of the next chunk (maybe none). At the end of the body: what the decoder
        still held, with ``at_end`` set; after that ``anyio.EndOfStream``."""
        if self.at_end:
            raise anyio.EndOfStream
        try:
            chunk = await self._chunks.receive()
        except anyio.EndOfStream:
            self.at_end = True
            return self._decoder.flush()
        return self._decoder.feed(chunk)


class InferenceClient:
    """Calls to one llama-server (or brokerd's inference proxy in front of it)."""

    def __init__(self, url: str, model: str, *, connect_s: float = 5.0) -> None:
        self.url = url
        self.model = model
        self.connect_s = connect_s
        self._http = make_async_client(url, connect_s)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> InferenceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _call(
        self,
        method: str,
        path: str,
        wait_s: float,
        *,
        params: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
    ) -> tuple[int, bytes]:
        """A small call: its status and its body, bounded (``read_at_most``): an error's first
        ``ERROR_PREFIX_BYTES``, an answer up to ``ANSWER_MAX_BYTES`` (``ServerRejected`` past
        it)."""
        with _mapped(self.url, _Stage.CALL):
            request = self._http.build_request(
                method, path, params=params, json=body, timeout=wait_s
            )
            response = await self._http.send(request, stream=True)
            try:
                status = response.status_code
                limit = ANSWER_MAX_BYTES if status == 200 else ERROR_PREFIX_BYTES
                content, cut = await read_at_most(response, limit)
            finally:
                await response.aclose()
        if status != 200:
            message, kind = error_message(content, cut=cut)
            raise ServerRejected(self.url, status, message, kind)
        if cut:
            raise ServerRejected(
                self.url, 200, f"{path} answered more than {limit:,} bytes; the answer was dropped"
            )
        return status, content

    async def _get_json(self, path: str, params: dict[str, str], wait_s: float) -> Any:
        _, content = await self._call("GET", path, wait_s, params=params)
        return self._json(content, path)

    def _json(self, content: bytes, path: str) -> Any:
        try:
            return json.loads(content)
        except (ValueError, RecursionError) as exc:
            raise ServerRejected(self.url, 200, f"{path} answered non-JSON") from exc

    async def health(self, wait_s: float | None = None) -> bool:
        """True when ``/health`` answers 200 (the router's own health in router mode); its body
        is not read."""
        with _mapped(self.url, _Stage.CALL):
            request = self._http.build_request("GET", "/health", timeout=wait_s or self.connect_s)
            response = await self._http.send(request, stream=True)
            await response.aclose()
        return response.status_code == 200

    async def slots(self, wait_s: float | None = None) -> list[dict[str, Any]]:
        """``GET /slots?model=`` without autoload: polling must never load a model. It wakes a
        sleeping one (``loopd.engine.quiet``): only a person's turn and background work on an
        awake model ask it."""
        data = await self._get_json(
            "/slots", {"model": self.model, "autoload": "false"}, wait_s or self.connect_s
        )
        if not isinstance(data, list):
            raise ServerRejected(self.url, 200, "/slots answered something other than a list")
        return [s for s in data if isinstance(s, dict)]

    async def slot_busy(self, slot: int, wait_s: float | None = None) -> bool:
        """Whether ``/slots`` shows ``slot`` processing a request (anyone's)."""
        return slot_busy(await self.slots(wait_s), slot)

    async def props(
        self, wait_s: float | None = None, *, purpose: Purpose = Purpose.PERSON
    ) -> dict[str, Any]:
        """``GET /props?model=``; a router loads the model for it only where a person waits
        (``loopd.engine.quiet``: elsewhere ``autoload=false``, and a model not loaded is
        ServerRejected 400)."""
        params = {"model": self.model, **router_params(purpose)}
        data = await self._get_json("/props", params, wait_s or self.connect_s)
        if not isinstance(data, dict):
            raise ServerRejected(self.url, 200, "/props answered something other than an object")
        return data

    async def router_props(self, wait_s: float | None = None) -> dict[str, Any]:
        """``GET /props`` without a model: a router's own answer (its ``role``, how many models
        it holds, whether it loads one on demand); a single-model server's ``/props``."""
        data = await self._get_json("/props", {}, wait_s or self.connect_s)
        return data if isinstance(data, dict) else {}

    async def models(self, wait_s: float | None = None) -> dict[str, Any]:
        data = await self._get_json("/models", {}, wait_s or self.connect_s)
        return data if isinstance(data, dict) else {}

    async def model_reading(
        self, wait_s: float | None = None, *, purpose: Purpose = Purpose.CHECK
    ) -> ModelReading:
        """The model's state, start and weights (``loopd.engine.modelstate``): ``/props`` and
        then ``/models``, neither of which wakes a sleeping model; ``/props`` loads one not
        loaded only where a person waits (``purpose``: the weights are reported only while the
        model is loaded). A server that answers neither gives a reading of status ``UNKNOWN``
        that says why."""
        try:
            props: dict[str, Any] | None = await self.props(wait_s, purpose=purpose)
        except ServerRejected as exc:
            if exc.status != 400:  # 400: not loaded, which /models says
                return ModelReading(ModelStatus.UNKNOWN, detail=f"GET /props failed: {exc}")
            props = None
        except InferenceError as exc:
            return ModelReading(ModelStatus.UNKNOWN, detail=f"GET /props failed: {exc}")
        try:
            models: dict[str, Any] | None = await self.models(wait_s)
        except InferenceError as exc:
            return ModelReading(ModelStatus.UNKNOWN, detail=f"GET /models failed: {exc}")
        return read_reading(models, props, self.model)

    async def post_json(self, path: str, body: dict[str, Any], wait_s: float) -> Any:
        _, content = await self._call("POST", path, wait_s, body=body)
        return self._json(content, path)

    async def control_reasoning_end(self, completion_id: str) -> dict[str, Any]:
        """Ask the server to end the running completion's thinking (``loopd.engine.thinkcap``)."""
        body = {"id": completion_id, "action": "reasoning_end", "model": self.model}
        data = await self.post_json(CONTROL_PATH, body, self.connect_s)
        return data if isinstance(data, dict) else {}

    async def end_reasoning(self, completion_id: str | None) -> str:
        """The control call for a running completion, its answer in a word
        (``thinkcap.control_answer``): what the engine's cap and the self-test's stream probe
        record. A call that fails is that answer, not an error."""
        if completion_id is None:
            return "no completion id in the stream"
        try:
            return control_answer(await self.control_reasoning_end(completion_id))
        except InferenceError as exc:
            return f"control call failed: {exc}"

    async def save_slot(self, slot: int, filename: str) -> SlotFile:
        """``POST /slots/{slot}?action=save``; ServerRejected unless the server answered success
        (only then does the file hold a whole state)."""
        return await self._slot_file(slot, "save", filename, "n_saved", "n_written", "save_ms")

    async def restore_slot(self, slot: int, filename: str) -> SlotFile:
        """``POST /slots/{slot}?action=restore``; ServerRejected when the server refused it (it
        then cleared the slot)."""
        return await self._slot_file(
            slot, "restore", filename, "n_restored", "n_read", "restore_ms"
        )

    async def _slot_file(
        self, slot: int, action: str, filename: str, tokens: str, size: str, took: str
    ) -> SlotFile:
        path = f"/slots/{slot}"
        body = {"filename": filename, "model": self.model}
        _, content = await self._call(
            "POST", path, SLOT_FILE_WAIT_S, params={"action": action}, body=body
        )
        data = self._json(content, path)
        try:
            timings = data.get("timings") or {}
            return SlotFile(
                filename=str(data.get("filename", filename)),
                n_tokens=int(data[tokens]),
                n_bytes=int(data.get(size, 0)),
                ms=float(timings.get(took, 0.0)),
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ServerRejected(self.url, 200, f"{path} {action} answered {data!r}") from exc

    @asynccontextmanager
    async def stream_chat(self, body: bytes) -> AsyncIterator[ChatStream]:
        """POST a chat request and yield its answer once the status line arrived.

        Entering blocks until the server sends the status line, which for a request queued behind
        another on its slot is only when the slot frees (``loopd.engine.liveness``). Errors raised
        before a slot starts arrive as plain JSON with a 4xx/5xx status: ServerRejected. A
        connection that could not be made is ServerUnreachable; one the server closed before
        answering (it died while the request waited) is StreamBroken.
        """
        with _mapped(self.url, _Stage.SEND):
            request = self._http.build_request(
                "POST", CHAT_PATH, content=body, headers={"Content-Type": "application/json"}
            )
            response = await self._http.send(request, stream=True)
        answer = ChatStream(response, self.url)
        try:
            if response.status_code != 200:
                prefix, cut = await answer.error_prefix()
                message, kind = error_message(prefix, cut=cut)
                raise ServerRejected(self.url, response.status_code, message, kind)
            yield answer
        finally:
            # Closing the connection is what cancels generation on the server (measured by
            # test_l_closing_the_stream_frees_the_slot_within_a_second in tests/contract/), so it
            # must happen even when the request is being cancelled.
            with (
                anyio.CancelScope(shield=True),
                anyio.move_on_after(self.connect_s),
                _mapped(self.url, _Stage.READ),
            ):
                await response.aclose()
