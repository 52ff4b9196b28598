"""What a browser test asks of its screenshot: the size it was taken at, and a page drawn on it
(text and colours), not a blank or one flat fill."""

from __future__ import annotations

from pathlib import Path


def assert_drawn(shot: Path, *, least_height: int, least_width: int) -> None:
    from matplotlib import image  # a heavy import, for the browser tests only

    pixels = image.imread(shot)
    assert pixels.shape[0] >= least_height
    assert pixels.shape[1] >= least_width
    assert pixels.std() > 0.05, "the screenshot is not blank"
    colours = {tuple(p) for p in pixels.reshape(-1, pixels.shape[2])[::97].tolist()}
    assert len(colours) > 20, "the screenshot has text and colours, not one flat fill"
