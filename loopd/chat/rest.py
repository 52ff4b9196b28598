"""Mattermost's REST API, as loopd uses it, with retries in one place.

Retried: transport errors, 5xx and 429 (waiting ``Retry-After`` when given), for up to
``retry_for_s``. Never retried: other 4xx (the request itself is wrong) and cancellation. A
create is safe to retry because it carries a ``pending_post_id``: the server answers a retry
within 30 s with the post it already made.

Every post's text leaves loopd through ``create_post`` or ``patch_message``, and both show its
hidden characters (``loopcommon.sanitize.visible``: a right-to-left override or a zero-width space
reaches a reader as ``<U+202E>``, ``<U+200B>``) and defuse its mentions (``loopd.chat.mentions``):
an answer, a status post, a tool line, a refusal or a notice
that names ``@channel`` notifies nobody, and one that names a person notifies them only where the
thread's people asked for it (``mentionable``, which the threads keep up to date; a thread not
in it mentions nobody).

Every answer's body is read within a bound (``loopcommon.bodies``): an error's first
``ERROR_PREFIX_BYTES`` (then the connection is closed), any other answer up to
``max_answer_bytes`` (``ANSWER_MAX_BYTES``: a page of a thousand posts of Mattermost's largest
size fits), past which the call fails with one line.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Final

import httpx
from tenacity import AsyncRetrying, retry_if_exception

from loopcommon.backoff import Backoff
from loopcommon.bodies import ERROR_PREFIX_BYTES, error_text, read_at_most
from loopcommon.retry import retrying
from loopcommon.sanitize import visible
from loopd.chat.mentions import defuse
from loopd.chat.model import (
    Channel,
    FileInfo,
    Post,
    PostList,
    Team,
    User,
    WireFormatError,
)
from loopd.errors import LoopdError
from loopd.observe.metrics import METRICS

log = logging.getLogger("loopd.chat.rest")

SINCE_CAP = 1000  # GetPostsSince returns at most this many rows
PAGE = 200
ANSWER_MAX_BYTES: Final = 64 * 1024 * 1024


class MattermostError(LoopdError):
    """A Mattermost call failed for good (after retries, or a 4xx)."""

    def __init__(self, what: str, status: int | None, detail: str) -> None:
        where = f"answered {status}" if status is not None else "failed"
        super().__init__(f"Mattermost {what} {where}: {detail}")
        self.status = status
        self.detail = detail


class _Transient(Exception):
    """A failure worth retrying; carries the server's Retry-After, if any."""

    def __init__(self, detail: str, retry_after_s: float | None = None) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s


def api_client(base_url: str, token: str | None, timeout_s: float = 30.0) -> httpx.AsyncClient:
    """An httpx client for ``http(s)://host`` or ``unix:/path`` (the chat proxy)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if base_url.startswith("unix:"):
        transport = httpx.AsyncHTTPTransport(uds=base_url[len("unix:") :])
        return httpx.AsyncClient(
            transport=transport,
            base_url="http://localhost/api/v4",
            headers=headers,
            timeout=timeout_s,
        )
    return httpx.AsyncClient(base_url=f"{base_url}/api/v4", headers=headers, timeout=timeout_s)


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, _Transient)


def _retry_after_of(exc: BaseException) -> float | None:
    """The wait a 429 or 5xx asked for (``Retry-After``), if it did."""
    return exc.retry_after_s if isinstance(exc, _Transient) else None


class MattermostClient:
    """The REST calls the adapter makes."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        *,
        retry_for_s: float = 180.0,
        backoff_s: float = 0.5,
        backoff_cap_s: float = 30.0,
        max_answer_bytes: int = ANSWER_MAX_BYTES,
    ) -> None:
        self.http = http
        self.max_answer_bytes = max_answer_bytes
        # Per thread (root post id): the names its posts may mention (``loopd.chat.mentions``).
        self.mentionable: dict[str, frozenset[str]] = {}
        self.retry_for_s = retry_for_s
        # Jittered: the threads' calls that failed together do not all come back together.
        self.backoff = Backoff(first_s=backoff_s, cap_s=backoff_cap_s, jitter=0.5)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def call(
        self, method: str, path: str, what: str, *, retry_for_s: float | None = None, **kwargs: Any
    ) -> Any:
        """One API call, retried through transient failures (for ``retry_for_s``, the client's
        window by default; 0 for a single attempt); the decoded JSON answer."""
        status, body = await self._retried(method, path, what, retry_for_s, **kwargs)
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise MattermostError(what, status, "the answer is not JSON") from exc

    async def _retried(
        self, method: str, path: str, what: str, retry_for_s: float | None, **kwargs: Any
    ) -> tuple[int, bytes]:
        try:
            async for attempt in self._retrying(retry_for_s):
                with attempt:
                    return await self._once(method, path, what, **kwargs)
        except _Transient as exc:
            raise MattermostError(what, None, f"still failing after retries: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _retrying(self, retry_for_s: float | None) -> AsyncRetrying:
        """Transient failures tried again for ``retry_for_s`` (None: the client's window),
        after the server's ``Retry-After`` where it gave one."""
        return retrying(
            self.backoff,
            retry_if_exception(_transient),
            within_s=self.retry_for_s if retry_for_s is None else retry_for_s,
            told=_retry_after_of,
            before_sleep=lambda state: METRICS.retried("mattermost"),
        )

    async def _once(self, method: str, path: str, what: str, **kwargs: Any) -> tuple[int, bytes]:
        """One attempt: a 2xx answer's status and body, read within its bound."""
        try:
            async with self.http.stream(method, path, **kwargs) as response:
                status = response.status_code
                if status == 429 or status >= 500:
                    prefix, cut = await read_at_most(response, ERROR_PREFIX_BYTES)
                    log.warning("Mattermost %s answered %d; retrying", what, status)
                    detail = f"{status} {error_text(prefix, cut=cut, chars=200)}"
                    raise _Transient(detail, _retry_after(response))
                if status >= 400:
                    prefix, cut = await read_at_most(response, ERROR_PREFIX_BYTES)
                    raise MattermostError(what, status, _error_message(prefix, cut=cut))
                body, cut = await read_at_most(response, self.max_answer_bytes)
        except httpx.TransportError as exc:
            log.warning("Mattermost %s: %s", what, exc or type(exc).__name__)
            raise _Transient(f"{type(exc).__name__}: {exc}") from exc
        if cut:
            raise MattermostError(
                what,
                status,
                f"the answer passed {self.max_answer_bytes:,} bytes; it was not read on",
            )
        return status, body

    # -- typed calls -----------------------------------------------------------------------------

    async def me(self) -> User:
        return User.from_json(await self.call("GET", "/users/me", "GET /users/me"))

    async def user(self, user_id: str) -> User:
        return User.from_json(await self.call("GET", f"/users/{user_id}", "GET /users/{id}"))

    async def channel(self, channel_id: str) -> Channel:
        raw = await self.call("GET", f"/channels/{channel_id}", "GET /channels/{id}")
        return Channel.from_json(raw)

    async def my_channels(self) -> list[Channel]:
        raw = await self.call("GET", "/users/me/channels", "GET /users/me/channels")
        if not isinstance(raw, list):
            raise WireFormatError("channel list is not a list")
        return [Channel.from_json(item) for item in raw]

    async def my_teams(self) -> list[Team]:
        raw = await self.call("GET", "/users/me/teams", "GET /users/me/teams")
        if not isinstance(raw, list):
            raise WireFormatError("team list is not a list")
        return [Team(str(t.get("id", "")), str(t.get("name", ""))) for t in raw]

    async def max_post_size(self, default: int) -> int:
        raw = await self.call(
            "GET", "/config/client", "GET /config/client", params={"format": "old"}
        )
        try:
            return int(raw.get("MaxPostSize", default))
        except (AttributeError, ValueError):
            return default

    async def posts_since(self, channel_id: str, since_ms: int) -> list[Post]:
        """Posts created or changed after ``since_ms``, oldest change first; pages on at the
        1000-row cap.

        Paging anchors on the newest post the page *matched* (its ``order``), never on the whole
        ``posts`` map: that map also carries thread roots and, without ``skipFetchThreads``,
        whole threads, whose newest reply may lie far past the page; anchoring there skipped
        every post in between (tests/chat/test_chat_catchup.py)."""
        path = f"/channels/{channel_id}/posts"
        first = PostList.from_json(
            await self.call("GET", path, "GET posts since", params={"since": since_ms})
        )
        posts = dict(first.posts)
        matched = first.matched()
        if len(matched) < SINCE_CAP:
            return first.by_update()
        while matched:
            anchor = max(matched, key=lambda p: (p.create_at, p.id)).id
            params = {"after": anchor, "per_page": PAGE, "skipFetchThreads": "true"}
            page = PostList.from_json(
                await self.call("GET", path, "GET posts after", params=params)
            )
            posts.update(page.posts)
            matched = page.matched()
            if len(matched) < PAGE:
                break
        return sorted(posts.values(), key=lambda p: (p.update_at, p.id))

    async def thread(self, post_id: str) -> list[Post]:
        """The whole thread of ``post_id`` (root included), oldest first."""
        raw = await self.call("GET", f"/posts/{post_id}/thread", "GET thread")
        return PostList.from_json(raw).by_creation()

    async def channel_member_ids(self, channel_id: str) -> list[str]:
        """The user ids of a channel's members (one page: loopd asks this of group messages,
        which hold at most eight people)."""
        raw = await self.call(
            "GET",
            f"/channels/{channel_id}/members",
            "GET /channels/{id}/members",
            params={"page": 0, "per_page": PAGE},
        )
        if not isinstance(raw, list):
            raise WireFormatError("channel member list is not a list")
        return [str(m["user_id"]) for m in raw if isinstance(m, dict) and m.get("user_id")]

    async def typing(self, user_id: str, channel_id: str, parent_id: str) -> None:
        """The typing indicator; one attempt (the next one follows in seconds anyway)."""
        await self.call(
            "POST",
            f"/users/{user_id}/typing",
            "POST /users/{id}/typing",
            retry_for_s=0,
            json={"channel_id": channel_id, "parent_id": parent_id},
        )

    async def file_info(self, file_id: str) -> FileInfo:
        raw = await self.call("GET", f"/files/{file_id}/info", "GET /files/{id}/info")
        return FileInfo.from_json(raw)

    async def file_head(self, file_id: str, max_bytes: int) -> bytes:
        """A file's content, or its first ``max_bytes`` bytes and one more (so the caller can
        tell that it was cut) when it is longer."""
        what = "GET /files/{id}"
        try:
            async for attempt in self._retrying(None):
                with attempt:
                    return await self._head_once(f"/files/{file_id}", what, max_bytes)
        except _Transient as exc:
            raise MattermostError(what, None, f"still failing after retries: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def _head_once(self, path: str, what: str, max_bytes: int) -> bytes:
        try:
            async with self.http.stream("GET", path) as response:
                status = response.status_code
                if status == 429 or status >= 500:
                    raise _Transient(f"{status}", _retry_after(response))
                if status >= 400:
                    prefix, cut = await read_at_most(response, ERROR_PREFIX_BYTES)
                    raise MattermostError(what, status, _error_message(prefix, cut=cut))
                head = bytearray()
                async for chunk in response.aiter_bytes():
                    head += chunk
                    if len(head) > max_bytes:
                        break
                return bytes(head[: max_bytes + 1])
        except httpx.TransportError as exc:
            raise _Transient(f"{type(exc).__name__}: {exc}") from exc

    async def create_post(
        self,
        channel_id: str,
        message: str,
        *,
        root_id: str = "",
        props: dict[str, Any] | None = None,
        pending_post_id: str = "",
    ) -> Post:
        body = {
            "channel_id": channel_id,
            "root_id": root_id,
            "message": outgoing(message, self.mentionable.get(root_id, frozenset())),
            "props": props or {},
            "pending_post_id": pending_post_id,
        }
        return Post.from_json(await self.call("POST", "/posts", "POST /posts", json=body))

    async def patch_message(
        self, post_id: str, message: str, *, root_id: str, props: dict[str, Any] | None = None
    ) -> Post:
        """Edit a post's text in the thread of ``root_id``; ``props``, when given, replaces the
        whole props map."""
        keep = self.mentionable.get(root_id, frozenset())
        body: dict[str, Any] = {"message": outgoing(message, keep)}
        if props is not None:
            body["props"] = props
        raw = await self.call("PUT", f"/posts/{post_id}/patch", "PUT /posts/{id}/patch", json=body)
        return Post.from_json(raw)

    async def delete_post(self, post_id: str) -> None:
        await self.call("DELETE", f"/posts/{post_id}", "DELETE /posts/{id}")


def outgoing(message: str, keep: frozenset[str]) -> str:
    """A post's text as it leaves loopd: hidden characters shown, mentions defused but those of
    ``keep`` (text that already passed leaves unchanged)."""
    return defuse(visible(message), keep)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _error_message(prefix: bytes, *, cut: bool) -> str:
    """Mattermost's ``message`` from an error answer's first bytes, else their text."""
    try:
        body = json.loads(prefix)
    except (ValueError, RecursionError):
        return error_text(prefix, cut=cut, chars=200)
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])[:1000]
    return error_text(prefix, cut=cut, chars=200)
