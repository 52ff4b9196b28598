"""The fake Mattermost as its README starts it: ``python -m loopd_dev.fakes.mattermost --port 0``
prints where it listens, and answers there."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx


def test_the_command_of_the_readme_listens_on_a_free_port() -> None:
    command = [sys.executable, "-m", "loopd_dev.fakes.mattermost", "--port", "0"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            announced = json.loads(process.stdout.readline())
            answer = httpx.get(announced["base_url"] + "/api/v4/system/ping", timeout=30)
            assert answer.status_code == 200
            assert set(announced["users"]) >= {"loopd", "alice", "bob"}
        finally:
            process.terminate()
            process.wait(timeout=30)
