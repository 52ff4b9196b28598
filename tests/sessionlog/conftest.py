from collections.abc import Iterator
from pathlib import Path

import pytest

from loopd.sessionlog import SessionLog
from tests.sessionlog.sessionlog_support import open_started


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "loopd.db"


@pytest.fixture
def log(db_path: Path) -> Iterator[SessionLog]:
    opened = open_started(db_path)
    yield opened
    opened.close()
