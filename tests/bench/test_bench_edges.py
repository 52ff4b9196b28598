"""The edges section runs end to end on small runs: start-up, relay and the queue scenario, each
rendered beside a before run."""

from pathlib import Path

from bench import edges, queuewait, relay, startup


def test_start_up_measures_each_command_and_the_run_until_its_request(tmp_path: Path) -> None:
    found = startup.measure(tmp_path, tmp_path / "cache", repeats=1, peer=False)
    rows = found["rows"]
    assert "llm --version" not in rows
    assert found["llm"] == "not asked for"
    for name in ("python -c pass", "loopd --version", "loopd --help", "loopd run", "run total"):
        assert rows[name]["cpu_ms"] > 0, name
    # The request reaches the server before the run ends, and costs more than the interpreter.
    assert rows["loopd run"]["cpu_ms"] <= rows["run total"]["cpu_ms"]
    assert rows["loopd run"]["cpu_ms"] > rows["python -c pass"]["cpu_ms"]
    text = "\n".join(startup.render(found, found))
    assert "| `loopd --version` | < 100 |" in text
    assert "`llm --version` is not measured: not asked for." in text


def test_the_relay_is_measured_beside_loopd_and_the_splice(tmp_path: Path) -> None:
    found = relay.measure(tmp_path, counts=(200,), repeats=1)
    row = found["rows"]["200"]
    assert row["loopd_ms"] > 0
    assert row["brokerd_ms"] > 0
    assert row["splice_ms"] > 0
    text = "\n".join(relay.render(found, found))
    assert f"| 200 | {row['loopd_ms']:,.0f} | {row['brokerd_ms']:,.0f} |" in text


def test_a_tree_beside_is_measured_in_the_same_run(tmp_path: Path) -> None:
    this_tree = Path(__file__).parents[2]  # beside itself: the figures need only exist
    found = relay.measure(tmp_path, counts=(200,), repeats=1, beside=this_tree)
    earlier = found["rows"]["200"]["before"]
    assert earlier["loopd_ms"] > 0
    assert earlier["brokerd_ms"] > 0
    text = "\n".join(relay.render(found))
    assert f"Before: the brokerd of `{this_tree}`" in text
    assert (
        f"| {earlier['brokerd_ms']:,.0f} | {earlier['brokerd_ms'] / earlier['loopd_ms']:.2f} |"
        in text
    )


def test_the_queue_scenario_s_recorded_parts_add_up_to_the_wait_seen() -> None:
    rows = queuewait.measure()
    assert [row["scenario"] for row in rows] == [
        "behind another thread in loopd",
        "behind another client on the server",
    ]
    for row in rows:
        assert row["recorded_ms"] is not None
        assert row["recorded_ms"] <= row["outside_ms"] + 0.5  # each part rounded to 0.1 ms
    thread, client = (row["parts"] for row in rows)
    assert thread["loopd_queue_ms"] > thread["server_queue_ms"]
    assert client["server_queue_ms"] > client["loopd_queue_ms"]


def test_the_recorded_before_run_is_there_to_compare_with() -> None:
    recorded = edges.before()
    assert recorded is not None
    assert set(recorded) >= {"startup", "relay", "queue"}
    assert recorded["tree"]
