"""The command line."""

import pytest

from bench.cli import parse_args


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
