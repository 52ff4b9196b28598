"""Fixtures for the proxy tests."""

import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short folder for sockets: a Unix socket path must stay under about 100 bytes, and
    pytest's tmp_path (with long parametrised test names) can exceed that."""
    path = Path(tempfile.mkdtemp(prefix="bk", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """brokerd's configure_logging replaces the root handlers; put pytest's back afterwards."""
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in saved_handlers:
        root.addHandler(handler)
    root.setLevel(saved_level)
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.NOTSET)
