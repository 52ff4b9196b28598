"""The command line."""

from pathlib import Path

import pytest

from bench.cli import parse_args, write_report


def test_defaults() -> None:
    args = parse_args([])
    assert args.repeats == 5
    assert not args.offline
    assert not args.production_shape
    assert args.out.name == "results"
    assert parse_args(["--production-shape"]).production_shape


def test_repeats_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--repeats", "0"])
    assert "--repeats must be at least 1" in capsys.readouterr().err


def test_the_report_names_the_command_that_made_it() -> None:
    assert parse_args([]).command == "make bench"
    args = parse_args(["--production-shape", "--append"])
    assert args.command == "python -m bench --production-shape --append"
    assert args.append


def test_append_keeps_the_days_earlier_report(tmp_path: Path) -> None:
    path = tmp_path / "2026-12-01.md"
    write_report(path, "# first\n", append=True)
    write_report(path, "# second\n", append=True)
    assert path.read_text() == "# first\n\n# second\n"
    write_report(path, "# third\n", append=False)
    assert path.read_text() == "# third\n"
