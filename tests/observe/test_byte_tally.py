"""brokerd's byte counts reach the metric in steps: a scrape during a long stream sees them grow,
and a chunk costs an addition, not the metric's lock."""

from brokerd.observe.metrics import BrokerdMetrics
from brokerd.observe.middleware import FLUSH_BYTES, ByteTally


def test_bytes_reach_the_metric_every_flush_bytes_and_at_the_end() -> None:
    counter = BrokerdMetrics().bytes.labels("infer", "to_box")
    tally = ByteTally(counter)
    tally.add(FLUSH_BYTES - 1)
    assert counter._value.get() == 0
    tally.add(2)  # a long stream: the scrape sees it grow
    assert counter._value.get() == FLUSH_BYTES + 1
    tally.add(10)
    tally.flush()  # the request's end
    assert counter._value.get() == FLUSH_BYTES + 11
    tally.flush()
    assert counter._value.get() == FLUSH_BYTES + 11
