"""Each terminal test ends the chats it started, pass or fail."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.terminal.support import end_chats


@pytest.fixture(autouse=True)
def _end_chats() -> Iterator[None]:
    try:
        yield
    finally:
        end_chats()
