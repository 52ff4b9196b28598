"""The slot-file name rule: one name per (session, model, exact prefix), and nothing else passes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopcommon.slotfiles import (
    belongs_to,
    fingerprint_of,
    is_slot_file_name,
    parse_slot_file_name,
    prefix_digest,
    session_tag,
    slot_file_name,
)

FINGERPRINT = "0123456789ab"  # the model that wrote a save (loopcommon.slotfiles)


def test_a_name_has_the_documented_shape_and_parses_back() -> None:
    name = slot_file_name("s-1", b'[{"role":"user","content":"hi"}]', fingerprint=FINGERPRINT)
    assert name.startswith("loopd-")
    assert name.endswith(".bin")
    assert len(name) == len("loopd-") + 16 + 1 + 12 + 1 + 32 + len(".bin")
    parsed = parse_slot_file_name(name)
    assert parsed is not None
    assert parsed.session_tag == session_tag("s-1")
    assert parsed.fingerprint == FINGERPRINT == fingerprint_of(name)
    assert parsed.name == name
    assert is_slot_file_name(name)
    assert belongs_to(name, "s-1")


def test_another_session_or_another_prefix_gives_another_name() -> None:
    prefix = b"the same prefix"
    assert slot_file_name("a", prefix, fingerprint=FINGERPRINT) != slot_file_name(
        "b", prefix, fingerprint=FINGERPRINT
    )
    assert slot_file_name("a", prefix, fingerprint=FINGERPRINT) != slot_file_name(
        "a", prefix + b" and one more byte", fingerprint=FINGERPRINT
    )
    assert not belongs_to(slot_file_name("a", prefix, fingerprint=FINGERPRINT), "b")


def test_another_model_gives_another_name_of_the_same_session() -> None:
    prefix = b"the same prefix"
    other = slot_file_name("a", prefix, fingerprint="ba9876543210")
    assert other != slot_file_name("a", prefix, fingerprint=FINGERPRINT)
    assert belongs_to(other, "a")


@pytest.mark.parametrize("bad", ["", "0123456789AB", "0123456789a", "0123456789abc", "../x"])
def test_a_fingerprint_not_of_its_shape_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="fingerprint"):
        slot_file_name("a", b"p", fingerprint=bad)


def test_a_name_from_before_saves_were_bound_to_a_model_is_still_loopds() -> None:
    legacy = "loopd-" + session_tag("a") + "-0123456789abcdef0123456789abcdef.bin"
    parsed = parse_slot_file_name(legacy)
    assert parsed is not None
    assert parsed.fingerprint is None
    assert parsed.name == legacy
    assert belongs_to(legacy, "a")
    assert fingerprint_of(legacy) is None


def test_bytes_and_token_ids_never_share_a_digest() -> None:
    # b"\x01\x00\x00\x00" is token 1's little-endian encoding: the tags keep them apart.
    assert prefix_digest(b"\x01\x00\x00\x00") != prefix_digest([1])
    assert prefix_digest([1, 2, 3]) == prefix_digest((1, 2, 3))
    assert prefix_digest([1, 2]) != prefix_digest([2, 1])


def test_a_token_id_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="32 bits"):
        prefix_digest([-1])
    with pytest.raises(ValueError, match="32 bits"):
        prefix_digest([1 << 32])


@pytest.mark.parametrize(
    "name",
    [
        "",
        "loopd-.bin",
        "../loopd-0123456789abcdef-0123456789abcdef0123456789abcdef.bin",
        "dir/loopd-0123456789abcdef-0123456789abcdef0123456789abcdef.bin",
        "/abs/loopd-0123456789abcdef-0123456789abcdef0123456789abcdef.bin",
        "loopd-0123456789abcdef-0123456789abcdef0123456789abcdef.bin\n",
        "loopd-0123456789abcdef-0123456789abcdef0123456789abcdef.bin.tmp",
        "loopd-0123456789ABCDEF-0123456789abcdef0123456789abcdef.bin",
        "loopd-0123456789abcde-0123456789abcdef0123456789abcdef.bin",
        "loopd-0123456789abcdef-0123456789abcdef0123456789abcdef0.bin",
        "Loopd-0123456789abcdef-0123456789abcdef0123456789abcdef.bin",
        "other-0123456789abcdef-0123456789abcdef0123456789abcdef.bin",
        "loopd-\uff10123456789abcdef-0123456789abcdef0123456789abcdef.bin",
    ],
)
def test_anything_but_loopds_shape_is_refused(name: str) -> None:
    assert not is_slot_file_name(name)
    assert parse_slot_file_name(name) is None


@given(st.text(max_size=80))
def test_no_accepted_name_holds_a_path_separator_or_a_dot_dot(name: str) -> None:
    if is_slot_file_name(name):
        assert "/" not in name
        assert "\\" not in name
        assert ".." not in name


@given(st.text(max_size=40), st.binary(max_size=200))
def test_every_built_name_is_accepted(session: str, prefix: bytes) -> None:
    name = slot_file_name(session, prefix, fingerprint=FINGERPRINT)
    assert is_slot_file_name(name)
    assert belongs_to(name, session)
