"""One completion on one slot: prompt processing with the cache arithmetic, then generation.

The engine updates the slot as it goes (what is evaluated is kept, even when the request is
cancelled half way) and reports progress, tokens and the end to a :class:`CompletionSink`, which
decides what reaches the wire.
"""

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import anyio.lowlevel

from .chunks import Timings
from .model import FinishReason, Generation, Step
from .slots import Slot, TaskInfo


@dataclass
class Pace:
    """How fast the fake works; None means as fast as possible (no real time spent)."""

    tokens_per_second: float | None = None
    prompt_tokens_per_second: float | None = None
    batch_size: int = 512

    async def evaluate(self, n_tokens: int) -> None:
        await _spend(n_tokens, self.prompt_tokens_per_second)

    async def generate(self) -> None:
        await _spend(1, self.tokens_per_second)


async def _spend(n_tokens: int, per_second: float | None) -> None:
    if per_second:
        await anyio.sleep(n_tokens / per_second)
    else:
        await anyio.lowlevel.checkpoint()


@dataclass(frozen=True)
class Progress:
    total: int
    cache: int
    processed: int
    time_ms: int


class CompletionSink(Protocol):
    async def progress(self, progress: Progress, timings: Timings) -> None: ...

    async def token(self, step: Step, first: bool, timings: Timings) -> None: ...

    async def finished(self, finish_reason: FinishReason, timings: Timings) -> None: ...


@dataclass
class CompletionJob:
    """Everything a completion needs once it holds a slot."""

    slot: Slot
    prompt: list[str]
    generation: Generation
    pace: Pace
    id_task: int
    cache_prompt: bool = True
    n_predict: int = -1
    params: dict[str, Any] = field(default_factory=dict)
    timings: Timings = field(default_factory=Timings)


async def run_completion(job: CompletionJob, sink: CompletionSink) -> FinishReason:
    """Evaluate the prompt, generate, and return the finish reason."""
    await _evaluate_prompt(job, sink)
    return await _generate(job, sink)


async def _evaluate_prompt(job: CompletionJob, sink: CompletionSink) -> None:
    slot, prompt, timings = job.slot, job.prompt, job.timings
    cache_n = slot.take_prompt(prompt, cache_prompt=job.cache_prompt)
    task = TaskInfo(job.id_task, len(prompt), cache_n, cache_n, params=job.params)
    task.n_remain = job.n_predict
    slot.task = task
    timings.cache_n, timings.prompt_n = cache_n, len(prompt) - cache_n
    started = time.monotonic()
    # The first progress event is "0 %" and carries zero timings.
    await sink.progress(Progress(len(prompt), cache_n, cache_n, 0), Timings())
    processed = cache_n
    while processed < len(prompt):
        batch = prompt[processed : processed + max(job.pace.batch_size, 1)]
        await job.pace.evaluate(len(batch))
        slot.cached.extend(batch)
        processed += len(batch)
        task.n_prompt_tokens_processed = processed
        elapsed_ms = (time.monotonic() - started) * 1e3
        timings.prompt_ms = elapsed_ms
        await sink.progress(Progress(len(prompt), cache_n, processed, int(elapsed_ms)), timings)


async def _generate(job: CompletionJob, sink: CompletionSink) -> FinishReason:
    slot, timings, task = job.slot, job.timings, job.slot.task
    assert task is not None
    started = time.monotonic()
    sampled: str | None = None  # the last sampled token: evaluated only when the next is made
    finish: FinishReason
    while True:
        if 0 <= job.n_predict <= timings.predicted_n:
            finish = "length"
            break
        if len(job.prompt) + timings.predicted_n >= slot.n_ctx:
            finish = "length"  # the slot is full and context shift is off
            break
        step = job.generation.next_step()
        if step is None:
            finish = job.generation.finish_reason
            break
        await job.pace.generate()
        if sampled is not None:
            slot.cached.append(sampled)
        sampled = step.piece
        timings.predicted_n += 1
        timings.predicted_ms = (time.monotonic() - started) * 1e3
        task.n_decoded = timings.predicted_n
        if job.n_predict >= 0:
            task.n_remain = job.n_predict - timings.predicted_n
        await sink.token(step, timings.predicted_n == 1, timings)
    task.has_next_token = False
    await sink.finished(finish, timings)
    return finish
