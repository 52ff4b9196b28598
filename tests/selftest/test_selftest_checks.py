"""The self-test's pure core: each check against gathered facts and the recorded expectation."""

from __future__ import annotations

import dataclasses

import pytest

from loopd.engine.modelstate import ModelReading, ModelStatus, Weights, template_sha256
from loopd.selftest.checks import (
    POOL_CLEARED,
    POOL_KEPT,
    CheckResult,
    check_cache,
    check_context,
    check_harness_slots,
    check_model,
    check_pool,
    check_render,
    check_server,
    check_slot_count,
    check_stream,
    check_template,
    expectation_from_facts,
    passed,
    run_checks,
    template_info,
)
from loopd.selftest.expected import ExpectationsError, ModelExpectation
from loopd.selftest.facts import (
    CacheProbe,
    Health,
    Listing,
    PoolProbe,
    Props,
    RenderProbe,
    RouterFacts,
    ServerFacts,
    SlotInfo,
    StreamProbe,
    TemplateProbe,
)
from loopd.selftest.run import format_result
from loopd.selftest.template import TemplateAnswer

TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"
CAPS = {"supports_tools": True, "supports_preserve_reasoning": False}
WEIGHTS = Weights(file="m.gguf", ftype="Q4_1", size=96_576_768, n_params=134_515_008)
READING = ModelReading(
    ModelStatus.AWAKE,
    instance="40001",
    sleep_idle_s=21600,
    weights=WEIGHTS,
    template=template_sha256(TEMPLATE, None),
)


def good_props(**changes: object) -> Props:
    props = Props(
        build_info="b11434-pypi-sdist",
        model_alias="m",
        chat_template=TEMPLATE,
        tool_use_template=None,
        caps=dict(CAPS),
        n_ctx_per_slot=4096,
        total_slots=2,
    )
    return dataclasses.replace(props, **changes)  # type: ignore[arg-type]


def good_facts(**changes: object) -> ServerFacts:
    facts = ServerFacts(
        url="unix:/run/infer.sock",
        model="m",
        harness_slots=(0,),
        health=Health(reachable=True, healthy=True),
        listing=Listing(router=True, served=("m", "other"), status="loaded"),
        reading=READING,
        router=RouterFacts(max_instances=4, models_autoload=True),
        props=good_props(),
        slots=(SlotInfo(0, 4096, False), SlotInfo(1, 4096, False)),
        cache=CacheProbe(slot=0, first_prompt_tokens=30, second_cache_n=29, second_prompt_n=1),
        pool=PoolProbe(slot=0, other_slot=1, first_prompt_tokens=30, again_cache_n=29),
        stream=StreamProbe(
            slot=0,
            progress_events=2,
            timings_events=10,
            token_counts=9,
            control_answer="success",
            complete=True,
        ),
        render=RenderProbe(rendered=2),
        template=TemplateProbe(TemplateAnswer.NO, TemplateAnswer.YES),
    )
    return dataclasses.replace(facts, **changes)  # type: ignore[arg-type]


EXPECTED = ModelExpectation(
    model="m",
    build=11434,
    build_info="b11434-0123abc",
    template_sha256=template_sha256(TEMPLATE, None),
    template_bytes=len(TEMPLATE),
    n_ctx_per_slot=4096,
    total_slots=2,
    caps=dict(CAPS),
    idle_slots_cleared=False,
    weights=WEIGHTS,
)


def failing(results: list[CheckResult]) -> list[str]:
    return [r.name for r in results if not r.ok]


def test_a_server_as_recorded_passes_every_check() -> None:
    results = run_checks(good_facts(), EXPECTED)
    assert failing(results) == []
    assert passed(results)
    assert [r.name for r in results if r.informational] == [
        "idle policy",
        "keeps past reasoning",
        "tool turn + user extends prompt",
        "durable sessions",
    ]


def test_server_compares_only_the_build_number() -> None:
    # The recorded build_info names a git commit, the running one a source-package build.
    result = check_server(good_facts(), EXPECTED)
    assert result.ok
    assert result.actual == "healthy, build 11434 (b11434-pypi-sdist)"


def test_server_names_a_different_build() -> None:
    result = check_server(good_facts(props=good_props(build_info="b11500-deadbee")), EXPECTED)
    assert not result.ok
    assert format_result(result) == (
        "FAIL  server: expected healthy, build 11434, got healthy, build 11500 (b11500-deadbee)"
    )


def test_server_without_a_build_number_fails() -> None:
    result = check_server(good_facts(props=good_props(build_info="unknown")), EXPECTED)
    assert not result.ok
    assert "no build number" in result.actual


def test_server_unreachable_fails_with_the_reason() -> None:
    health = Health(reachable=False, healthy=False, detail="connection refused")
    facts = good_facts(health=health, props=None, missing={"props": "not checked"})
    result = check_server(facts, EXPECTED)
    assert (result.ok, result.actual, result.detail) == (False, "unreachable", "connection refused")


def test_server_loading_is_not_healthy() -> None:
    result = check_server(good_facts(health=Health(True, False, "503")), EXPECTED)
    assert (result.ok, result.actual) == (False, "not healthy")


def test_nothing_recorded_fails_the_recorded_checks_and_says_how_to_record() -> None:
    results = run_checks(good_facts(), None)
    assert failing(results) == ["server", "chat template", "context per slot", "slots", "slot pool"]
    weights = next(r for r in results if r.name == "model weights")
    assert weights.ok
    assert weights.detail == "not recorded: nothing to compare"
    assert all("--record" in r.expected for r in results if not r.ok)


def test_model_not_listed_by_the_router_names_what_is_served() -> None:
    facts = good_facts(listing=Listing(router=True, served=("a", "b")))
    result = check_model(facts)
    assert not result.ok
    assert result.actual == "not served; the server serves a, b"


def test_single_model_server_is_matched_by_its_alias() -> None:
    facts = good_facts(listing=Listing(router=False, served=("/models/x.gguf",)))
    assert check_model(facts).ok
    other = good_facts(
        listing=Listing(router=False, served=("/models/x.gguf",)),
        props=good_props(model_alias="x"),
    )
    assert not check_model(other).ok


def test_a_changed_template_fails_naming_both_hashes() -> None:
    changed = TEMPLATE + "{# edited #}"
    result = check_template(good_facts(props=good_props(chat_template=changed)), EXPECTED)
    assert not result.ok
    assert EXPECTED.template_sha256 in result.expected
    assert template_sha256(changed, None) in result.actual


def test_a_tool_use_template_is_part_of_the_hash() -> None:
    props = good_props(tool_use_template="{{ tools }}")
    result = check_template(good_facts(props=props), EXPECTED)
    assert not result.ok


def test_changed_caps_fail_the_template_check_naming_the_cap() -> None:
    props = good_props(caps={"supports_tools": False, "supports_preserve_reasoning": False})
    result = check_template(good_facts(props=props), EXPECTED)
    assert not result.ok
    assert result.detail == "caps differ: supports_tools: true -> false"


def test_context_per_slot_names_the_difference() -> None:
    result = check_context(good_facts(props=good_props(n_ctx_per_slot=2048)), EXPECTED)
    assert format_result(result) == "FAIL  context per slot: expected 4096, got 2048"


def test_slot_count_names_the_difference() -> None:
    result = check_slot_count(good_facts(props=good_props(total_slots=4)), EXPECTED)
    assert format_result(result) == "FAIL  slots: expected 2, got 4"


def test_layout_checks_without_props_fail_with_the_reason() -> None:
    facts = good_facts(props=None, missing={"props": "GET /props failed: 500"})
    for check in (check_template, check_context, check_slot_count):
        result = check(facts, EXPECTED)
        assert (result.ok, result.actual, result.detail) == (
            False,
            "not checked",
            "GET /props failed: 500",
        )


def test_a_missing_harness_slot_is_named() -> None:
    result = check_harness_slots(good_facts(harness_slots=(0, 3)))
    assert not result.ok
    assert result.actual == "3 missing; the server has 0,1"
    assert check_harness_slots(good_facts(harness_slots=(1, 0))).ok


def test_cache_probe_passes_on_full_reuse_and_fails_on_a_re_read() -> None:
    assert check_cache(good_facts()).ok
    cold = CacheProbe(slot=0, first_prompt_tokens=30, second_cache_n=0, second_prompt_n=30)
    result = check_cache(good_facts(cache=cold))
    assert not result.ok
    assert result.expected == "cache_n >= 27 of 30 prompt tokens"
    assert result.actual == "cache_n 0, prompt_n 30"


def test_cache_probe_accepts_a_hybrid_models_checkpoint_and_says_so() -> None:
    """A hybrid model resumes a repeated prompt at the checkpoint 4 tokens before its end."""
    hybrid = CacheProbe(slot=0, first_prompt_tokens=30, second_cache_n=26, second_prompt_n=4)
    result = check_cache(good_facts(cache=hybrid))
    assert result.ok
    assert "checkpoint 4 tokens before the end" in result.detail
    short = CacheProbe(slot=0, first_prompt_tokens=30, second_cache_n=25, second_prompt_n=5)
    assert not check_cache(good_facts(cache=short)).ok


def test_pool_probe_against_the_recorded_pool() -> None:
    cleared = PoolProbe(slot=0, other_slot=1, first_prompt_tokens=30, again_cache_n=0)
    result = check_pool(good_facts(pool=cleared), EXPECTED)
    assert not result.ok
    assert (result.expected, result.actual) == (POOL_KEPT, POOL_CLEARED)
    assert result.detail == "slot 0: cache_n 0 of 30 after a request on slot 1"
    unified = EXPECTED.model_copy(update={"idle_slots_cleared": True})
    assert check_pool(good_facts(pool=cleared), unified).ok
    assert not check_pool(good_facts(), unified).ok


def test_pool_probe_on_one_slot_and_when_it_broke() -> None:
    alone = PoolProbe(slot=0)
    assert alone.cleared is False
    assert check_pool(good_facts(pool=alone), EXPECTED).ok
    broken = PoolProbe(slot=0, other_slot=1, failure="request on slot 1: silence")
    result = check_pool(good_facts(pool=broken), EXPECTED)
    assert (result.ok, result.detail) == (False, "request on slot 1: silence")
    assert broken.cleared is None


def test_caps_not_recorded_are_not_compared() -> None:
    """An expectation written from the inference contract records the hash, not the caps."""
    from_contract = EXPECTED.model_copy(update={"caps": None})
    props = good_props(caps={"supports_tools": False})
    assert check_template(good_facts(props=props), from_contract).ok


def test_cache_probe_whose_request_broke_fails_with_the_failure() -> None:
    broken = CacheProbe(slot=0, failure="first request: silence")
    result = check_cache(good_facts(cache=broken))
    assert (result.ok, result.detail) == (False, "first request: silence")


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"progress_events": 0}, "no progress events"),
        ({"token_counts": 1}, "no per-token timings"),
        ({"control_answer": "no active completion for this id"}, "control call not accepted"),
        ({"control_answer": None}, "never sent"),
        ({"complete": False}, "did not end with [DONE]"),
        ({"failure": "the stream broke: reset"}, "the stream broke"),
    ],
)
def test_stream_probe_names_what_is_missing(change: dict[str, object], named: str) -> None:
    stream = good_facts().stream
    assert stream is not None
    stream = dataclasses.replace(stream, **change)  # type: ignore[arg-type]
    result = check_stream(good_facts(stream=stream))
    assert not result.ok
    assert named in result.detail


def test_render_probe_failure_carries_the_servers_message() -> None:
    render = RenderProbe(failure="tool round: llama-server answered 500: Failed to parse")
    result = check_render(good_facts(render=render))
    assert (result.ok, result.actual) == (False, "rejected")
    assert "Failed to parse" in result.detail


def test_probes_not_run_fail_with_the_reason() -> None:
    why = {"cache": "not run: slot 0 does not exist", "stream": "not run: slot 0 does not exist"}
    facts = good_facts(cache=None, stream=None, render=None, missing=why)
    results = {r.name: r for r in run_checks(facts, EXPECTED)}
    assert results["cache probe"].detail == "not run: slot 0 does not exist"
    assert results["stream probe"].detail == "not run: slot 0 does not exist"
    assert results["render probe"].detail == "not gathered"
    assert not any(results[n].ok for n in ("cache probe", "stream probe", "render probe"))


def test_template_answers_are_informational_and_never_fail_the_run() -> None:
    probe = TemplateProbe(TemplateAnswer.NO, TemplateAnswer.NO, "prompts differ at character 9")
    results = run_checks(good_facts(template=probe), EXPECTED)
    assert passed(results)
    info = template_info(good_facts(template=probe))
    assert [r.actual for r in info] == ["no", "no"]
    assert format_result(info[1]) == (
        "info  tool turn + user extends prompt: no (best: yes) (prompts differ at character 9)"
    )


def test_template_answer_unknown_when_the_probe_did_not_run() -> None:
    info = template_info(good_facts(template=None, missing={"template": "unreachable"}))
    assert [r.actual for r in info] == ["unknown", "unknown"]


def test_expectation_from_facts_records_what_the_server_reports() -> None:
    facts = good_facts(props=good_props(n_ctx_per_slot=8192, total_slots=4))
    recorded = expectation_from_facts(facts)
    assert recorded.build == 11434
    assert recorded.build_info == "b11434-pypi-sdist"
    assert (recorded.n_ctx_per_slot, recorded.total_slots) == (8192, 4)
    assert recorded.template_sha256 == EXPECTED.template_sha256
    assert recorded.idle_slots_cleared is False
    assert passed(run_checks(facts, recorded))


def test_expectation_from_facts_refuses_without_props_or_build_number() -> None:
    with pytest.raises(ExpectationsError, match="cannot record: GET /props failed"):
        expectation_from_facts(good_facts(props=None, missing={"props": "GET /props failed"}))
    with pytest.raises(ExpectationsError, match="no build number"):
        expectation_from_facts(good_facts(props=good_props(build_info="custom")))


def test_other_weights_behind_the_same_model_id_are_a_change_of_server() -> None:
    updated = dataclasses.replace(WEIGHTS, file="m-v2.gguf", size=96_576_800)
    reading = dataclasses.replace(READING, weights=updated)
    results = run_checks(good_facts(reading=reading), EXPECTED)
    assert failing(results) == ["model weights"]
    weights = next(r for r in results if r.name == "model weights")
    assert weights.detail == "file: m.gguf -> m-v2.gguf; size: 96576768 -> 96576800"
    assert format_result(weights) == (
        "FAIL  model weights: expected m.gguf (Q4_1, 96,576,768 bytes, 134,515,008 params), "
        "got m-v2.gguf (Q4_1, 96,576,800 bytes, 134,515,008 params) "
        "(file: m.gguf -> m-v2.gguf; size: 96576768 -> 96576800)"
    )


def test_recorded_weights_the_server_no_longer_reports_fail() -> None:
    reading = dataclasses.replace(READING, weights=None)
    results = run_checks(good_facts(reading=reading), EXPECTED)
    assert failing(results) == ["model weights"]


def test_the_idle_policy_is_said_as_the_server_tells_it() -> None:
    results = run_checks(good_facts(), EXPECTED)
    idle = next(r for r in results if r.name == "idle policy")
    assert format_result(idle) == (
        "info  idle policy: the model sleeps after 21600 s idle; the router holds at most 4 "
        "models; loads a model on demand: yes; the model is awake now"
    )
    asleep = dataclasses.replace(READING, status=ModelStatus.ASLEEP, sleep_idle_s=None)
    single = run_checks(good_facts(reading=asleep, router=None), EXPECTED)
    idle = next(r for r in single if r.name == "idle policy")
    assert idle.actual == ("the server does not say when the model sleeps; the model is asleep now")


def test_harness_slots_are_counted_from_props_where_slots_was_not_asked() -> None:
    facts = good_facts(slots=None, harness_slots=(0, 1))
    assert check_harness_slots(facts).ok
    assert not check_harness_slots(good_facts(slots=None, harness_slots=(2,))).ok
