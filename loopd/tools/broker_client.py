"""loopd's side of brokerd's tool broker: ``find_tool`` and ``call_tool`` over ``broker.sock``.

Both return the text to append as the tool result. When brokerd cannot be reached, or answers
with an error, the text says so and the turn goes on: nothing here raises for a broker problem
(cancellation still propagates, as it must). The exchange itself runs under ``_mapped``, which
turns every httpx error into loopd's own (``BrokerUnreachable``, ``BrokerCallError``); the wording
for the model is decided from those, in one place (``_post``).
"""

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType

import httpx

from loopd.errors import BrokerCallError, BrokerUnreachable
from loopd.requestscope import broker_hooks

UNIX_PREFIX = "unix:"
# The host name is never resolved over a Unix socket; it only fills the Host header.
UNIX_BASE_URL = "http://brokerd"
DEFAULT_TIMEOUT = httpx.Timeout(connect=5.0, read=600.0, write=30.0, pool=5.0)


@contextmanager
def _mapped(url: str) -> Iterator[None]:
    """Every httpx error raised inside becomes loopd's own (``raise ... from``)."""
    try:
        yield
    except httpx.ConnectError as exc:
        raise BrokerUnreachable(f"cannot connect to {url}: {exc}") from exc
    except httpx.HTTPError as exc:
        raise BrokerCallError(f"{type(exc).__name__}: {exc}") from exc


@dataclass(frozen=True)
class BrokerAnswer:
    """A call_tool answer: the result text, and brokerd's approval id when the call waits for a
    person (``loopd.approvals``; the id never goes into the text the model reads)."""

    text: str
    approval_id: str | None = None
    description: str = ""  # of the tool, with an approval id: what the person is shown


class BrokerClient:
    """Client of the tool broker at ``url``: ``unix:/path/to/broker.sock`` or ``http://host:port``."""

    def __init__(
        self,
        url: str,
        *,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url
        if url.startswith(UNIX_PREFIX):
            transport = transport or httpx.AsyncHTTPTransport(uds=url[len(UNIX_PREFIX) :])
            base_url = UNIX_BASE_URL
        else:
            base_url = url
        self._http = httpx.AsyncClient(
            base_url=base_url,
            transport=transport,
            timeout=timeout,
            trust_env=False,
            event_hooks=broker_hooks(),  # the request id in the headers (loopd.observe)
        )

    async def __aenter__(self) -> "BrokerClient":
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def find_tool(self, session: str, query: str) -> str:
        """The broker's find_tool result text for ``query``."""
        return await self._post(
            "/v1/find_tool", {"session": session, "query": query}, what="find_tool"
        )

    async def call_tool(self, session: str, call_id: str, name: str, arguments: str) -> str:
        """The result text of calling tool ``name``; ``arguments`` is the model's text as is.

        ``call_id`` is the model's tool call id: the broker runs one id once, so retrying after a
        failure here is safe.
        """
        return (await self.call_tool_answer(session, call_id, name, arguments)).text

    async def call_tool_answer(
        self,
        session: str,
        call_id: str,
        name: str,
        arguments: str,
        approval: Mapping[str, str] | None = None,
    ) -> BrokerAnswer:
        """``call_tool``'s answer with brokerd's approval id; ``approval`` is a person's
        decision on this call, sent again (``loopd.approvals``)."""
        body: dict[str, object] = {
            "session": session,
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
        }
        if approval is not None:
            body["approval"] = dict(approval)
        what = f"call_tool {name!r}"
        try:
            status, content = await self._exchange("/v1/call_tool", body)
        except (BrokerUnreachable, BrokerCallError) as exc:
            return BrokerAnswer(unreachable_text(what, exc))
        text = result_text(status, content, what)
        if not 200 <= status < 300 or (approval_id := approval_id_of(content)) is None:
            return BrokerAnswer(text)
        return BrokerAnswer(text, approval_id, description_of(content))

    async def _post(self, path: str, body: dict[str, str], *, what: str) -> str:
        try:
            status, content = await self._exchange(path, body)
        except (BrokerUnreachable, BrokerCallError) as exc:
            return unreachable_text(what, exc)
        return result_text(status, content, what)

    async def _exchange(self, path: str, body: Mapping[str, object]) -> tuple[int, bytes]:
        """The broker's status and body (read whole)."""
        with _mapped(self.url):
            response = await self._http.post(path, json=body)
        return response.status_code, response.content


def unreachable_text(what: str, exc: BrokerUnreachable | BrokerCallError) -> str:
    if isinstance(exc, BrokerUnreachable):
        return (
            f"{what} is unavailable: brokerd is not running ({exc}). Nothing was run. "
            "Carry on without it, or try again later."
        )
    return (
        f"{what}: brokerd did not answer ({exc}). If this was a tool call it may or may "
        "not have taken effect."
    )


def approval_id_of(content: bytes) -> str | None:
    """brokerd's approval id in an answer whose status is ``needs_approval``."""
    try:
        payload = json.loads(content)
    except ValueError:
        return None
    if not isinstance(payload, dict) or payload.get("status") != "needs_approval":
        return None
    approval_id = payload.get("approval_id")
    return approval_id if isinstance(approval_id, str) and approval_id else None


def description_of(content: bytes) -> str:
    """The tool's description in an answer whose status is ``needs_approval`` ("" if none)."""
    payload = json.loads(content)  # an approval id was read from it
    description = payload.get("description")
    return description if isinstance(description, str) else ""


def result_text(status: int, content: bytes, what: str) -> str:
    """The tool result text of the broker's answer: its ``result``, or what went wrong."""
    try:
        payload = json.loads(content)
    except ValueError:  # not JSON, or not UTF-8 (UnicodeDecodeError is a ValueError)
        payload = None
    result = payload.get("result") if isinstance(payload, dict) else None
    if 200 <= status < 300 and isinstance(result, str):
        return result
    message = payload.get("error") if isinstance(payload, dict) else None
    detail = message if isinstance(message, str) else content.decode("utf-8", "replace")[:500]
    return f"{what}: brokerd answered HTTP {status}: {detail}"
