"""The self-test says whether durable sessions are available: its probe's slot saved and
restored on a server started with ``--slot-save-path``, and one line of what is lost on a
server without it; ``LOOPD_DURABLE`` auto follows that answer."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from loopcommon.slotfiles import is_slot_file_name
from loopd.config import CORE_TOOLS_FILE, load_settings
from loopd.engine.durable import DurableMode, decide_durable
from loopd.selftest.checks import WITHOUT_DURABLE
from loopd.selftest.run import format_report, run_selftest
from loopd.tools.spec import load_tools_spec
from loopd_dev import devserver
from tests.durable.test_durable_real import Restartable, restartable

pytestmark = [pytest.mark.real_server, pytest.mark.anyio]
__all__ = ["restartable"]  # the fixture, shared with the restart tests


async def test_the_self_test_finds_durable_sessions_where_the_server_can_save(
    restartable: Callable[..., Restartable],
) -> None:
    server = restartable(devserver.PLAIN_MODEL)
    settings = load_settings(infer_url=server.url, model=devserver.PLAIN_MODEL)
    report = await run_selftest(settings, tools_text=load_tools_spec(CORE_TOOLS_FILE).text)
    assert report.durable_available is True
    assert report.facts.durable is not None
    assert report.facts.durable.n_saved == report.facts.durable.n_restored
    assert decide_durable(DurableMode.AUTO, selftest=report.durable_available, recorded=None).on
    assert "durable sessions: available (" in format_report(report)
    # The probe's file is of loopd's shape, in the server's own folder.
    assert [is_slot_file_name(p.name) for p in server.saves.iterdir()] == [True]


async def test_the_self_test_says_what_is_lost_without_them(
    real_server: devserver.RunningServer,
) -> None:
    settings = load_settings(infer_url=real_server.url, model=devserver.PLAIN_MODEL)
    report = await run_selftest(settings, tools_text=load_tools_spec(CORE_TOOLS_FILE).text)
    assert report.durable_available is False
    assert not decide_durable(DurableMode.AUTO, selftest=report.durable_available, recorded=None).on
    text = format_report(report)
    assert "durable sessions: not available" in text
    assert WITHOUT_DURABLE in text
    assert report.to_json()["durable"] == {"available": False}
