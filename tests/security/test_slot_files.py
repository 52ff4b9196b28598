"""Slot saves and restores through the inference proxy: the box's own slots, loopd's file names,
and a save folder the operator bounds.

brokerd here allows slot 0 and model ``smollm2`` and bounds the save folder; a fake llama-server
records what reaches it and, like the real one, writes ``DIR/filename`` on a save.
"""

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from loopcommon.slotfiles import slot_file_name
from tests.security.brokerd_run import RunningBrokerd, brokerd
from tests.security.fake_mattermost import served
from tests.tools.toolcall import wait_until
from tests.watch import run_watched

FINGERPRINT = "0123456789ab"  # the model that wrote a save (loopcommon.slotfiles)


STATE_BYTES = 1000
CAP_BYTES = 3500  # three states fit, a fourth does not
EVICTED = "slot save folder over its cap"
SUPERSEDED = "superseded by the session's new save"


@dataclass
class SavingLlama:
    """Writes a save's file as llama-server does (``--slot-save-path`` + filename)."""

    folder: Path
    seen: list[str] = field(default_factory=list)

    async def slot_action(self, request: Request) -> JSONResponse:
        body = json.loads(await request.body())
        action = request.query_params.get("action")
        self.seen.append(f"{action} {request.url.path} {body.get('filename')}")
        if action == "save":
            (self.folder / body["filename"]).write_bytes(b"\0" * STATE_BYTES)
        return JSONResponse({"id_slot": 0, "filename": body.get("filename")})

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/slots/{slot}", self.slot_action, methods=["POST"])])


@dataclass(frozen=True)
class Box:
    llama: SavingLlama
    brokerd: RunningBrokerd

    @property
    def sock(self) -> Path:
        return self.brokerd.socket("infer")

    def evictions(self) -> int:
        """How many times brokerd has removed files for the cap (it does so after the answer)."""
        return self.brokerd.log().count(EVICTED)

    def evicted_at_least(self, count: int) -> bool:
        return self.evictions() >= count

    def superseded_at_least(self, count: int) -> bool:
        """brokerd has removed a session's earlier saves ``count`` times (after the answer)."""
        return self.brokerd.log().count(SUPERSEDED) >= count

    def post(self, path: str, query: str, body: object) -> int:
        transport = httpx.HTTPTransport(uds=str(self.sock))
        with httpx.Client(transport=transport, base_url="http://infer", timeout=10) as box:
            url = f"{path}?{query}" if query else path
            return box.post(url, content=json.dumps(body)).status_code

    def attempt(self, path: str, query: str, body: object) -> tuple[int, int]:
        """The status, and how many requests reached the server for it."""
        before = len(self.llama.seen)
        status = self.post(path, query, body)
        return status, len(self.llama.seen) - before


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    folder = Path(tmp_path_factory.mktemp("slots"))
    saves = folder / "saves"
    saves.mkdir()
    llama = SavingLlama(saves)
    with served(llama.app(), folder / "llama.sock"):
        variables = {
            "BROKERD_INFERENCE_URL": f"unix:{folder}/llama.sock",
            "BROKERD_INFERENCE_SLOTS": "[0]",
            "BROKERD_INFERENCE_MODELS": '["smollm2"]',
            "BROKERD_SLOT_SAVE_DIRS": json.dumps([str(saves)]),
            "BROKERD_SLOT_SAVE_MAX_BYTES": str(CAP_BYTES),
        }
        with brokerd(folder, variables, only=["infer"]) as running:
            yield Box(llama, running)


def own(session: str = "s1", prefix: bytes = b"prefix") -> dict[str, str]:
    return {
        "filename": slot_file_name(session, prefix, fingerprint=FINGERPRINT),
        "model": "smollm2",
    }


@pytest.mark.attack(
    attack="The box has the server write or read a file of its choosing in the save folder",
    input="save/restore on slot 0 with filename `../x.bin`, `a/b.bin`, `..`, `slot0.bin` "
    "(another client's shape), a name of loopd's shape with `.tmp` added",
    expected="403 naming why (a path; not loopd's shape); nothing reaches llama-server "
    "(loopd's own name passes)",
)
def test_file_names_other_than_loopds_are_refused(
    box: Box, observed: Callable[[str], None]
) -> None:
    names = ["../x.bin", "a/b.bin", "..", "slot0.bin", own()["filename"] + ".tmp"]
    results = {}
    for name in names:
        for action in ("save", "restore"):
            body = {"filename": name, "model": "smollm2"}
            results[f"{action} {name}"] = box.attempt("/slots/0", f"action={action}", body)
    results["save loopd's"] = box.attempt("/slots/0", "action=save", own())
    results["restore loopd's"] = box.attempt("/slots/0", "action=restore", own())
    observed(", ".join(f"{name}: {status}" for name, (status, _) in results.items()))
    refused = {name: result for name, result in results.items() if "loopd's" not in name}
    assert set(refused.values()) == {(403, 0)}
    assert results["save loopd's"] == (200, 1)
    assert results["restore loopd's"] == (200, 1)


@pytest.mark.attack(
    attack="The box saves another client's slot, or restores a state into it",
    input="save and restore of a loopd-shaped name on slot 1 (brokerd allows slot 0)",
    expected="403 naming the slot; nothing reaches llama-server",
)
def test_another_clients_slot_is_refused(box: Box, observed: Callable[[str], None]) -> None:
    results = {
        action: box.attempt("/slots/1", f"action={action}", own()) for action in ("save", "restore")
    }
    observed(", ".join(f"{action} slot 1: {status}" for action, (status, _) in results.items()))
    assert results == {"save": (403, 0), "restore": (403, 0)}


@pytest.mark.attack(
    attack="The box erases a slot, or smuggles another action or field past the check",
    input="`action=erase` on slot 0; `action=save&action=erase`; `action=save&model=x`; "
    "a body with a field beside filename and model; `/slots/00`",
    expected="403 for each (erase: loopd never needs it); nothing reaches llama-server",
)
def test_erase_and_smuggled_actions_are_refused(box: Box, observed: Callable[[str], None]) -> None:
    results = {
        "erase": box.attempt("/slots/0", "action=erase", {"model": "smollm2"}),
        "two actions": box.attempt("/slots/0", "action=save&action=erase", own()),
        "query model": box.attempt("/slots/0", "action=save&model=x", own()),
        "extra field": box.attempt("/slots/0", "action=save", {**own(), "n_keep": 1}),
        "slot 00": box.attempt("/slots/00", "action=save", own()),
    }
    observed(", ".join(f"{name}: {status}" for name, (status, _) in results.items()))
    assert set(results.values()) == {(403, 0)}


@pytest.mark.attack(
    attack="The box fills the host's disk through the server's save folder",
    input=f"ten saves of {STATE_BYTES}-byte states under different names, one restore of the "
    f"oldest in between; slot_save_max_bytes {CAP_BYTES}; another client's file in the folder",
    expected="after each save the folder's loopd files total at most the cap; the least "
    "recently used go first (the restored one stays); the other client's file stays",
)
def test_the_save_folder_stays_under_its_cap(box: Box, observed: Callable[[str], None]) -> None:
    saves = box.llama.folder
    theirs = saves / "another-client.bin"
    theirs.write_bytes(b"\0" * 10 * STATE_BYTES)
    for path in saves.glob("loopd-*"):
        path.unlink()
    names = [own(f"cap{i}")["filename"] for i in range(10)]
    largest = 0
    restored_outlived: list[bool] = []
    evicted = box.evictions()
    for i, name in enumerate(names):
        assert box.post("/slots/0", "action=save", {"filename": name, "model": "smollm2"}) == 200
        if i >= 3:
            evicted += 1
            wait_until(partial(box.evicted_at_least, evicted), f"the eviction after save {i}")
        if i == 2:
            # Make the first file the oldest by far, then use it: it must outlive the second.
            os.utime(saves / names[0], ns=(0, 0))
            assert box.post("/slots/0", "action=restore", own("cap0")) == 200
        if i == 3:
            restored_outlived = [(saves / names[0]).exists(), not (saves / names[1]).exists()]
        largest = max(largest, sum(p.stat().st_size for p in saves.glob("loopd-*")))
    kept = sorted(names.index(p.name) for p in saves.glob("loopd-*"))
    observed(
        f"largest total after a save: {largest} bytes (cap {CAP_BYTES}); the restored file "
        f"outlived an older save: {all(restored_outlived)}; kept saves {kept}"
    )
    assert largest <= CAP_BYTES
    assert restored_outlived == [True, True]
    assert kept == [7, 8, 9]
    assert theirs.exists()


@pytest.mark.attack(
    attack="The box fills the save folder with one session's saves, crowding out the others'",
    input="three saves of session s9 under three prefixes, with session s10's save beside them; "
    "a cap that holds all four",
    expected="after each answered save only that session's newest file is left (loopd restores "
    "no other); the other session's file stays",
)
def test_a_sessions_new_save_removes_its_earlier_ones(
    box: Box, observed: Callable[[str], None]
) -> None:
    saves = box.llama.folder
    for path in saves.glob("loopd-*"):
        path.unlink()
    neighbour = own("s10")["filename"]
    assert box.post("/slots/0", "action=save", {"filename": neighbour, "model": "smollm2"}) == 200
    superseded = box.brokerd.log().count(SUPERSEDED)
    names = [own("s9", f"turn {i}".encode())["filename"] for i in range(3)]
    for i, name in enumerate(names):
        assert box.post("/slots/0", "action=save", {"filename": name, "model": "smollm2"}) == 200
        if i:
            superseded += 1
            wait_until(partial(box.superseded_at_least, superseded), f"the removal after save {i}")
    left = sorted(path.name for path in saves.glob("loopd-*"))
    observed(
        f"files left: the session's newest {names[-1] in left}, its neighbour's "
        f"{neighbour in left}, {len(left)} in all"
    )
    assert left == sorted([names[-1], neighbour])


SCENARIOS = "tests.security.bound_scenarios"


@pytest.mark.attack(
    attack="Another client's saves, in a save folder it shares with the box's server, are "
    "removed or counted by brokerd",
    input="another client's four files of loopd's shape, one under the session the box saves "
    f"(s1), as large as three of the box's states together; the box saves s1 and four more "
    f"sessions; slot_save_max_bytes {CAP_BYTES} (three states)",
    expected="every file of the other client's stays and none counts towards the cap; the box's "
    "files stay under the cap (its three newest saves)",
)
def test_another_clients_saves_are_neither_removed_nor_counted(
    short_dir: Path, observed: Callable[[str], None]
) -> None:
    saves = short_dir / "saves"
    saves.mkdir()
    theirs = [slot_file_name("s1", b"their turn", fingerprint=FINGERPRINT)]
    theirs += [
        slot_file_name(f"theirs{i}", b"their turn", fingerprint=FINGERPRINT) for i in range(3)
    ]
    for name in theirs:
        (saves / name).write_bytes(b"\0" * STATE_BYTES)
        os.utime(saves / name, ns=(0, 0))  # older than anything the box saves
    ours = [slot_file_name(f"s{i}", b"our turn", fingerprint=FINGERPRINT) for i in range(1, 6)]
    with served(SavingLlama(saves).app(), short_dir / "llama.sock") as llama:
        watched = run_watched(
            f"{SCENARIOS}:box_saves", str(llama), str(saves), str(CAP_BYTES), *ours
        )
    left = {path.name for path in saves.glob("loopd-*")}
    kept_ours = sorted(ours.index(name) + 1 for name in left & set(ours))
    line = (
        f"statuses {watched.result['statuses']}; the other client's files left "
        f"{len(left & set(theirs))} of {len(theirs)}; the box's saves kept: s{kept_ours}; "
        f"{watched.line}"
    )
    print(line)
    observed(line)
    assert watched.result["statuses"] == [200] * len(ours)
    assert left >= set(theirs)
    assert kept_ours == [3, 4, 5]
