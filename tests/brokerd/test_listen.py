"""brokerd.listen: throttled logging (pure), and the guarded accept loop on a real socket."""

import logging

import pytest

from brokerd.listen import ThrottledLog


def test_a_throttled_log_says_how_many_it_left_out(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    log = ThrottledLog(logging.getLogger("throttled"), interval_s=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="throttled"):
        assert log.warning("accept failed: %s", "EMFILE")
        for step in range(1, 100):
            now[0] = step * 0.01
            assert not log.warning("accept failed: %s", "EMFILE")
        now[0] = 12.0
        assert log.warning("accept failed: %s", "EMFILE")
    assert [record.getMessage() for record in caplog.records] == [
        "accept failed: EMFILE",
        "accept failed: EMFILE (and 99 more like it in the last 12 s)",
    ]
