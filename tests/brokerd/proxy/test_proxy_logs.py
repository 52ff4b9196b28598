"""brokerd's log: a warning provoked once per request is not written once per request."""

import logging

from brokerd.proxy.logs import ThrottleRepeats


def record(message: str, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord("uvicorn.error", level, __file__, 1, message, None, None)


def test_warnings_of_one_kind_are_capped_per_window_and_the_rest_counted() -> None:
    now = [0.0]
    throttle = ThrottleRepeats(limit=3, window_s=10.0, clock=lambda: now[0])
    passed = [throttle.filter(record("Invalid HTTP request received.")) for _ in range(10)]
    assert passed == [True] * 3 + [False] * 7
    assert throttle.filter(record("another kind"))
    assert throttle.filter(record("info lines pass", logging.INFO))
    now[0] = 10.0
    later = record("Invalid HTTP request received.")
    assert throttle.filter(later)
    assert later.getMessage() == "Invalid HTTP request received. (7 more like it were not logged)"
