"""Shared pytest configuration.

- anyio runs on asyncio, the backend loopd uses in production, with the fix of
  ``loopcommon.anyio_unix_connect`` applied as loopd's and brokerd's entry points apply it.
- ``real_server``: the real llama-server (build 11434, router mode, SmolLM2-135M), started once
  per test session on a Unix socket. It is provisioned by ``make llama-server``; when it is missing
  the tests that need it FAIL with the command to run. They are never skipped.
- ``certificate``: a self-signed certificate for localhost, for the HTTP clients' TLS tests.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopcommon import anyio_unix_connect
from loopd_dev import devserver


def pytest_configure(config: pytest.Config) -> None:
    anyio_unix_connect.apply()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[devserver.RunningServer]:
    """The real router with both presets loaded, on a Unix socket; shared by the whole session."""
    workdir = tmp_path_factory.mktemp("llama-server")
    try:
        server = devserver.start(
            workdir,
            devserver.default_cache_dir(),
            socket_path=workdir / "llama.sock",
            load=(devserver.PLAIN_MODEL, devserver.THINKING_MODEL),
        )
    except devserver.DevServerError as exc:
        pytest.fail(f"the real llama-server is required and could not start: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for localhost and its key, made by openssl."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", "/CN=localhost", "-addext",
         "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key
