"""The self-test's checks: facts gathered from the server against the recorded expectation. Pure.

Each check returns one ``CheckResult`` that reads as one line: its name, what was expected, what
the server gave. A check whose facts could not be gathered fails with the reason; it never passes
by default. Informational results (the template probe) are shown but do not decide the verdict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from loopd.engine.cacheloss import CHECKPOINT_BEFORE_END, LOSS_TOLERANCE
from loopd.engine.modelstate import Weights, template_sha256
from loopd.engine.request import ANY_SLOT
from loopd.engine.thinkcap import SUCCESS
from loopd.selftest.expected import ExpectationsError, ModelExpectation, build_number
from loopd.selftest.facts import ServerFacts
from loopd.selftest.template import TemplateAnswer

NOT_RECORDED = "(not recorded: run `loopd selftest --record`)"
# A prompt sent again on a hybrid model resumes at the checkpoint ``CHECKPOINT_BEFORE_END`` tokens
# before its end (``loopd.engine.cacheloss``, where the turn engine accepts the same for a resend).


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    expected: str
    actual: str
    detail: str = ""
    informational: bool = False


def _not_run(name: str, expected: str, why: str) -> CheckResult:
    return CheckResult(name, False, expected, "not checked", why)


def check_server(facts: ServerFacts, expected: ModelExpectation | None) -> CheckResult:
    """1. Reachable and healthy, and the build number is the recorded one."""
    name = "server"
    want = f"healthy, build {expected.build}" if expected else f"healthy, build {NOT_RECORDED}"
    health = facts.health
    if not health.reachable:
        return CheckResult(name, False, want, "unreachable", health.detail)
    if not health.healthy:
        return CheckResult(name, False, want, "not healthy", health.detail)
    if facts.props is None:
        return CheckResult(name, False, want, "healthy, build unknown", facts.why_missing("props"))
    info = facts.props.build_info
    number = build_number(info)
    if number is None:
        return CheckResult(name, False, want, f"healthy, build_info {info!r} has no build number")
    ok = expected is not None and number == expected.build
    return CheckResult(name, ok, want, f"healthy, build {number} ({info})")


def check_model(facts: ServerFacts) -> CheckResult:
    """2. The model id is served: listed by the router, or the single model's alias."""
    name = "model served"
    want = facts.model
    listing = facts.listing
    if listing is None:
        return _not_run(name, want, facts.why_missing("listing"))
    if facts.model in listing.served:
        status = f" (router status {listing.status})" if listing.router and listing.status else ""
        return CheckResult(name, True, want, f"{facts.model}{status}")
    if not listing.router and facts.props is not None and facts.props.model_alias == facts.model:
        return CheckResult(name, True, want, f"{facts.model} (single-model server)")
    served = ", ".join(listing.served) or "nothing"
    return CheckResult(name, False, want, f"not served; the server serves {served}")


def check_template(facts: ServerFacts, expected: ModelExpectation | None) -> CheckResult:
    """3. The chat template (and tool-use template) hash, and the caps derived from them."""
    name = "chat template"
    want = (
        f"sha256 {expected.template_sha256} ({expected.template_bytes} bytes)"
        if expected
        else NOT_RECORDED
    )
    props = facts.props
    if props is None:
        return _not_run(name, want, facts.why_missing("props"))
    digest = template_sha256(props.chat_template, props.tool_use_template)
    size = len(props.chat_template.encode("utf-8"))
    got = f"sha256 {digest} ({size} bytes)"
    if expected is None:
        return CheckResult(name, False, want, got)
    caps_changed = _caps_changes(expected.caps, props.caps) if expected.caps is not None else []
    detail = f"caps differ: {'; '.join(caps_changed)}" if caps_changed else ""
    ok = digest == expected.template_sha256 and not caps_changed
    return CheckResult(name, ok, want, got, detail)


def check_context(facts: ServerFacts, expected: ModelExpectation | None) -> CheckResult:
    """4a. Context per slot (what a session may grow to before compaction)."""
    name = "context per slot"
    want = str(expected.n_ctx_per_slot) if expected else NOT_RECORDED
    if facts.props is None:
        return _not_run(name, want, facts.why_missing("props"))
    got = facts.props.n_ctx_per_slot
    ok = expected is not None and got == expected.n_ctx_per_slot
    return CheckResult(name, ok, want, str(got))


def check_slot_count(facts: ServerFacts, expected: ModelExpectation | None) -> CheckResult:
    """4b. The number of slots (the server's ``--parallel``)."""
    name = "slots"
    want = str(expected.total_slots) if expected else NOT_RECORDED
    if facts.props is None:
        return _not_run(name, want, facts.why_missing("props"))
    got = facts.props.total_slots
    return CheckResult(name, expected is not None and got == expected.total_slots, want, str(got))


def check_harness_slots(facts: ServerFacts) -> CheckResult:
    """4c. Every slot loopd pins sessions to exists (an id past the end silently wraps around):
    as ``/slots`` lists them, or, where it was not asked (it wakes a sleeping model), as many
    as ``/props`` counts."""
    name = "harness slots"
    want = _ids(facts.harness_slots)
    if facts.slots is not None:
        present = {slot.id for slot in facts.slots}
    elif facts.props is not None:
        present = set(range(facts.props.total_slots))
    else:
        return _not_run(name, want, facts.why_missing("slots"))
    absent = [s for s in facts.harness_slots if s not in present]
    if absent:
        got = f"{_ids(absent)} missing; the server has {_ids(sorted(present)) or 'no slots'}"
        return CheckResult(name, False, want, got)
    return CheckResult(name, True, want, f"{want} present of {len(present)}")


def check_weights(facts: ServerFacts, expected: ModelExpectation | None) -> CheckResult:
    """4d. The model's weights are the recorded ones (what the server reports of its file and
    the arguments that give a state its meaning): other weights behind the same model id are a
    change of server, and no save of the old ones is restored into them."""
    name = "model weights"
    recorded = expected.weights if expected is not None else None
    want = recorded.describe() if recorded is not None else NOT_RECORDED
    reading = facts.reading
    if reading is None:
        return _not_run(name, want, facts.why_missing("listing"))
    if reading.weights is None:
        why = reading.detail or "the server reports no model file"
        if recorded is None:
            return CheckResult(name, True, want, "not reported", why)
        return CheckResult(name, False, want, "not reported", why)
    got = reading.weights.describe()
    if recorded is None:  # recorded before loopd bound saves to weights: nothing to hold it to
        return CheckResult(name, True, want, got, "not recorded: nothing to compare")
    changed = _weights_changes(recorded, reading.weights)
    return CheckResult(name, not changed, want, got, "; ".join(changed))


def check_cache(facts: ServerFacts) -> CheckResult:
    """5. A request repeated reuses the first one's prompt: on a harness slot, or where the
    server places it when loopd will not pin (the pool probe's answer)."""
    name = "cache probe"
    probe = facts.cache
    if probe is None:
        want = "the second request reuses the first's prompt"
        return _not_run(name, want, facts.why_missing("cache"))
    where = f"slot {probe.slot}" if probe.slot != ANY_SLOT else "placed by the server"
    if probe.first_prompt_tokens is None or probe.second_cache_n is None:
        return CheckResult(name, False, "two completed requests", "failed", probe.failure)
    floor = max(probe.first_prompt_tokens - 1 - LOSS_TOLERANCE, 0)
    checkpoint = probe.first_prompt_tokens - CHECKPOINT_BEFORE_END
    want = f"cache_n >= {floor} of {probe.first_prompt_tokens} prompt tokens"
    got = f"cache_n {probe.second_cache_n}, prompt_n {probe.second_prompt_n}"
    at_checkpoint = probe.second_cache_n == checkpoint and checkpoint > 0
    ok = (probe.second_cache_n >= floor or at_checkpoint) and not probe.failure
    if at_checkpoint and not probe.failure:
        where += (
            f"; resumed at the checkpoint {CHECKPOINT_BEFORE_END} tokens before the end "
            "(a hybrid model's recurrent state)"
        )
    return CheckResult(name, ok, want, got, probe.failure or where)


POOL_CLEARED = (
    "a slot is cleared once another slot runs (unified pool, --cache-idle-slots): "
    "a pinned session loses its cache"
)
POOL_KEPT = "a slot keeps its prompt while another slot runs"


def check_pool(facts: ServerFacts, expected: ModelExpectation | None) -> CheckResult:
    """5b. Does a slot keep its prompt while another slot runs? (``PoolProbe``.)"""
    name = "slot pool"
    recorded = expected.idle_slots_cleared if expected is not None else None
    want = NOT_RECORDED if recorded is None else (POOL_CLEARED if recorded else POOL_KEPT)
    probe = facts.pool
    if probe is None:
        return _not_run(name, want, facts.why_missing("pool"))
    if probe.failure:
        return CheckResult(name, False, want, "failed", probe.failure)
    if probe.other_slot is None:
        return CheckResult(name, recorded is False, want, POOL_KEPT, "the server has one slot")
    cleared = probe.cleared
    got = POOL_CLEARED if cleared else POOL_KEPT
    detail = (
        f"slot {probe.slot}: cache_n {probe.again_cache_n} of {probe.first_prompt_tokens} "
        f"after a request on slot {probe.other_slot}"
    )
    return CheckResult(name, recorded is not None and cleared == recorded, want, got, detail)


def check_stream(facts: ServerFacts) -> CheckResult:
    """6. Progress events, per-token timings and the control call, all on one live stream."""
    name = "stream probe"
    want = "progress events, per-token timings, control call accepted"
    probe = facts.stream
    if probe is None:
        return _not_run(name, want, facts.why_missing("stream"))
    missing: list[str] = []
    if probe.progress_events < 1:
        missing.append("no progress events (return_progress ignored?)")
    if probe.token_counts < 2:
        missing.append("no per-token timings (timings_per_token ignored?)")
    if probe.control_answer != SUCCESS:
        answer = probe.control_answer or "never sent: the stream ended before the first token"
        missing.append(f"control call not accepted: {answer}")
    if not probe.complete and not probe.failure:
        missing.append("the stream did not end with [DONE]")
    got = (
        f"{probe.progress_events} progress, {probe.timings_events} timings "
        f"({probe.token_counts} token counts), control {probe.control_answer or 'not sent'}"
    )
    problems = "; ".join([probe.failure, *missing] if probe.failure else missing)
    return CheckResult(name, not problems, want, got, problems or f"slot {probe.slot}")


def check_render(facts: ServerFacts) -> CheckResult:
    """7. loopd's exact request bodies render: a template may reject loopd's settings."""
    name = "render probe"
    want = "loopd's requests render through /apply-template"
    probe = facts.render
    if probe is None:
        return _not_run(name, want, facts.why_missing("render"))
    if probe.failure:
        return CheckResult(name, False, want, "rejected", probe.failure)
    return CheckResult(name, True, want, f"{probe.rendered} conversations rendered")


def idle_info(facts: ServerFacts) -> CheckResult:
    """The server's idle policy and the model's state, as the server tells them without waking
    it: informational (loopd is silent while idle whatever the policy, ``loopd.engine.quiet``)."""
    reading = facts.reading
    sleep = reading.sleep_idle_s if reading is not None else None
    if sleep is None:
        parts = ["the server does not say when the model sleeps"]
    else:
        parts = [f"the model sleeps after {sleep} s idle" if sleep > 0 else "it never sleeps"]
    router = facts.router
    if router is not None and router.max_instances is not None:
        most = router.max_instances
        parts.append(f"the router holds {f'at most {most}' if most else 'any number of'} models")
    if router is not None and router.models_autoload is not None:
        parts.append(f"loads a model on demand: {'yes' if router.models_autoload else 'no'}")
    parts.append(f"the model is {facts.model_status.value} now")
    detail = reading.detail if reading is not None else facts.why_missing("listing")
    return CheckResult("idle policy", True, "", "; ".join(parts), detail, informational=True)


def template_info(facts: ServerFacts) -> list[CheckResult]:
    """The template probe: informational, it explains cache losses rather than refusing."""
    probe = facts.template
    detail = probe.detail if probe is not None else facts.why_missing("template")
    keeps = probe.keeps_past_reasoning if probe is not None else TemplateAnswer.UNKNOWN
    prefix = probe.tool_turn_prefix if probe is not None else TemplateAnswer.UNKNOWN
    return [
        CheckResult("keeps past reasoning", True, "yes", keeps.value, "", informational=True),
        CheckResult(
            "tool turn + user extends prompt", True, "yes", prefix.value, detail, informational=True
        ),
    ]


# What a thread loses without durable sessions, said once where the self-test reports them.
WITHOUT_DURABLE = (
    "without them, a thread re-reads its whole prompt after a server restart, a model reload, "
    "the server's idle sleep or an eviction (start the server with --slot-save-path DIR)"
)


def durable_info(facts: ServerFacts) -> CheckResult:
    """Durable sessions: informational, as the server works without them (as before)."""
    name = "durable sessions"
    want = "a slot saved and restored"
    probe = facts.durable
    if probe is None:
        return CheckResult(
            name, True, want, "not run", f"{facts.why_missing('durable')}", informational=True
        )
    if probe.available:
        got = f"available ({probe.n_saved} tokens saved and restored)"
        return CheckResult(name, True, want, got, f"slot {probe.slot}", informational=True)
    detail = f"{probe.failure}; {WITHOUT_DURABLE}"
    return CheckResult(name, True, want, "not available", detail, informational=True)


def layout_checks(facts: ServerFacts, expected: ModelExpectation | None) -> list[CheckResult]:
    """The checks that need no live request: build, model, template, context and slots."""
    return [
        check_server(facts, expected),
        check_model(facts),
        check_template(facts, expected),
        check_context(facts, expected),
        check_slot_count(facts, expected),
        check_harness_slots(facts),
        check_weights(facts, expected),
        idle_info(facts),
    ]


def run_checks(facts: ServerFacts, expected: ModelExpectation | None) -> list[CheckResult]:
    """Every check, in the order they are printed."""
    return [
        *layout_checks(facts, expected),
        check_cache(facts),
        check_pool(facts, expected),
        check_stream(facts),
        check_render(facts),
        *template_info(facts),
        durable_info(facts),
    ]


def passed(results: list[CheckResult]) -> bool:
    return all(r.ok for r in results if not r.informational)


def expectation_from_facts(facts: ServerFacts) -> ModelExpectation:
    """What ``--record`` writes: the server's values as they are now."""
    props = facts.props
    if props is None:
        raise ExpectationsError(f"cannot record: {facts.why_missing('props')}")
    number = build_number(props.build_info)
    if number is None:
        raise ExpectationsError(
            f"cannot record: build_info {props.build_info!r} has no build number"
        )
    return ModelExpectation(
        model=facts.model,
        build=number,
        build_info=props.build_info,
        template_sha256=template_sha256(props.chat_template, props.tool_use_template),
        template_bytes=len(props.chat_template.encode("utf-8")),
        n_ctx_per_slot=props.n_ctx_per_slot,
        total_slots=props.total_slots,
        caps=dict(props.caps),
        idle_slots_cleared=facts.pool.cleared if facts.pool is not None else None,
        weights=facts.reading.weights if facts.reading is not None else None,
        fingerprint=facts.reading.fingerprint(facts.model) if facts.reading is not None else None,
        durable_available=facts.durable.available if facts.durable is not None else None,
    )


def _weights_changes(recorded: Weights, actual: Weights) -> list[str]:
    old, new = dataclasses.asdict(recorded), dataclasses.asdict(actual)
    return [f"{key}: {old[key]} -> {new[key]}" for key in old if old[key] != new[key]]


def _caps_changes(recorded: dict[str, bool], actual: dict[str, bool]) -> list[str]:
    names = list(recorded) + [n for n in actual if n not in recorded]
    return [
        f"{n}: {_flag(recorded.get(n))} -> {_flag(actual.get(n))}"
        for n in names
        if recorded.get(n) != actual.get(n)
    ]


def _flag(value: bool | None) -> str:
    return "absent" if value is None else str(value).lower()


def _ids(ids: Sequence[int]) -> str:
    return ",".join(str(i) for i in ids)
