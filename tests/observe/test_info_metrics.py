"""The metrics an operator reads first: which build runs, whether loopd is connected to
Mattermost (tests/chat/test_mattermost_gauge.py), how many answers were cut at max_tokens; and
no ``_created`` series in any scrape."""

from __future__ import annotations

from prometheus_client import generate_latest

from brokerd.observe.metrics import BrokerdMetrics
from loopcommon.version import installed_version
from loopd.observe.metrics import LoopdMetrics
from loopd.sessionlog.records import Perf, RequestKind, RequestRecord

VERSION = installed_version()


def scrape(registry: object) -> str:
    return generate_latest(registry).decode()  # type: ignore[arg-type]


def test_both_daemons_say_their_build_and_carry_no_created_series() -> None:
    loopd, brokerd = LoopdMetrics(), BrokerdMetrics()
    assert VERSION != "unknown"  # the tests run on the installed distribution
    assert loopd.registry.get_sample_value("loopd_build_info", {"version": VERSION}) == 1
    assert brokerd.registry.get_sample_value("brokerd_build_info", {"version": VERSION}) == 1
    loopd.turn_ended("answered")
    for text in (scrape(loopd.registry), scrape(brokerd.registry)):
        assert "_created" not in text
        assert "_total" in text  # the counters are there, only without their creation time


def test_an_answer_cut_at_max_tokens_is_counted_by_kind() -> None:
    metrics = LoopdMetrics()

    def record(finish_reason: str) -> RequestRecord:
        perf = Perf(outcome="complete", extra={"finish_reason": finish_reason})
        return RequestRecord(RequestKind.TURN, 0, 1, 2, "0" * 64, perf)

    metrics.request_recorded(record("stop"))
    metrics.request_recorded(record("length"))
    metrics.request_recorded(record("tool_calls"))
    assert metrics.registry.get_sample_value("loopd_answers_cut_total", {"kind": "turn"}) == 1
