"""Where a hybrid model's cache goes: one session on one slot, every loss with its cause.

The tiny ``qwen35moe`` (docs/production-shape.md) loses cache for separate reasons, and this
benchmark takes them apart, one session on slot 0 of a server to itself:

- *the tokenizer at the prompt's end*: the model's tokenizer is SmolLM2's byte-level BPE (cut
  short, ``loopd_dev.hybrid_model``), whose pre-tokenizer splits a run of whitespace before a
  word. With thinking off the generation prompt ends in ``</think>`` and a ``\n\n`` token,
  which becomes two ``\n`` tokens once the replayed answer follows, so the new prompt diverges
  at the previous prompt's last token;
- *the reply re-tokenized*: the model's output is random tokens side by side, which are not
  what the tokenizer makes of the same text, so a generated reply replayed as text tokenizes
  to other tokens (a trained model's reply replays token for token);
- *checkpoints*: the recurrent state cannot be rolled back to an arbitrary token, only restored
  from a checkpoint, which the server takes 4 tokens (and 4 + ubatch) before the end of every
  prompt it reads and at the last user message; a prompt that diverges anywhere inside what the
  slot holds resumes at the latest checkpoint before the divergence.

Variants: scripted replies with thinking on (the generation prompt ends in ``<think>\n``, which
the replayed turn continues token for token: nothing for the tokenizer to change, the control),
scripted replies with thinking off, the model's own replies with thinking on (the every-turn
template, production's), and with thinking off. The same requests go to SmolLM2 for comparison
(the same tokenizer; no recurrent state, so it resumes at the divergence itself). Causes come
from the server's trace log (``bench/serverlog.py``) and from the server's own tokenizer: the
*divergence* is where the new prompt's tokens first differ from the previous prompt's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.errors import BenchError
from bench.ideal import common_prefix
from bench.serverlog import LogFollower, ServerSteps, parse
from loopd_dev import devserver

log = logging.getLogger("bench.hybrid")

TURNS = 5
CHECKPOINT_BEFORE_END = 4
HYBRID = "hybrid-alone"
DENSE = "dense-alone"
QUESTIONS = (
    "What should we check before the release?",
    "Which test failed last night?",
    "Who owns the parser?",
    "When is the next deploy?",
    "Summarise the thread.",
)


@dataclass(frozen=True)
class Variant:
    name: str
    scripted: bool  # scripted replies (max_tokens 1); else the model's own
    thinking: bool


VARIANTS = (
    Variant("scripted, thinking on", scripted=True, thinking=True),
    Variant("scripted, thinking off", scripted=True, thinking=False),
    Variant("model's replies, thinking on", scripted=False, thinking=True),
    Variant("model's replies, thinking off", scripted=False, thinking=False),
)


@dataclass(frozen=True)
class HybridRow:
    model: str  # "hybrid" or "dense"
    variant: str
    turn: int
    prompt_tokens: int
    held: int  # what the slot held after the previous request: prompt + generated - 1
    divergence: int | None  # tokens shared with the previous prompt (None for the first)
    cache_n: int
    prompt_n: int
    cause: str

    @property
    def lost(self) -> int:
        return max(self.held - self.cache_n, 0) if self.turn > 1 else 0


def explain(
    steps: ServerSteps,
    *,
    turn: int,
    hybrid: bool,
    previous_prompt: int,
    held: int,
    divergence: int,
    cache_n: int,
    scripted: bool,
) -> str:
    """Why ``cache_n`` fell short of ``held``; each named part from the tokens or the log."""
    if turn == 1:
        return "first request"
    if cache_n >= held - 1:
        return "kept"
    parts = []
    if divergence < previous_prompt:
        if divergence >= previous_prompt - 1:
            parts.append("the previous prompt's last token tokenizes anew once text follows")
        else:
            parts.append(f"the prompt changed at token {divergence} (template rewrote the turn)")
    elif not scripted:
        parts.append("the reply re-tokenizes differently from the tokens generated")
    else:
        parts.append("the scripted reply is new to the server")
    if hybrid and steps.checkpoint is not None:
        parts.append(f"recurrent state restored from the checkpoint at {steps.checkpoint}")
    elif hybrid and steps.full_reread:
        parts.append("no checkpoint before the divergence: read from the start")
    return "; ".join(parts)


class Session:
    def __init__(self, client: httpx.Client, follower: LogFollower, model: str) -> None:
        self.client = client
        self.follower = follower
        self.model = model

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        for attempt in range(2):
            try:
                response = self.client.post(path, json=body)
                break
            except httpx.RemoteProtocolError as exc:  # see bench/pool.py: sent again, once
                if attempt:
                    raise BenchError(f"{path}: {exc!r}") from exc
        if response.status_code != 200:
            raise BenchError(f"{path}: {response.status_code} {response.text[:300]}")
        data = response.json()
        if not isinstance(data, dict):
            raise BenchError(f"{path} answered something other than an object")
        return data

    def prompt(self, messages: list[dict[str, Any]], thinking: bool) -> str:
        body = {
            "model": self.model,
            "messages": messages,
            "chat_template_kwargs": _kwargs(thinking),
        }
        prompt = self._post("/apply-template", body).get("prompt")
        if not isinstance(prompt, str):
            raise BenchError("/apply-template answered without a prompt")
        return prompt

    def tokens(self, text: str) -> list[int]:
        body = {"model": self.model, "content": text, "parse_special": True}
        tokens = self._post("/tokenize", body).get("tokens")
        if not isinstance(tokens, list):
            raise BenchError("/tokenize answered without tokens")
        return [int(t) for t in tokens]

    def send(
        self, messages: list[dict[str, Any]], thinking: bool, max_tokens: int
    ) -> tuple[dict[str, Any], ServerSteps]:
        body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "cache_prompt": True,
            "id_slot": 0,
            "chat_template_kwargs": _kwargs(thinking),
        }
        self.follower.mark()
        answer = self._post("/v1/chat/completions", body)
        return answer, parse(self.follower.lines_until_release())


def _kwargs(thinking: bool) -> dict[str, bool]:
    return {"enable_thinking": thinking}


def run_variant(session: Session, variant: Variant, hybrid: bool) -> list[HybridRow]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"Notes for {variant.name}."}]
    rows: list[HybridRow] = []
    previous: list[int] | None = None
    held = 0
    for turn, question in enumerate(QUESTIONS[:TURNS], start=1):
        messages.append({"role": "user", "content": question})
        tokens = session.tokens(session.prompt(messages, variant.thinking))
        answer, steps = session.send(messages, variant.thinking, 1 if variant.scripted else 24)
        timings = answer.get("timings") or {}
        cache_n, prompt_n = int(timings.get("cache_n", 0)), int(timings.get("prompt_n", 0))
        predicted_n = int(timings.get("predicted_n", 0))
        divergence = common_prefix(tokens, previous) if previous is not None else None
        rows.append(
            HybridRow(
                "hybrid" if hybrid else "dense",
                variant.name,
                turn,
                len(tokens),
                held,
                divergence,
                cache_n,
                prompt_n,
                explain(
                    steps,
                    turn=turn,
                    hybrid=hybrid,
                    previous_prompt=len(previous or []),
                    held=held,
                    divergence=divergence or 0,
                    cache_n=cache_n,
                    scripted=variant.scripted,
                ),
            )
        )
        previous, held = tokens, cache_n + prompt_n + max(predicted_n - 1, 0)
        if variant.scripted:
            messages.append({"role": "assistant", "content": f"Answer {turn}."})
        else:
            reply = answer["choices"][0]["message"]
            messages.append({k: v for k, v in reply.items() if k in _REPLAYED and v is not None})
    return rows


_REPLAYED = ("role", "content", "reasoning_content")


def presets(prov: devserver.Provisioned, every_turn: Path) -> tuple[devserver.Preset, ...]:
    """One session per server: each model on one slot of its own, host cache off, so only the
    slot itself keeps anything."""
    alone = devserver.SlotLayout(ctx_size=16384, parallel=1, kv_unified=False)
    no_host_cache = (("cache-ram", "0"),)
    return (
        devserver.hybrid_preset(prov, every_turn, name=HYBRID, layout=alone, extra=no_host_cache),
        devserver.dense_preset(
            prov,
            every_turn,
            name=DENSE,
            layout=devserver.SlotLayout(ctx_size=8192, parallel=1, kv_unified=False),
            extra=no_host_cache,
        ),
    )


def run(
    workdir: Path,
    cache_dir: Path,
    variants: Sequence[Variant] = VARIANTS,
    models: Sequence[str] = (HYBRID, DENSE),
) -> list[HybridRow]:
    prov = devserver.Provisioned.in_cache(cache_dir)
    server = devserver.start(
        workdir,
        cache_dir,
        socket_path=workdir / "llama.sock",
        layout=devserver.ServerLayout(models_max=2),
        extra_args=("-lv", "4"),
        presets=presets(prov, workdir / devserver.EVERY_TURN_TEMPLATE),
        load=(HYBRID, DENSE),
    )
    rows: list[HybridRow] = []
    try:
        with server.client(timeout=300.0) as client:
            follower = LogFollower(server.log_path)
            for model in models:
                hybrid = model == HYBRID
                for variant in variants:
                    rows += run_variant(Session(client, follower, model), variant, hybrid)
                log.info("hybrid: %s done", model)
    finally:
        server.stop()
    return rows
