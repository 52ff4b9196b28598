"""Record raw streamed chat completions from a real llama-server into tests/data/streams/*.sse.

Starts its own llama-server on a free loopback port (once with the model's own chat template,
once with the Qwen3.5 template, which makes the tiny model think and gives it a tool-call format),
sends a few requests and writes each response body byte for byte, then stops the server.

Sampling is greedy with a fixed seed, so a rerun gives the same tokens; ids, `created` and the
timing figures change from run to run.

    .venv/bin/python scripts/record_streams.py [--out tests/data/streams]
"""

import argparse
import logging
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from loopd.wire import EventDecoder, ReasoningDelta, StreamAssembler

LOG = logging.getLogger("record_streams")
CACHE = Path.home() / ".cache" / "loopd"
SERVER = CACHE / "llama-server-11434" / "bin" / "llama-server"
MODEL = CACHE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
THINKING_TEMPLATE = CACHE / "llama-server-11434" / "templates" / "Qwen3.5-4B.jinja"
ALIAS = "smollm2-135m"  # the `model` the chunks report, instead of a path on this machine
OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "streams"

NO_KEEPALIVE = httpx.Limits(max_keepalive_connections=0)
SAMPLING = {"temperature": 0, "seed": 42, "top_k": 1}
LIVE = {"stream": True, "return_progress": True, "timings_per_token": True}
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
ARITHMETIC = [{"role": "user", "content": "Think step by step: what is 17 times 23?"}]
PARIS = [{"role": "user", "content": "Tell me about Paris."}]
READ_FILE_TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a text file from the workspace.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "Path of the file"}},
            "required": ["path"],
        },
    },
}


def tool_prefill(path: str) -> list[dict[str, str]]:
    """A request whose trailing assistant message the server continues (a prefill). It opens a
    call in the Qwen3.5 template's own format: the only way found to get a real tool call from
    the tiny model."""
    opening = f"<tool_call>\n<function=read_file>\n<parameter=path>\n{path}"
    return [
        {"role": "user", "content": "Show me what is in notes.txt."},
        {"role": "assistant", "content": opening},
    ]


@dataclass(frozen=True)
class Recording:
    name: str
    body: dict[str, Any]
    end_reasoning_after: int | None = None  # send the control call after this many reasoning deltas


@dataclass(frozen=True)
class ServerSetup:
    extra_args: list[str]
    recordings: list[Recording] = field(default_factory=list)


SETUPS = [
    ServerSetup(
        extra_args=[],
        recordings=[
            Recording("plain", {"messages": QUESTION, "max_tokens": 40, **LIVE}),
            Recording(
                "usage",
                {
                    "messages": QUESTION,
                    "max_tokens": 30,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
            ),
        ],
    ),
    ServerSetup(
        extra_args=["--chat-template-file", str(THINKING_TEMPLATE)],
        recordings=[
            # The tiny model never closes its thinking by itself: this one ends inside it.
            Recording("thinking", {"messages": ARITHMETIC, "max_tokens": 60, **LIVE}),
            # Ended by the control call, so the stream has reasoning and then an answer.
            Recording(
                "thinking_capped",
                {"messages": PARIS, "max_tokens": 60, "reasoning_control": True, **LIVE},
                end_reasoning_after=5,
            ),
            Recording(
                "tool_call",
                {
                    "messages": tool_prefill("notes.txt"),
                    "tools": [READ_FILE_TOOL],
                    "max_tokens": 30,
                    **LIVE,
                },
            ),
            # The argument left open: the model writes it, streamed a token at a time.
            Recording(
                "tool_call_streamed",
                {"messages": tool_prefill(""), "tools": [READ_FILE_TOOL], "max_tokens": 30, **LIVE},
            ),
        ],
    ),
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def running_server(server: Path, model: Path, extra_args: list[str]) -> Iterator[str]:
    """A llama-server of our own on loopback; yields its base URL and stops it afterwards."""
    port = free_port()
    command = [str(server), "--model", str(model), "--host", "127.0.0.1", "--port", str(port)]
    command += ["--ctx-size", "4096", "-np", "2", "--no-webui", "--offline", "--alias", ALIAS]
    command += extra_args
    LOG.info("starting %s", " ".join(command))
    with tempfile.TemporaryFile() as server_log:
        process = subprocess.Popen(command, stdout=server_log, stderr=subprocess.STDOUT)
        try:
            base_url = f"http://127.0.0.1:{port}"
            wait_until_healthy(base_url, process, server_log)
            yield base_url
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wait_until_healthy(
    base_url: str, process: "subprocess.Popen[bytes]", server_log: IO[bytes]
) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            server_log.seek(0)
            tail = server_log.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"llama-server exited with status {process.returncode}:\n{tail}")
        try:
            if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"llama-server at {base_url} not healthy after 120 s")


def record(client: httpx.Client, recording: Recording) -> bytes:
    """The raw response body of one streamed request, exactly as received."""
    body = {**recording.body, **SAMPLING}
    raw = bytearray()
    decoder, assembler = EventDecoder(), StreamAssembler()
    reasoning_deltas, control_sent = 0, False
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for chunk in response.iter_raw():
            raw += chunk
            events = decoder.feed(chunk)
            assembler.apply_all(events)
            reasoning_deltas += sum(isinstance(event, ReasoningDelta) for event in events)
            limit = recording.end_reasoning_after
            if limit is not None and reasoning_deltas >= limit and not control_sent:
                end_reasoning(client, assembler.completion_id)
                control_sent = True
    assembler.apply_all(decoder.flush())
    LOG.info("%s: %s, finish %s", recording.name, assembler.outcome, assembler.finish_reason)
    return bytes(raw)


def end_reasoning(client: httpx.Client, completion_id: str | None) -> None:
    """The control call that forces the end of thinking, keyed by the completion id."""
    answer = client.post(
        "/v1/chat/completions/control", json={"id": completion_id, "action": "reasoning_end"}
    )
    LOG.info("control call for %s: %s %s", completion_id, answer.status_code, answer.text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--server", type=Path, default=SERVER)
    parser.add_argument("--model", type=Path, default=MODEL)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    args.out.mkdir(parents=True, exist_ok=True)
    for setup in SETUPS:
        with (
            running_server(args.server, args.model, setup.extra_args) as base_url,
            # The server may close a connection after a stream: open a fresh one per request.
            httpx.Client(base_url=base_url, timeout=120, limits=NO_KEEPALIVE) as client,
        ):
            for recording in setup.recordings:
                path = args.out / f"{recording.name}.sse"
                path.write_bytes(record(client, recording))
                LOG.info("wrote %s (%d bytes)", path, path.stat().st_size)


if __name__ == "__main__":
    main()
