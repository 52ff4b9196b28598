"""A fake llama-server (build 11434, router or single-model mode), byte-compatible on the wire.

Use it in-process::

    fake = FakeLlama([ModelSpec("m", n_slots=2, n_ctx=4096)])
    fake.push(ScriptedReply(reasoning="...", content="..."))
    async with serve_fake_llama(fake, uds=path) as running:
        async with running.client() as client: ...

or as a process: ``python -m loopd_dev.fakes.llama --uds PATH`` (driven over ``/_fake/*``).
"""

from .engine import Pace
from .errors import ApiError
from .faults import Faults, Trigger
from .model import ScriptedReply, ScriptedToolCall
from .render import TemplateOptions
from .server import RunningFake, serve_fake_llama
from .state import FakeLlama, ModelSpec, RequestRecord

__all__ = [
    "ApiError",
    "FakeLlama",
    "Faults",
    "ModelSpec",
    "Pace",
    "RequestRecord",
    "RunningFake",
    "ScriptedReply",
    "ScriptedToolCall",
    "TemplateOptions",
    "Trigger",
    "serve_fake_llama",
]
