"""The expectations file, the template fingerprint and judgements, and parsing server answers."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from loopd.engine.modelstate import template_sha256
from loopd.selftest.expected import (
    DEFAULT_DIR,
    ExpectationsError,
    ModelExpectation,
    build_number,
    diff_expectations,
    endpoint_expectation_path,
    expectation_path,
    find_expectation,
    load_expectation,
    save_expectation,
)
from loopd.selftest.facts import (
    MalformedAnswer,
    StreamTally,
    model_status,
    parse_listing,
    parse_props,
    parse_slots,
)
from loopd.selftest.template import (
    REASONING_MARKER,
    TemplateAnswer,
    divergence,
    judge_keeps_reasoning,
    judge_prefix_extension,
)
from loopd.wire.events import ChunkMeta, ContentDelta, Done, Finish, Progress, Timings

EXPECTATION = ModelExpectation(
    model="org/model:Q4",
    build=11434,
    build_info="b11434-pypi-sdist",
    template_sha256="ab" * 32,
    template_bytes=368,
    n_ctx_per_slot=4096,
    total_slots=2,
    caps={"supports_tools": False},
)


@pytest.mark.parametrize(
    ("info", "number"),
    [
        ("b11434-pypi-sdist", 11434),
        ("b10809-5266f24", 10809),
        ("b0-unknown", 0),
        ("b11434", 11434),
        ("unknown", None),
        ("", None),
        ("b12x-1", None),
    ],
)
def test_build_number(info: str, number: int | None) -> None:
    assert build_number(info) == number


def test_save_then_load_round_trips(tmp_path: Path) -> None:
    path = save_expectation(EXPECTATION, tmp_path)
    assert path == tmp_path / "org_model_Q4.json"
    assert load_expectation("org/model:Q4", tmp_path) == EXPECTATION
    assert json.loads(path.read_text())["n_ctx_per_slot"] == 4096
    assert not list(tmp_path.glob("*.tmp"))


def test_nothing_recorded_loads_as_none(tmp_path: Path) -> None:
    assert load_expectation("never-recorded", tmp_path) is None


def test_a_broken_file_is_an_error_naming_the_file_and_field(tmp_path: Path) -> None:
    path = expectation_path("m", tmp_path)
    data = EXPECTATION.model_dump() | {"model": "m"}
    del data["total_slots"]
    path.write_text(json.dumps(data))
    with pytest.raises(ExpectationsError, match=r"m\.json: total_slots: Field required"):
        load_expectation("m", tmp_path)
    path.write_text("{not json")
    with pytest.raises(ExpectationsError, match=r"m\.json"):
        load_expectation("m", tmp_path)


def test_a_file_recording_another_model_is_refused(tmp_path: Path) -> None:
    save_expectation(EXPECTATION, tmp_path)
    (tmp_path / "org_model_Q4.json").rename(tmp_path / "other.json")
    with pytest.raises(ExpectationsError, match="records model 'org/model:Q4', not 'other'"):
        load_expectation("other", tmp_path)


def test_an_endpoints_own_file_comes_before_its_models(tmp_path: Path) -> None:
    """Expectations are keyed by endpoint: two servers of one model may differ."""
    model_file = save_expectation(EXPECTATION, tmp_path)
    assert "endpoint" not in json.loads(model_file.read_text())  # as model files always were
    gpu2 = EXPECTATION.model_copy(update={"endpoint": "gpu2", "n_ctx_per_slot": 8192})
    assert save_expectation(gpu2, tmp_path) == tmp_path / "endpoints" / "gpu2.json"
    assert find_expectation("org/model:Q4", "gpu2", tmp_path) == (
        gpu2,
        endpoint_expectation_path("gpu2", tmp_path),
    )
    # An endpoint with no file of its own, and the shorthand's server, read the model's file.
    assert find_expectation("org/model:Q4", "gpu1", tmp_path) == (EXPECTATION, model_file)
    assert find_expectation("org/model:Q4", None, tmp_path) == (EXPECTATION, model_file)


def test_nothing_recorded_points_at_where_a_record_goes(tmp_path: Path) -> None:
    assert find_expectation("m", "gpu1", tmp_path) == (None, tmp_path / "endpoints" / "gpu1.json")
    assert find_expectation("m", None, tmp_path) == (None, tmp_path / "m.json")


def test_an_endpoint_file_for_another_model_asks_for_a_new_record(tmp_path: Path) -> None:
    save_expectation(EXPECTATION.model_copy(update={"endpoint": "gpu1"}), tmp_path)
    with pytest.raises(ExpectationsError, match="now serves 'qwen'; record it again") as error:
        find_expectation("qwen", "gpu1", tmp_path)
    assert "loopd selftest --record --endpoint gpu1" in str(error.value)
    (tmp_path / "endpoints" / "gpu1.json").rename(tmp_path / "endpoints" / "gpu3.json")
    with pytest.raises(ExpectationsError, match="records endpoint 'gpu1', not 'gpu3'"):
        find_expectation("org/model:Q4", "gpu3", tmp_path)


def test_diff_names_each_changed_field_and_cap() -> None:
    new = EXPECTATION.model_copy(
        update={"n_ctx_per_slot": 8192, "caps": {"supports_tools": True, "supports_x": False}}
    )
    changes = [c.describe() for c in diff_expectations(EXPECTATION, new)]
    assert changes == [
        "n_ctx_per_slot: 4096 -> 8192",
        "caps.supports_tools: false -> true",
        "caps.supports_x: (none) -> false",
    ]
    assert diff_expectations(EXPECTATION, EXPECTATION) == []
    assert len(diff_expectations(None, EXPECTATION)) == 7 + 1  # every field, each cap


def test_recorded_files_in_the_package_load() -> None:
    for model in ("smollm2", "smollm2-think"):
        recorded = load_expectation(model, DEFAULT_DIR)
        assert recorded is not None
        assert recorded.build == 11434


def test_template_hash_is_sha256_of_the_template_alone_without_a_tool_use_template() -> None:
    text = "{{ messages }}é"
    assert template_sha256(text, None) == hashlib.sha256(text.encode()).hexdigest()
    assert template_sha256(text, "x") != template_sha256(text, None)
    assert template_sha256("ab", "c") != template_sha256("a", "bc")


def test_judgements() -> None:
    assert judge_keeps_reasoning(f"...{REASONING_MARKER}...") is TemplateAnswer.YES
    assert judge_keeps_reasoning("<think>\n\n</think>") is TemplateAnswer.NO
    assert judge_keeps_reasoning(None) is TemplateAnswer.UNKNOWN
    assert judge_prefix_extension("abc", "abcdef") is TemplateAnswer.YES
    assert judge_prefix_extension("abXc", "abcdef") is TemplateAnswer.NO
    assert judge_prefix_extension(None, "abc") is TemplateAnswer.UNKNOWN
    assert (
        divergence("abXc", "abcdef", context=3)
        == "prompts differ at character 2: 'Xc' became 'cde'"
    )


def test_parse_props_takes_the_compared_fields() -> None:
    data: dict[str, Any] = {
        "default_generation_settings": {"params": {}, "n_ctx": 4096},
        "total_slots": 2,
        "chat_template": "T",
        "chat_template_caps": {"supports_tools": True, "odd": "x"},
        "build_info": "b11434-pypi-sdist",
        "model_alias": "m",
    }
    props = parse_props(data)
    assert (props.n_ctx_per_slot, props.total_slots, props.tool_use_template) == (4096, 2, None)
    assert props.caps == {"supports_tools": True}
    assert parse_props(data | {"chat_template_tool_use": "U"}).tool_use_template == "U"


def test_parse_props_refuses_the_router_stub_and_missing_fields() -> None:
    with pytest.raises(MalformedAnswer, match="router's own stub"):
        parse_props({"role": "router", "default_generation_settings": {"n_ctx": 0}})
    with pytest.raises(MalformedAnswer, match="n_ctx"):
        parse_props({"chat_template": "T", "total_slots": 2})
    with pytest.raises(MalformedAnswer, match="chat_template"):
        parse_props({"default_generation_settings": {"n_ctx": 1}, "total_slots": 2})


def test_parse_listing_router_and_single() -> None:
    router = {
        "data": [
            {"id": "a", "aliases": ["alpha"], "status": {"value": "loaded"}},
            {"id": "b", "aliases": [], "status": {"value": "unloaded"}},
        ]
    }
    listing = parse_listing(router)
    assert listing.router
    assert listing.served == ("a", "alpha", "b")
    assert model_status(router, "b") == "unloaded"
    assert model_status(router, "c") == ""
    single = parse_listing({"data": [{"id": "/m/x.gguf", "object": "model"}]})
    assert (single.router, single.served) == (False, ("/m/x.gguf",))


def test_parse_slots() -> None:
    slots = parse_slots([{"id": 0, "n_ctx": 4096, "is_processing": True}, {"id": 1, "n_ctx": 4096}])
    assert [(s.id, s.is_processing) for s in slots] == [(0, True), (1, False)]
    with pytest.raises(MalformedAnswer):
        parse_slots([{"id": "0", "n_ctx": 4096}])


def timings(predicted_n: int) -> Timings:
    return Timings(0, 10, predicted_n, 1.0, 1.0, 1.0, 1.0)


def test_stream_tally_counts_progress_and_token_counts() -> None:
    tally = StreamTally()
    tally.apply(ChunkMeta("chatcmpl-1", "m"))
    tally.apply(Progress(10, 0, 10, 5.0))
    tally.apply(timings(0))
    assert not tally.generating
    tally.apply(ContentDelta("O"))
    tally.apply(timings(1))
    assert tally.generating
    tally.apply(ContentDelta("K"))
    tally.apply(timings(2))
    tally.apply(Finish("stop"))
    tally.apply(timings(2))
    tally.apply(Done())
    probe = tally.result(slot=1, control_answer="success", failure="")
    assert (probe.progress_events, probe.timings_events, probe.token_counts) == (1, 4, 3)
    assert probe.complete
    assert probe.failure == ""


def test_stream_tally_without_done_is_not_complete() -> None:
    tally = StreamTally()
    tally.apply(ChunkMeta("chatcmpl-1", "m"))
    tally.apply(ContentDelta("O"))
    probe = tally.result(slot=0, control_answer=None, failure="")
    assert not probe.complete


def test_the_production_servers_expectation_holds_the_contracts_values() -> None:
    """Shipped so `loopd serve` accepts the production server without --record: the values the
    inference contract records (its "What is running" table and "Deployment change")."""
    production = load_expectation("ornith-1.5-35b-a3b")
    assert production is not None
    assert (production.build, production.build_info) == (10809, "b10809-5266f24")
    assert production.template_sha256 == (
        "f55f52930aa8bf44ab5cb85f99370fcc3c56e9a85640b812086d5330bce5d86b"
    )
    assert production.template_bytes == 7828
    assert (production.n_ctx_per_slot, production.total_slots) == (262144, 4)
    assert production.idle_slots_cleared is True
    assert production.caps is None
