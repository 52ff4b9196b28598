"""Tools that run inside brokerd: ``web_fetch``, ``clock_now`` and ``disk_usage``.

A handler writes its output into the ``CappedOutput`` it is given (so the cap holds for builtins
too) and raises ``ToolFailure`` with words for the model when it refuses or fails. The URL and
content-type rules of web_fetch are pure functions, tested on their own.
"""

import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import anyio
import httpx

from brokerd.tools import diskusage
from brokerd.tools.errors import ToolFailure
from brokerd.tools.inflate import EncodingRefused, inflater_for
from loopcommon.capture import CappedOutput

# What replaces web_fetch's network in tests; the rest of the broker names it by this alias, so
# that httpx stays inside the builtins that speak HTTP.
WebTransport = httpx.AsyncBaseTransport

TEXT_TYPES = frozenset(
    {"application/json", "application/xml", "application/javascript", "application/xhtml+xml"}
)
USER_AGENT = "brokerd-web-fetch/1"


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class BuiltinContext:
    """What builtin handlers may use besides their arguments."""

    web_fetch_allowlist: tuple[str, ...] = ()
    web_fetch_max_redirects: int = 5
    http_timeout_s: float = 30.0
    transport: httpx.AsyncBaseTransport | None = None
    clock: Callable[[], datetime] = field(default=_utc_now)


BuiltinHandler = Callable[[Mapping[str, Any], CappedOutput, BuiltinContext], Awaitable[None]]


def host_allowed(host: str, allowlist: Sequence[str]) -> bool:
    """An entry allows its own host and every subdomain of it (``example.org`` allows
    ``docs.example.org`` but not ``badexample.org``)."""
    host = host.lower().rstrip(".")
    for entry in allowlist:
        entry = entry.lower().rstrip(".")
        if host == entry or host.endswith("." + entry):
            return True
    return False


def url_problem(url: httpx.URL, allowlist: Sequence[str]) -> str | None:
    """Why web_fetch may not request ``url``, or None when it may."""
    if url.scheme not in ("http", "https"):
        return f"only http and https URLs can be fetched, not {url.scheme or 'a relative URL'!r}"
    if not url.host:
        return "the URL has no host"
    if not host_allowed(url.host, allowlist):
        allowed = ", ".join(allowlist) or "none"
        return f"host {url.host!r} is not on brokerd's web_fetch allowlist (allowed: {allowed})"
    return None


def is_text(content_type: str) -> bool:
    media_type = content_type.split(";", 1)[0].strip().lower()
    return (
        media_type.startswith("text/")
        or media_type in TEXT_TYPES
        or media_type.endswith(("+json", "+xml"))
    )


async def web_fetch(
    arguments: Mapping[str, Any], output: CappedOutput, context: BuiltinContext
) -> None:
    """GET a text page from an allowed host; redirects are followed only while they stay on the
    allowlist, and the body is read, and decoded (``brokerd.tools.inflate``), only up to the
    output cap."""
    try:
        url = httpx.URL(str(arguments["url"]))
    except httpx.InvalidURL as exc:
        raise ToolFailure(f"refused: the URL is not valid ({exc})") from exc
    async with httpx.AsyncClient(
        transport=context.transport,
        timeout=context.http_timeout_s,
        follow_redirects=False,
        trust_env=False,
        headers={
            "User-Agent": USER_AGENT,
            "Accept": "text/*, application/json;q=0.9",
            "Accept-Encoding": "identity",
        },
    ) as client:
        for _ in range(context.web_fetch_max_redirects + 1):
            problem = url_problem(url, context.web_fetch_allowlist)
            if problem is not None:
                raise ToolFailure(f"refused {str(url)!r}: {problem}")
            next_url = await _fetch_once(client, url, output)
            if next_url is None:
                return
            url = next_url
    raise ToolFailure(f"refused: more than {context.web_fetch_max_redirects} redirects")


async def _fetch_once(
    client: httpx.AsyncClient, url: httpx.URL, output: CappedOutput
) -> httpx.URL | None:
    """Fetch ``url`` into ``output``; returns where a redirect points instead, if it is one."""
    try:
        async with client.stream("GET", url) as response:
            location = response.headers.get("location")
            if response.is_redirect and location:
                return url.join(location)
            content_type = response.headers.get("content-type", "")
            if not is_text(content_type):
                raise ToolFailure(
                    f"refused: {url} answered {content_type or 'with no content type'!r}; "
                    "web_fetch returns text only"
                )
            output.encoding = response.charset_encoding or "utf-8"
            head = f"HTTP {response.status_code} {response.reason_phrase} ({content_type})\n\n"
            head_bytes = head.encode(output.encoding, errors="replace")
            # Read raw: httpx would inflate every stacked layer of a chunk at once, before
            # the cap. One more byte than the cap takes, so that the output knows it was cut.
            inflater = inflater_for(
                response.headers.get("content-encoding", ""),
                output.cap - output.held - len(head_bytes) + 1,
            )
            output.add(head_bytes)
            async for chunk in response.aiter_raw():
                if inflater is not None:
                    # Bounded, but still CPU work: off the event loop that serves the sockets.
                    chunk = await anyio.to_thread.run_sync(inflater.feed, chunk)
                if not output.add(chunk):
                    break
            return None
    except EncodingRefused as exc:
        raise ToolFailure(f"refused: {url}: {exc}") from None
    except zlib.error as exc:
        raise ToolFailure(f"could not fetch {url}: the page does not decode ({exc})") from None
    except httpx.HTTPError as exc:
        raise ToolFailure(f"could not fetch {url}: {type(exc).__name__}: {exc}") from exc


async def clock_now(
    arguments: Mapping[str, Any], output: CappedOutput, context: BuiltinContext
) -> None:
    """The current date and time, in UTC or an IANA time zone."""
    zone_name = str(arguments.get("timezone", "UTC"))
    try:
        zone = ZoneInfo(zone_name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ToolFailure(
            f"unknown time zone {zone_name!r} (use an IANA name such as Europe/Paris)"
        ) from exc
    now = context.clock().astimezone(zone)
    output.add(f"{now.isoformat(timespec='seconds')} ({now:%A}, {zone_name})".encode())


async def disk_usage(
    arguments: Mapping[str, Any], output: CappedOutput, context: BuiltinContext
) -> None:
    """The host's disk usage (see ``brokerd.tools.diskusage``)."""
    await diskusage.disk_usage(arguments, output, context)


BUILTINS: Mapping[str, BuiltinHandler] = {
    "web_fetch": web_fetch,
    "clock_now": clock_now,
    "disk_usage": disk_usage,
}
