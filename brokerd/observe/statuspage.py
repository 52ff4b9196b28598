"""loopd's status page as brokerd serves it: rendered by brokerd from loopd's status data.

The box writes the folder loopd's socket is in, so the page it serves may be anyone's markup,
and a Content-Security-Policy does not stop all of it: Chromium follows a ``<meta
http-equiv="refresh">`` to another site under ``default-src 'none'``. So brokerd never relays the
box's HTML: it reads ``/status.json``, checks it against the page's data types, and renders the
page with the shared renderer (``loopcommon.statuspage``), which escapes every string. The box's
bytes reach the browser as text only. (The relay's policy adds ``sandbox`` besides, which stops
meta refreshes and scripts in the page whatever it holds; the page's own refresh is the
``Refresh`` header.)

The types bound the data (``loopcommon.statuspage``: slots, live turns, sessions, points, string
lengths), so data past a bound is refused at validation, with the first place it is passed named,
and the page rendered from valid data is at most ``PAGE_MAX_BYTES``.
"""

from typing import Final

from pydantic import TypeAdapter, ValidationError

from loopcommon.statuspage import PAGE_MAX_BYTES, StatusSnapshot, render

STATUS: Final = TypeAdapter(StatusSnapshot)


class NotAStatus(ValueError):
    """The status data does not have the page's shape; the message says where."""


def render_status(data: bytes, thread_url: str | None = None) -> bytes:
    """The status page for loopd's ``/status.json`` answer (pure; ``NotAStatus`` if invalid);
    ``thread_url``: Mattermost's address, where each thread's label links to."""
    try:
        snapshot = STATUS.validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the top"
        raise NotAStatus(
            f"{exc.error_count()} problem(s), the first at {where}: {first['msg']}"
        ) from None
    page = render(snapshot, thread_url).encode("utf-8")
    if len(page) > PAGE_MAX_BYTES:  # the bounds make it impossible; a cap is a cap
        raise NotAStatus(f"its page would be {len(page):,} bytes, over {PAGE_MAX_BYTES:,}")
    return page
