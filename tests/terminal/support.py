"""Helpers for the terminal tests: ``loopd chat`` in a real pseudo-terminal (pexpect), the fake
llama-server served in a thread of its own, and reads of the session log and of ``/slots``."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pexpect
import pyte
from anyio.from_thread import BlockingPortal, start_blocking_portal

from loopd.sessionlog.records import Entry, EntryKind, Request
from loopd.sessionlog.store import SessionLog
from loopd_dev import devserver
from loopd_dev.fakes.llama import FakeLlama, Pace, ScriptedReply, serve_fake_llama

LOOPD = [sys.executable, "-m", "loopd"]
FAKE_MODEL = "fake-model"  # the fake's default model
PROMPT = "you> "
# How the terminal writes an answer: a transient status line is erased (ESC [2K) and the answer's
# text follows, with no escape sequence in it (loopd.terminal.render).
ANSWER_TEXT = r"\x1b\[2K([^\x1b]{%d,})"


if TYPE_CHECKING:
    Chat = pexpect.spawn[str]  # generic in the stubs only


def loopd_env(url: str, state_dir: Path, **settings: str) -> dict[str, str]:
    """The environment for a loopd process: the test's server and state dir, the real server's
    plain model unless ``model`` names another, no outside LOOPD_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPD_")}
    env.update(LOOPD_INFER_URL=url, LOOPD_STATE_DIR=str(state_dir), LOOPD_SLOTS="0")
    env.update(LOOPD_MODEL=devserver.PLAIN_MODEL)
    env.update({f"LOOPD_{name.upper()}": value for name, value in settings.items()})
    return env


def fake_env(server: FakeServer, state_dir: Path) -> dict[str, str]:
    """The environment for loopd on the fake: its model, and max_tokens well inside its 8192
    tokens of context (the default, 12288, would make every turn compact first), so no thinking
    cap (which must leave room for an answer below max_tokens)."""
    return loopd_env(server.url, state_dir, model=FAKE_MODEL, max_tokens="512", think_cap="0")


def spawn_chat(env: dict[str, str], *args: str, session: str = "tty", timeout: float = 60) -> Chat:
    """``loopd chat`` in a pseudo-terminal of 40 x 120; what it writes is kept in ``.screen``."""
    child = pexpect.spawn(
        LOOPD[0],
        [*LOOPD[1:], "chat", "--session", session, *args],
        env=env,
        encoding="utf-8",
        timeout=timeout,
        dimensions=(40, 120),
    )
    child.logfile_read = Screen()
    _SPAWNED.append(child)
    return child


# Every chat spawn_chat started, so that the one a failing test leaves running (mid-turn, its
# request still holding a slot of the shared server) is ended with the test: ``end_chats``.
_SPAWNED: list[Chat] = []


def end_chats() -> None:
    """Kill every chat still running (SIGHUP, then SIGKILL) and forget them all."""
    while _SPAWNED:
        child = _SPAWNED.pop()
        if not child.closed:
            child.close(force=True)


class Screen:
    """Everything the child wrote to the terminal, in order (pexpect's ``logfile_read``)."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, data: str) -> None:
        self.text += data

    def flush(self) -> None:
        pass


def screen(child: Chat) -> str:
    log = child.logfile_read
    assert isinstance(log, Screen)
    return log.text


def matched(child: Chat) -> str:
    """The first group of what ``child.expect`` matched last."""
    match = child.match
    assert isinstance(match, re.Match), match
    return str(match.group(1))


def plain(text: str) -> str:
    """``text`` without its colours (SGR sequences): the words as they read on screen."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def emulated(written: str, columns: int = 120, lines: int = 40) -> list[str]:
    """The rows a terminal of ``columns`` x ``lines`` shows after ``written`` (pyte, a VT100
    emulator), each without its trailing blanks."""
    emulated_screen = pyte.Screen(columns, lines)
    pyte.Stream(emulated_screen).feed(written)
    return [line.rstrip() for line in emulated_screen.display]


def quit_chat(child: Chat) -> int:
    """Ctrl-D at the prompt; the exit status."""
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus is not None, f"killed by signal {child.signalstatus}"
    return child.exitstatus


# -- the session log -------------------------------------------------------------------------------


def entries(state_dir: Path, session: str) -> list[Entry]:
    with SessionLog.open(state_dir / "loopd.db", create=False) as log:
        return log.entries(session)


def requests(state_dir: Path, session: str) -> list[Request]:
    with SessionLog.open(state_dir / "loopd.db", create=False) as log:
        return log.requests(session)


def of_kind(found: list[Entry], kind: EntryKind) -> list[Entry]:
    return [entry for entry in found if entry.kind is kind]


def content(entry: Entry | None) -> str:
    """The content of an entry's message, or of a broken entry's partial message."""
    assert entry is not None
    text = entry.message if entry.message is not None else entry.fields.text
    return str(json.loads(text or "{}").get("content") or "")


def split_array(array: str) -> list[str]:
    """The elements of a JSON array as the exact text they have in it."""
    decoder = json.JSONDecoder()
    assert array.startswith("["), array[:80]
    assert array.endswith("]"), array[-80:]
    parts, at = [], 1
    while array[at] != "]":
        _, end = decoder.raw_decode(array, at)
        parts.append(array[at:end])
        at = end + 1 if array[end] == "," else end
    return parts


def array_digest(messages: list[str]) -> str:
    """sha256 of a messages array's bytes, as loopd records it for each request."""
    return hashlib.sha256(("[" + ",".join(messages) + "]").encode()).hexdigest()


# -- servers ---------------------------------------------------------------------------------------


def slot_busy(url: str, model: str, slot: int = 0) -> bool:
    transport = httpx.HTTPTransport(uds=url.removeprefix("unix:"))
    with httpx.Client(transport=transport, base_url="http://llama", timeout=10) as client:
        answer = client.get("/slots", params={"model": model, "autoload": "false"})
    return any(s.get("id") == slot and s.get("is_processing") for s in answer.json())


def slot_decoded(url: str, model: str, slot: int = 0) -> int | None:
    """Tokens the slot's running task has generated so far; None when the slot is idle."""
    transport = httpx.HTTPTransport(uds=url.removeprefix("unix:"))
    with httpx.Client(transport=transport, base_url="http://llama", timeout=10) as client:
        answer = client.get("/slots", params={"model": model, "autoload": "false"})
    for state in answer.json():
        if state.get("id") == slot and state.get("is_processing"):
            return int(state.get("next_token", [{}])[0].get("n_decoded", 0))
    return None


def until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> float:
    """Poll ``condition`` (a server's or a file's state, which offer no event) until it holds;
    the seconds it took."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)
    return time.monotonic() - start


@dataclass
class FakeServer:
    portal: BlockingPortal
    fake: FakeLlama
    url: str

    def script(self, *replies: ScriptedReply) -> None:
        self.portal.call(lambda: self.fake.push(*replies))

    def faults(self, **changes: Any) -> None:
        self.portal.call(lambda: self.fake.faults.set(**changes))

    def chat_requests(self) -> int:
        def count() -> int:
            return sum(1 for r in self.fake.log if r.path == "/v1/chat/completions")

        result: int = self.portal.call(count)
        return result


@contextmanager
def fake_llama(pace: Pace | None = None) -> Iterator[FakeServer]:
    """The fake llama-server on a Unix socket, served by an event loop in a thread of its own
    (the test itself drives a process and waits synchronously)."""
    fake = FakeLlama(pace=pace)
    with (
        tempfile.TemporaryDirectory(prefix="lt") as tmp,
        start_blocking_portal(backend="asyncio") as portal,
    ):
        socket = Path(tmp) / "llama.sock"
        with portal.wrap_async_context_manager(serve_fake_llama(fake, uds=socket)):
            yield FakeServer(portal, fake, f"unix:{socket}")
