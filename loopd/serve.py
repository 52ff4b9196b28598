"""``loopd serve``: the daemon. Mattermost threads drive sessions until SIGINT or SIGTERM.

Startup: open the runtime and the chat state, ask Mattermost who the bot is, deliver answers a
crash left unposted and resume pending turns (derived from the log), start prewarming idle slots
(LOOPD_PREWARM), then connect and listen.
Shutdown cancels one task group; a turn cut short is recorded by the engine and resumed on the
next start.
"""

from __future__ import annotations

import argparse
import functools
import logging
import signal
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import anyio
from anyio.abc import TaskStatus

from loopd.chat.adapter import ChatAdapter
from loopd.chat.cursor import ChatState
from loopd.chat.outbox import Outbox
from loopd.chat.rest import MattermostClient, api_client
from loopd.chat.split import MAX_POST_RUNES
from loopd.chat.threads import Threads
from loopd.config import Settings
from loopd.errors import LoopdError
from loopd.exceptiongroups import sole_kind
from loopd.observe.server import serve_runtime
from loopd.selftest.endpoints import check_all, down_line, endpoint_checker, health_after
from loopd.selftest.expected import DEFAULT_DIR
from loopd.selftest.run import format_report, run_selftest
from loopd.sessionlog.backup import hold_state
from loopd.sessions import Runtime
from loopd.statedir import check_state_dir
from loopd.tools.spec import load_tools_spec

log = logging.getLogger(__name__)


@dataclass
class Daemon:
    """The running parts, for tests and health checks."""

    runtime: Runtime
    state: ChatState
    client: MattermostClient
    threads: Threads
    adapter: ChatAdapter


async def run_daemon(
    settings: Settings,
    *,
    expected_dir: Path = DEFAULT_DIR,
    down: Mapping[str, str] = {},
    task_status: TaskStatus[Daemon] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run until cancelled; ``task_status`` gets the daemon once it is listening. With
    ``[[endpoint]]`` tables, ``down`` names the endpoints the start's self-test found down
    (re-checked against ``expected_dir``)."""
    chat = settings.mm
    async with AsyncExitStack() as stack:
        # One daemon per state folder: a second one would answer every thread twice, and a
        # restore must not replace the files under a running one.
        stack.enter_context(hold_state(settings.state_dir))
        runtime = Runtime.open(settings)
        stack.push_async_callback(runtime.aclose)
        if runtime.endpoints is not None:
            runtime.endpoints.start(
                endpoint_checker(settings, runtime.spec.text, expected_dir), down
            )
        state = ChatState.open(settings.state_dir / "chat.db")
        stack.callback(state.close)
        client = MattermostClient(
            api_client(chat.url, chat.token()),
            retry_for_s=chat.retry_for_s,
            backoff_s=min(chat.backoff_s, 1.0),
            backoff_cap_s=chat.backoff_cap_s,
        )
        stack.push_async_callback(client.aclose)
        bot = await client.me()
        outbox = Outbox(client, state, bot.id, await client.max_post_size(MAX_POST_RUNES))
        log.info("serving Mattermost as @%s", bot.username)
        async with anyio.create_task_group() as tg:
            threads = Threads(runtime, outbox, state, chat, tg)
            adapter = ChatAdapter(client, state, runtime, threads, outbox, chat, bot)
            await threads.resume_all()
            tg.start_soon(runtime.keep_warm, threads.session_names())
            if settings.metrics_addr is not None:
                await tg.start(serve_runtime, runtime, settings.metrics_addr)
            tg.start_soon(adapter.run)
            task_status.started(Daemon(runtime, state, client, threads, adapter))


async def serve(
    settings: Settings, *, expected_dir: Path = DEFAULT_DIR, down: Mapping[str, str] = {}
) -> int:
    """The daemon's life. A loopd error that ends it (at startup: a bad tools file, a token file
    it cannot read, Mattermost refusing the bot) is raised bare, for the command line's one line;
    the task groups would otherwise wrap it."""
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_cancel_on_signal, tg.cancel_scope.cancel)
            await run_daemon(settings, expected_dir=expected_dir, down=down)
    except ExceptionGroup as group:
        if (error := sole_kind(group, LoopdError)) is None:
            raise
        raise error from None
    return 0


async def _cancel_on_signal(cancel: Callable[[], None]) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("%s: shutting down", signal.Signals(signum).name)
            cancel()
            return


def handler(args: argparse.Namespace, settings: Settings) -> int:
    check_state_dir(settings.state_dir, create=True)
    down: dict[str, str] = {}
    if args.skip_selftest:
        log.warning("the self-test was skipped (--skip-selftest): the server is not checked")
    elif settings.has_endpoint_tables:
        status, down = anyio.run(startup_endpoints, settings, args.expected_dir)
        if status != 0:
            return status
    else:
        status = anyio.run(startup_selftest, settings, args.expected_dir)
        if status != 0:
            return status
    return anyio.run(functools.partial(serve, settings, expected_dir=args.expected_dir, down=down))


async def startup_endpoints(
    settings: Settings, expected_dir: Path = DEFAULT_DIR
) -> tuple[int, dict[str, str]]:
    """Every endpoint's self-test, at once: each one down gets one line and is re-checked once
    loopd serves; with none up, loopd refuses to start, as for the shorthand's one server.
    Returns the exit status and the endpoints down (name -> why)."""
    tools_text = load_tools_spec(settings.tools_file).text
    checks = await check_all(
        settings.endpoints(), endpoint_checker(settings, tools_text, expected_dir)
    )
    health_after(checks, time.monotonic())  # logs each endpoint's result
    down = {check.endpoint.name: check.reason for check in checks if not check.ok}
    if len(down) < len(checks):
        return 0, down
    for check in checks:
        print(format_report(check.report) if check.report else down_line(check), file=sys.stderr)
    print("loopd serve: refusing to start: no endpoint passed its self-test", file=sys.stderr)
    return 1, down


async def startup_selftest(settings: Settings, expected_dir: Path = DEFAULT_DIR) -> int:
    """The self-test ``loopd serve`` runs first; a server that differs from the recorded one is
    refused, with the report (one line per check) on stderr."""
    tools_text = load_tools_spec(settings.tools_file).text
    report = await run_selftest(settings, tools_text=tools_text, expected_dir=expected_dir)
    if report.exit_status != 0:
        print(format_report(report), file=sys.stderr)
        print("loopd serve: refusing to start: the self-test failed", file=sys.stderr)
    else:
        log.info(
            "self-test passed for %s at %s (expectations %s)",
            report.model,
            report.url,
            report.expectations,
        )
    return report.exit_status


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the daemon: Mattermost threads drive sessions (LOOPD_MM_* settings)"
    )
    parser.add_argument(
        "--skip-selftest",
        action="store_true",
        help="start without checking the server (development only)",
    )
    # Recorded on the host for the operator's own server, so the image needs no rebuild.
    parser.add_argument(
        "--expected-dir",
        type=Path,
        default=DEFAULT_DIR,
        help="folder of the self-test's expectations files (default: the one in the package)",
    )
    parser.set_defaults(handler=handler)
