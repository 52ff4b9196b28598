"""Which slot actions pass the inference proxy (pure): the box's own slots, save and restore,
file names of loopd's shape."""

import json

import pytest

from brokerd.proxy.inference import InferencePolicy, body_refusal, refusal
from brokerd.proxy.slotactions import action_of, slot_of
from loopcommon.slotfiles import slot_file_name

FINGERPRINT = "0123456789ab"  # the model that wrote a save (loopcommon.slotfiles)

POLICY = InferencePolicy(slots=frozenset({0, 2}), models=frozenset({"smollm2"}))
NAME = slot_file_name("session-a", b"the exact prefix", fingerprint=FINGERPRINT)


def body_status(policy: InferencePolicy, path: str, body: object) -> tuple[int, str]:
    refused = body_refusal(policy, "POST", path, json.dumps(body).encode())
    return (200, "") if refused is None else (refused.status, refused.message)


@pytest.mark.parametrize(
    ("path", "slot"),
    [
        ("/slots/0", 0),
        ("/slots/12", 12),
        *((path, None) for path in ("/slots/00", "/slots/-1", "/slots/+1", "/slots/1/")),
        *((path, None) for path in ("/slots/ 1", "/slots/", "/slots/0x1", "/slots/1234567")),
    ],
)
def test_only_a_decimal_slot_id_is_a_slot_action(path: str, slot: int | None) -> None:
    assert slot_of(path) == slot


@pytest.mark.parametrize(
    ("query", "passes"),
    [
        (b"action=save", True),
        (b"action=restore", True),
        (b"action=erase", False),
        (b"", False),
        (b"action=save&action=restore", False),
        (b"action=save&model=smollm2", False),
        (b"action=SAVE", False),
        (b"act%69on=restore", True),
    ],
)
def test_the_query_is_exactly_one_save_or_restore(query: bytes, passes: bool) -> None:
    assert (refusal("POST", "/slots/0", query) is None) == passes


def test_erase_is_refused_with_its_own_reason() -> None:
    why = refusal("POST", "/slots/0", b"action=erase")
    assert why is not None
    assert "erase" in why
    assert action_of(b"action=erase") == "erase"


def test_other_methods_and_spellings_are_not_slot_actions() -> None:
    for method, path in (("GET", "/slots/0"), ("POST", "/slots//0"), ("POST", "/v1/slots/0")):
        assert refusal(method, path, b"action=save") is not None


def test_the_box_saves_and_restores_its_own_slots_under_loopds_names() -> None:
    assert body_status(POLICY, "/slots/2", {"filename": NAME, "model": "smollm2"}) == (200, "")
    status, why = body_status(POLICY, "/slots/1", {"filename": NAME, "model": "smollm2"})
    assert (status, why) == (
        403,
        "brokerd refuses POST /slots/1: slot 1 is another client's; this box's are 0, 2",
    )
    # Without inference_slots the box has the whole server.
    assert body_status(InferencePolicy(), "/slots/7", {"filename": NAME}) == (200, "")


@pytest.mark.parametrize(
    ("filename", "reason"),
    [
        ("../" + NAME, "is a path"),
        ("sub/" + NAME, "is a path"),
        ("..", "is a path"),
        ("slot0.bin", "is not of loopd's shape"),
        (NAME.upper(), "is not of loopd's shape"),
        (NAME + ".tmp", "is not of loopd's shape"),
        ("", "is not of loopd's shape"),
        (7, "is not a string"),
        (None, "is not a string"),
    ],
)
def test_any_other_file_name_is_refused(filename: object, reason: str) -> None:
    status, why = body_status(POLICY, "/slots/0", {"filename": filename, "model": "smollm2"})
    assert status == 403
    assert reason in why


def test_the_body_holds_the_file_name_and_the_model_only() -> None:
    status, why = body_status(POLICY, "/slots/0", {"filename": NAME, "model": "big-model"})
    assert (status, "big-model" in why) == (403, True)
    status, why = body_status(POLICY, "/slots/0", {"filename": NAME, "model": "smollm2", "x": 1})
    assert (status, "'x'" in why) == (403, True)
    refused = body_refusal(POLICY, "POST", "/slots/0", b'"a string"')
    assert refused is not None
    assert refused.status == 400
