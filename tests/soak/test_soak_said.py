"""What loopd said of durable sessions, as the soak reads it from loopd's JSON log."""

from __future__ import annotations

import json
from pathlib import Path

from soak.run import durable_line


def test_the_word_on_durable_sessions_is_read_from_the_line_on_the_server(tmp_path: Path) -> None:
    log = tmp_path / "loopd.log"
    said = (
        "requests pinned to each session's slot (the self-test); each slot has its own "
        "context; the template keeps past reasoning: unknown; durable sessions: on "
        "(LOOPD_DURABLE on)"
    )
    lines = [
        json.dumps({"msg": "serving Mattermost as @loopd"}),
        json.dumps({"msg": said}),
        '{"msg": "durable sessions: off (cut by a ki',  # a line cut by a kill
    ]
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert durable_line(log) == "durable sessions: on (LOOPD_DURABLE on)"
    assert durable_line(tmp_path / "missing.log") == ""
