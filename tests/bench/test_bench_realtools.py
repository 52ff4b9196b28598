"""The real-tool section: chosen alone by its flag, and its tables from the measured figures."""

from bench.cli import parse_args
from bench.realtools import GuardRun, RealTools, Step, render


def test_the_real_tools_flag_chooses_the_section_alone() -> None:
    assert not parse_args([]).real_tools
    args = parse_args(["--real-tools"])
    assert args.real_tools
    assert args.command == "python -m bench --real-tools"


def test_the_section_shows_each_request_the_totals_and_the_guard() -> None:
    steps = [
        Step(1, 'list_dir({"path": "."})', 0, 959, 959, 980, "first request of the session"),
        Step(1, 'list_dir({"path": "."})', 978, 24, 24, 70, None),
    ]
    guard = [GuardRun(2, 3, 4.5, "the model repeated a call"), GuardRun(0, 16, 30.25, "stopped")]
    text = render(RealTools(steps, guard))
    assert '| 1 | 2 | `list_dir({"path": "."})` | 978 | 24 | 24 | 70 |  |' in text
    assert "| all | | | | 983 | 983 | 1050 | |" in text
    assert "| 2 | 3 | 4.5 | the model repeated a call |" in text
    assert "| 0 (off) | 16 | 30.2 | stopped |" in text
