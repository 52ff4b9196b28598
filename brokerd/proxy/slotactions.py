"""Which slot actions the box may ask of the shared server: save and restore of its own slots,
under file names of loopd's shape only (pure).

llama-server (started with ``--slot-save-path DIR``) answers ``POST /slots/{id}?action=save``
and ``?action=restore`` with a JSON body ``{"filename": NAME}``: it writes or reads
``DIR/NAME`` for slot ``id``. Unchecked, that lets a box read another client's saved state into
its slot (and so generate from another conversation), overwrite it, or fill the server's disk
under names no one bounds. So a slot action passes only when:

- the path is ``/slots/`` and a slot id in decimal, one of ``inference_slots`` when those are
  set (the same rule as a chat request's ``id_slot``);
- the query is exactly one ``action``, ``save`` or ``restore``. ``erase`` is refused: loopd never
  needs it (a slot's next request or a restore replaces what it holds). A router reads the model
  of a POST from its body, never from the query, so nothing else belongs there;
- the body is a JSON object of ``filename`` and, for a router, ``model`` (checked by the
  inference policy like any model), and ``filename`` has loopd's shape
  (``loopcommon.slotfiles``): no path, no other client's name. The name holds a hash of the
  exact prefix the state was saved after, so naming a file of another loopd box's needs that
  box's whole conversation up to that point.
"""

import re
from collections.abc import Mapping
from typing import Final
from urllib.parse import unquote_plus

from loopcommon.slotfiles import is_slot_file_name

SLOT_ACTION_PATH: Final = re.compile(r"/slots/(0|[1-9][0-9]{0,5})")
FORWARDED_ACTIONS: Final = frozenset({"save", "restore"})
BODY_FIELDS: Final = frozenset({"filename", "model"})
LOOPD_SHAPE: Final = "loopd-<16 hex>-<12 hex>-<32 hex>.bin"


def slot_of(path: str) -> int | None:
    """The slot id of a slot-action path (``/slots/3``), or None for any other path."""
    found = SLOT_ACTION_PATH.fullmatch(path)
    return int(found[1]) if found else None


def is_slot_action(method: str, path: str) -> bool:
    return method == "POST" and slot_of(path) is not None


def action_of(query: bytes) -> str | None:
    """The action a query asks for, when it is exactly one ``action`` parameter."""
    parts = [part.partition(b"=") for part in query.split(b"&") if part]
    if len(parts) != 1:
        return None
    name, _, value = parts[0]
    if unquote_plus(name.decode("latin-1")) != "action":
        return None
    return unquote_plus(value.decode("latin-1"))


def query_refusal(path: str, query: bytes) -> str | None:
    """Why a slot action's query is refused, or None for ``action=save`` or ``restore``."""
    action = action_of(query)
    if action == "erase":
        return (
            f"brokerd refuses POST {path} with action erase: loopd never erases a slot "
            "(its next request or a restore replaces what it holds)"
        )
    if action not in FORWARDED_ACTIONS:
        return (
            f"brokerd refuses POST {path}: the query must be exactly action=save or action=restore"
        )
    return None


def slot_refusal(slot: int, slots: frozenset[int]) -> str | None:
    """Why a slot action on ``slot`` is refused: not one of the box's ``slots`` (empty: any)."""
    if not slots or slot in slots:
        return None
    allowed = ", ".join(str(s) for s in sorted(slots))
    return f"slot {slot} is another client's; this box's are {allowed}"


def file_name_refusal(name: object) -> str | None:
    """Why a ``filename`` is refused: a path, or not of loopd's shape."""
    if not isinstance(name, str):
        return f"the filename {name!r} is not a string"
    if is_slot_file_name(name):
        return None
    if "/" in name or "\\" in name or ".." in name:
        return f"the filename {name!r} is a path, not a file name"
    return (
        f"the filename {name!r} is not of loopd's shape ({LOOPD_SHAPE}), so another "
        "client's or no one's"
    )


def fields_refusal(body: Mapping[str, object]) -> str | None:
    """Why the body's fields are refused: one beside ``filename`` and ``model``."""
    extra = sorted(set(body) - BODY_FIELDS)
    if not extra:
        return None
    return f"the field {extra[0]!r} has no place in a slot action (only filename and model)"


def body_refusal(
    path: str, slots: frozenset[int], where: str, body: Mapping[str, object]
) -> str | None:
    """Why a slot action on ``path`` (a slot-action path) with this JSON body is refused, in one
    line, or None; ``slots`` are the box's (empty: any); its ``model`` is checked elsewhere."""
    slot = slot_of(path)
    assert slot is not None, path
    why = (
        slot_refusal(slot, slots) or fields_refusal(body) or file_name_refusal(body.get("filename"))
    )
    return f"brokerd refuses POST {path}{where}: {why}" if why is not None else None
