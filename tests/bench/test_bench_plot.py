"""The plot is a PNG file."""

from pathlib import Path

from bench.plot import prompt_n_plot
from tests.bench.results_support import cache


def test_the_plot_is_written_as_png(tmp_path: Path) -> None:
    path = tmp_path / "plot.png"
    prompt_n_plot(cache().rows, path, "smollm2-think")
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert path.stat().st_size > 10_000
