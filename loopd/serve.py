"""``loopd serve``: the daemon. Mattermost threads drive sessions until SIGINT or SIGTERM.

Startup: open the runtime and the chat state, ask Mattermost who the bot is, deliver answers a
crash left unposted and resume pending turns (derived from the log), start prewarming idle slots
(LOOPD_PREWARM), then connect and listen.
Shutdown cancels one task group; a turn cut short is recorded by the engine and resumed on the
next start.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable
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
    settings: Settings, *, task_status: TaskStatus[Daemon] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Run until cancelled; ``task_status`` gets the daemon once it is listening."""
    chat = settings.mm
    async with AsyncExitStack() as stack:
        # One daemon per state folder: a second one would answer every thread twice, and a
        # restore must not replace the files under a running one.
        stack.enter_context(hold_state(settings.state_dir))
        runtime = Runtime.open(settings)
        stack.push_async_callback(runtime.aclose)
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


async def serve(settings: Settings) -> int:
    """The daemon's life. A loopd error that ends it (at startup: a bad tools file, a token file
    it cannot read, Mattermost refusing the bot) is raised bare, for the command line's one line;
    the task groups would otherwise wrap it."""
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_cancel_on_signal, tg.cancel_scope.cancel)
            await run_daemon(settings)
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
    if args.skip_selftest:
        log.warning("the self-test was skipped (--skip-selftest): the server is not checked")
    else:
        status = anyio.run(startup_selftest, settings, args.expected_dir)
        if status != 0:
            return status
    return anyio.run(serve, settings)


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
