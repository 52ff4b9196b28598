"""Mattermost's REST API, as loopd uses it, with retries in one place.

Retried: transport errors, 5xx and 429 (waiting ``Retry-After`` when given), for up to
``retry_for_s``. Never retried: other 4xx (the request itself is wrong) and cancellation. A
create is safe to retry because it carries a ``pending_post_id``: the server answers a retry
within 30 s with the post it already made.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_delay

from loopd.chat.model import Channel, Post, Team, User, WireFormatError, posts_of
from loopd.errors import LoopdError

log = logging.getLogger("loopd.chat.rest")

SINCE_CAP = 1000  # GetPostsSince returns at most this many rows
PAGE = 200


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


def _wait(base_s: float, cap_s: float) -> Any:
    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, _Transient) and exc.retry_after_s is not None:
            return min(exc.retry_after_s, cap_s)
        attempt = state.attempt_number
        delay: float = min(cap_s, base_s * 2 ** (attempt - 1))
        return delay * (0.5 + random.random() / 2)

    return wait


class MattermostClient:
    """The REST calls the adapter makes."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        *,
        retry_for_s: float = 180.0,
        backoff_s: float = 0.5,
        backoff_cap_s: float = 30.0,
    ) -> None:
        self.http = http
        self.retry_for_s = retry_for_s
        self.backoff_s = backoff_s
        self.backoff_cap_s = backoff_cap_s

    async def aclose(self) -> None:
        await self.http.aclose()

    async def call(self, method: str, path: str, what: str, **kwargs: Any) -> Any:
        """One API call, retried through transient failures; the decoded JSON answer."""
        retrying = AsyncRetrying(
            retry=retry_if_exception(lambda exc: isinstance(exc, _Transient)),
            wait=_wait(self.backoff_s, self.backoff_cap_s),
            stop=stop_after_delay(self.retry_for_s),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._once(method, path, what, **kwargs)
        except _Transient as exc:
            raise MattermostError(what, None, f"still failing after retries: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def _once(self, method: str, path: str, what: str, **kwargs: Any) -> Any:
        try:
            response = await self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            log.warning("Mattermost %s: %s", what, exc or type(exc).__name__)
            raise _Transient(f"{type(exc).__name__}: {exc}") from exc
        status = response.status_code
        if status == 429 or status >= 500:
            retry_after = _retry_after(response)
            log.warning("Mattermost %s answered %d; retrying", what, status)
            raise _Transient(f"{status} {response.text[:200]}", retry_after)
        if status >= 400:
            raise MattermostError(what, status, _error_message(response))
        try:
            return response.json()
        except ValueError as exc:
            raise MattermostError(what, status, "the answer is not JSON") from exc

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
        1000-row cap."""
        path = f"/channels/{channel_id}/posts"
        raw = await self.call("GET", path, "GET posts since", params={"since": since_ms})
        posts = posts_of(raw)
        if len(posts) < SINCE_CAP:
            return posts
        after = max(posts, key=lambda p: (p.create_at, p.id)).id
        while True:
            page = posts_of(
                await self.call(
                    "GET", path, "GET posts after", params={"after": after, "per_page": PAGE}
                )
            )
            posts.extend(page)
            if len(page) < PAGE:
                return sorted({p.id: p for p in posts}.values(), key=lambda p: (p.update_at, p.id))
            after = max(page, key=lambda p: (p.create_at, p.id)).id

    async def thread(self, post_id: str) -> list[Post]:
        return posts_of(await self.call("GET", f"/posts/{post_id}/thread", "GET thread"))

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
            "message": message,
            "props": props or {},
            "pending_post_id": pending_post_id,
        }
        return Post.from_json(await self.call("POST", "/posts", "POST /posts", json=body))

    async def patch_message(self, post_id: str, message: str) -> Post:
        raw = await self.call(
            "PUT", f"/posts/{post_id}/patch", "PUT /posts/{id}/patch", json={"message": message}
        )
        return Post.from_json(raw)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return response.text[:200]
