"""The save folder under brokerd's cap, in a run of many sessions: disk used against the cap, and
which returns still find their state.

A router of its own (SmolLM2, two slots, ``--slot-save-path``) behind a real ``brokerd serve``
(slots 0 and 1, ``slot_save_dirs`` and a ``slot_save_max_bytes`` that holds about
``STATES_IN_CAP`` states). ``SESSIONS`` sessions take turns on the two slots: each reads its
first prompt and saves its slot through brokerd; then each returns, restoring its file first
when it is still there. The folder's size is sampled right after each save's answer and once
brokerd's eviction after it has run.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.durable import first_messages, fresh_connections, returning_messages
from bench.errors import BenchError
from loopcommon.slotfiles import slot_file_name
from loopd_dev import devserver

FINGERPRINT = "0123456789ab"  # the model that wrote a save (loopcommon.slotfiles)


log = logging.getLogger("bench.durable")

MODEL = devserver.PLAIN_MODEL
SESSIONS = 12
PARAGRAPHS = 4
STATES_IN_CAP = 4.5
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class CapRun:
    cap_bytes: int
    state_bytes: int
    saves: int
    largest_at_answer: int
    largest_settled: int
    files_left: int
    returns_restored: int
    returns_reread: int


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.glob("loopd-*"))


def start_brokerd(work: Path, server_url: str, saves: Path, cap: int) -> subprocess.Popen[bytes]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(REPO),
        "BROKERD_SOCKET_DIR": str(work / "run"),
        "BROKERD_INFERENCE_URL": server_url,
        "BROKERD_INFERENCE_SLOTS": "[0, 1]",
        "BROKERD_SLOT_SAVE_DIRS": json.dumps([str(saves)]),
        "BROKERD_SLOT_SAVE_MAX_BYTES": str(cap),
    }
    log_file = (work / "brokerd.log").open("wb")
    argv = [sys.executable, "-m", "brokerd", "serve", "--only", "infer"]
    process = subprocess.Popen(argv, env=env, stdout=log_file, stderr=log_file, cwd=work)
    deadline = time.monotonic() + 30
    while '"msg": "ready: ' not in brokerd_log(work):
        if process.poll() is not None or time.monotonic() > deadline:
            raise BenchError(f"brokerd did not start:\n{brokerd_log(work)}")
        time.sleep(0.05)
    return process


def brokerd_log(work: Path) -> str:
    return (work / "brokerd.log").read_text(encoding="utf-8", errors="replace")


def wait_under_cap(saves: Path, cap: int) -> None:
    deadline = time.monotonic() + 10
    while folder_bytes(saves) > cap:
        if time.monotonic() > deadline:
            raise BenchError("brokerd did not evict after a save over the cap")
        time.sleep(0.02)


def chat(box: httpx.Client, slot: int, messages: list[dict[str, object]]) -> dict[str, int]:
    body = {"model": MODEL, "id_slot": slot, "messages": messages, "max_tokens": 1}
    response = box.post("/v1/chat/completions", json={**body, "temperature": 0})
    if response.status_code != 200:
        raise BenchError(f"chat through brokerd: {response.status_code} {response.text}")
    timings: dict[str, int] = response.json()["timings"]
    return timings


def slot_action(box: httpx.Client, action: str, slot: int, name: str) -> httpx.Response:
    body = {"filename": name, "model": MODEL}
    return box.post(f"/slots/{slot}", params={"action": action}, json=body)


def probe_state_bytes(server: devserver.RunningServer) -> int:
    """One session's state size, saved straight on the server and removed."""
    with fresh_connections(server) as direct:
        chat(direct, 0, first_messages("probe", PARAGRAPHS))
        name = slot_file_name("probe", b"probe", fingerprint=FINGERPRINT)
        saved = slot_action(direct, "save", 0, name)
    if saved.status_code != 200:
        raise BenchError(f"the probe save failed: {saved.text}")
    return int(saved.json()["n_written"])


def run(work: Path, cache_dir: Path) -> CapRun:
    saves = work / "saves"
    saves.mkdir(parents=True, exist_ok=True)
    server = devserver.start(
        work / "server",
        cache_dir,
        socket_path=work / "llama.sock",
        extra_args=("--slot-save-path", str(saves)),
    )
    try:
        state_bytes = probe_state_bytes(server)
        for path in saves.iterdir():
            path.unlink()
        cap = int(state_bytes * STATES_IN_CAP)
        brokerd = start_brokerd(work, server.url, saves, cap)
        try:
            return measure(work, saves, cap, state_bytes)
        finally:
            brokerd.send_signal(signal.SIGTERM)
            brokerd.wait(timeout=15)
    finally:
        server.stop()


def measure(work: Path, saves: Path, cap: int, state_bytes: int) -> CapRun:
    transport = httpx.HTTPTransport(
        uds=str(work / "run" / "infer.sock"), limits=httpx.Limits(max_keepalive_connections=0)
    )
    sessions = [f"soak-{n}" for n in range(SESSIONS)]
    names = {
        s: slot_file_name(
            s, json.dumps(first_messages(s, PARAGRAPHS)).encode(), fingerprint=FINGERPRINT
        )
        for s in sessions
    }
    at_answer = settled = 0
    restored = reread = 0
    with httpx.Client(transport=transport, base_url="http://infer", timeout=300) as box:
        for n, session in enumerate(sessions):
            log.info("durable cap: session %d of %d", n + 1, SESSIONS)
            chat(box, n % 2, first_messages(session, PARAGRAPHS))
            if slot_action(box, "save", n % 2, names[session]).status_code != 200:
                raise BenchError("a save through brokerd failed")
            at_answer = max(at_answer, folder_bytes(saves))
            wait_under_cap(saves, cap)
            settled = max(settled, folder_bytes(saves))
        for n, session in enumerate(sessions):
            slot = n % 2
            found = slot_action(box, "restore", slot, names[session]).status_code == 200
            timings = chat(box, slot, returning_messages(first_messages(session, PARAGRAPHS)))
            if found and timings["cache_n"] > 0:
                restored += 1
            else:
                reread += 1
    return CapRun(
        cap_bytes=cap,
        state_bytes=state_bytes,
        saves=SESSIONS,
        largest_at_answer=at_answer,
        largest_settled=settled,
        files_left=len(list(saves.glob("loopd-*"))),
        returns_restored=restored,
        returns_reread=reread,
    )


def render(result: CapRun) -> str:
    mib = 1024 * 1024
    return "\n".join(
        [
            "### The save folder under brokerd's cap",
            "",
            f"{result.saves} sessions of SmolLM2 taking turns on two slots, each slot saved "
            f"through a real `brokerd serve` after its first prompt (a state of "
            f"{result.state_bytes / mib:.1f} MiB); `slot_save_max_bytes` "
            f"{result.cap_bytes / mib:.1f} MiB, about {STATES_IN_CAP} states. Then each "
            "session returns, restoring its file first where brokerd kept it.",
            "",
            "| Cap | Largest right at a save's answer | Largest once its eviction ran "
            "| Files left | Returns restored | Returns re-read |",
            "|---|---|---|---|---|---|",
            f"| {result.cap_bytes / mib:.1f} MiB | {result.largest_at_answer / mib:.1f} MiB "
            f"| {result.largest_settled / mib:.1f} MiB | {result.files_left} "
            f"| {result.returns_restored} | {result.returns_reread} |",
            "",
            "Before forwarding a save brokerd makes room for one more state as large as the "
            "largest there, and trims to the cap again once the save is answered; the returns "
            "that re-read are the sessions whose states were the least recently used.",
            "",
        ]
    )
