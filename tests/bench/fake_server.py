"""The fake llama-server for the bench tests: the bench code runs against it end to end, fast."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from loopd_dev.devserver import PLAIN_MODEL, THINKING_MODEL
from loopd_dev.fakes.llama import (
    FakeLlama,
    ModelSpec,
    ScriptedReply,
    TemplateOptions,
    serve_fake_llama,
)


@asynccontextmanager
async def fake_server(
    *, drop_past_reasoning: bool = False, think_replies: Sequence[ScriptedReply] = ()
) -> AsyncIterator[str]:
    """Both presets' names on one fake router; yields loopd's URL for it (``unix:...``).

    ``think_replies`` are the thinking preset's first replies, in order (then its default).
    """
    template = TemplateOptions(drop_past_reasoning=drop_past_reasoning)
    fake = FakeLlama(
        [
            ModelSpec(PLAIN_MODEL, n_slots=2, n_ctx=16384),
            ModelSpec(THINKING_MODEL, n_slots=2, n_ctx=16384, template=template),
        ]
    )
    fake.push(*think_replies, model=THINKING_MODEL)
    with tempfile.TemporaryDirectory(prefix="bf") as tmp:
        socket_path = Path(tmp) / "llama.sock"
        async with serve_fake_llama(fake, uds=socket_path):
            yield f"unix:{socket_path}"
