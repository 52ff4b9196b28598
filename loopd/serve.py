"""``loopd serve``: the daemon. Mattermost threads drive sessions until SIGINT or SIGTERM.

Startup: run the self-test (unless ``--skip-selftest``), open the runtime and the chat state, ask
Mattermost who the bot is, deliver answers a crash left unposted and resume pending turns
(derived from the log), start prewarming idle slots (LOOPD_PREWARM), then connect and listen.
The self-test's answers are what the runtime is built with (``Runtime.open``; each server's,
``loopd.endpoints.server``): whether sessions are pinned to slots, whether the pool is shared,
whether durable sessions are on, whether the template drops past reasoning. A later run's
answers replace what is known of the server whole (``Endpoints.know``).

When the server differs from the recorded expectations (at startup, or found by the check every
``LOOPD_SELFTEST_EVERY_S``) the daemon stays up in a *server changed* state: each thread that asks
gets one line saying so, the log and the status file (``server-status.json`` in the state folder)
say what differs, and the self-test runs again until it passes; then the waiting turns run
(``loopd.serverchange``). A self-test whose layout checks pass but one of whose probe requests
failed on the way (the server restarting its model, a 5xx, a broken stream) is no verdict: nobody
is told the server changed, turns go on, and the self-test runs again after 2, 4, 8 ... s (the
re-check rule, ``loopcommon.backoff.RECHECK``, here up to ``LOOPD_SELFTEST_EVERY_S``). An
unreachable server at startup still ends it with status 2.

Shutdown cancels one task group; a turn cut short is recorded by the engine and resumed on the
next start.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import anyio
from anyio.abc import TaskStatus

from loopcommon.backoff import RECHECK
from loopcommon.errors import DaemonError
from loopcommon.exceptiongroups import sole_kind
from loopcommon.stopsignals import StopSignals
from loopd.chat.adapter import ChatAdapter
from loopd.chat.cursor import ChatState
from loopd.chat.outbox import Outbox
from loopd.chat.rest import MattermostClient, api_client
from loopd.chat.split import MAX_POST_RUNES
from loopd.chat.threads import Threads
from loopd.config import SHORTHAND_ENDPOINT, Settings
from loopd.endpoints.server import Server
from loopd.endpoints.start import EXIT_NONE_UP, StartChecks, check_at_start
from loopd.engine.quiet import Purpose
from loopd.errors import LoopdError
from loopd.selftest.endpoints import down_line, endpoint_checker
from loopd.selftest.expected import DEFAULT_DIR, ServerAnswers
from loopd.selftest.run import SelftestReport, format_report, run_selftest
from loopd.serverchange import ServerChange, server_change, status_record
from loopd.sessionlog.backup import hold_state
from loopd.sessions import Runtime
from loopd.status.server import serve_runtime
from loopd.tools.spec import load_tools_spec

log = logging.getLogger(__name__)

STATUS_FILE = "server-status.json"


@dataclass
class ServerWatch:
    """Keeps the engine in step with the self-test: its answers while the server matches, the
    *server changed* state while it does not, and a check every ``selftest_every_s``.

    It is a background check (``loopd.engine.quiet``): while loopd is idle it sends only what a
    sleeping model answers asleep (``/health``, ``/models``, ``/props`` with ``autoload=false``),
    so that a model sleeps when its server says and stays unloaded when another client's
    evicted it. Each check reads the model's state into its server's ``memory`` (what the
    status page shows, and how a turn knows its model forgot). The live probes run only on a
    model awake now, with no turn of loopd's under way; until they can, they are owed
    (``live_due``) and the layout checks alone decide."""

    settings: Settings
    runtime: Runtime
    expected_dir: Path = DEFAULT_DIR
    on_restored: Callable[[], Awaitable[None]] = field(default_factory=lambda: _nothing)
    checks: int = 0  # completed re-checks, for tests and the log
    untold: int = 0  # runs in a row that could not tell (a probe request failed on the way)
    # The live probes are owed: skipped while the model slept or was not loaded, or the quick
    # check failed while they could not run.
    live_due: bool = False

    @property
    def change(self) -> ServerChange | None:
        return self.runtime.server_change

    @property
    def server(self) -> Server:
        """The one server it watches (the shorthand's), as known now."""
        return self.runtime.endpoints.servers[SHORTHAND_ENDPOINT]

    def start(self, report: SelftestReport) -> None:
        """Take the startup self-test's report (it was reachable; the runtime was built with its
        answers where it passed: ``startup_answers``)."""
        self.server.memory.watched = True
        self._read(report)
        self.live_due = report.model_away is not None or report.live_skipped is not None
        if report.model_away is not None:
            log.info("the server check waits: %s", report.model_away)
        elif report.ok:
            self._write_status(None)
        elif report.interrupted is not None:
            self._could_not_tell(report)
        else:
            self._differs(report)

    async def run(self) -> None:
        """Check again every ``selftest_every_s`` (sooner after a run that could not tell)
        until cancelled."""
        while True:
            await anyio.sleep(self.wait_s)
            try:
                await self.check()
            except DaemonError as exc:  # an expectations file that cannot be read, say
                log.error("the server check failed: %s", exc)  # noqa: TRY400 (one line, no trace)
            self.checks += 1

    @property
    def wait_s(self) -> float:
        """Until the next check: ``selftest_every_s``, or after runs that could not tell (the
        server restarting its model, say) the re-check rule's 2, 4, 8 ... s up to it."""
        every_s = self.settings.selftest_every_s
        if not self.untold:
            return every_s
        return RECHECK.capped_at(every_s).delay(self.untold)

    async def check(self) -> None:
        """One check: while the server matches, the layout checks (a background check: nothing
        that wakes the model), and the whole self-test when they fail; the whole self-test
        while the server differs, the last run could not tell, or the live probes are owed,
        its probes run where the model is awake and loopd idle (else the layout decides)."""
        if self.change is None and not self.untold and not self.live_due:
            quick = await self._selftest(live=False, purpose=Purpose.CHECK)
            self._read(quick)
            if quick.unreachable or quick.ok or quick.model_away is not None:
                return
            self.live_due = True
        purpose = Purpose.WORK if self.server.scheduler.idle() else Purpose.CHECK
        report = await self._selftest(live=True, purpose=purpose)
        self._read(report)
        if report.unreachable:
            log.warning("the server check could not reach %s; checking again later", report.url)
        elif report.model_away is not None:
            log.info("the server check waits: %s", report.model_away)
        elif report.live_skipped is not None:
            if self._layout_only(report):
                await self.on_restored()
        elif report.ok:
            restored = self.change is not None
            self.live_due = False
            self._matches(report)
            if restored:
                await self.on_restored()
        elif report.interrupted is not None:
            self._could_not_tell(report)
        else:
            self.live_due = False
            self._differs(report)

    def _layout_only(self, report: SelftestReport) -> bool:
        """A run whose probes could not go (the model asleep, or a turn under way): its layout
        checks decide whether the server changed; the probes stay owed. True when the server
        matched again."""
        if not report.ok:
            self._differs(report)
            return False
        if self.change is None:
            return False
        log.info(
            "the server at %s matches the recorded layout again; its live probes wait (%s)",
            report.url,
            report.live_skipped,
        )
        self.untold = 0
        self.runtime.server_change = None
        self._write_status(None)
        return True

    def _read(self, report: SelftestReport) -> None:
        """What the run read of the model, into its server's memory of it."""
        reading = report.facts.reading
        if reading is None:
            return
        lost = self.server.memory.observe(reading)
        if lost is not None:
            log.info(
                "%s (the model is %s); a session's next turn restores its save first",
                lost.value,
                reading.status.value,
            )

    async def _selftest(self, *, live: bool, purpose: Purpose) -> SelftestReport:
        tools_text = self.runtime.spec.text
        return await run_selftest(
            self.settings,
            tools_text=tools_text,
            expected_dir=self.expected_dir,
            live=live,
            purpose=purpose,
        )

    def _matches(self, report: SelftestReport) -> None:
        if self.change is not None:
            log.info("the server at %s matches the recorded expectations again", report.url)
        elif self.untold:
            log.info("the self-test passed for the server at %s", report.url)
        self.untold = 0
        self.runtime.server_change = None
        self.runtime.endpoints.know(SHORTHAND_ENDPOINT, report.answers)
        self._write_status(None)

    def _could_not_tell(self, report: SelftestReport) -> None:
        """A probe request failed on the way: no verdict on the server, so no thread is told it
        changed; turns go on (with the recorded expectations' answers until a run completes),
        and the self-test runs again soon."""
        self.untold += 1
        log.warning(
            "the self-test could not tell whether the server at %s matches: a request failed "
            "on the way (%s); checking again in %.0f s",
            report.url,
            report.interrupted,
            self.wait_s,
        )

    def _differs(self, report: SelftestReport) -> None:
        self.untold = 0
        change = server_change(report.results)
        assert change is not None  # the report failed
        if self.change is not None and change.key == self.change.key:
            log.warning("the server still differs (%s)", "; ".join(change.lines))
            return
        self.runtime.server_change = change
        log.error(change.log_line(report.url, self.settings.selftest_every_s))
        self._write_status(change)

    def _write_status(self, change: ServerChange | None) -> None:
        record = status_record(
            change,
            url=self.settings.infer_url,
            model=self.settings.model,
            since=datetime.now(UTC).isoformat(timespec="seconds"),
            every_s=self.settings.selftest_every_s,
        )
        path = self.settings.state_dir / STATUS_FILE
        try:
            path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            log.warning("could not write %s: %s", path, exc)


async def _nothing() -> None:
    return None


@dataclass
class Daemon:
    """The running parts, for tests and health checks."""

    runtime: Runtime
    state: ChatState
    client: MattermostClient
    threads: Threads
    adapter: ChatAdapter
    watch: ServerWatch | None = None


async def run_daemon(
    settings: Settings,
    *,
    report: SelftestReport | None = None,
    expected_dir: Path = DEFAULT_DIR,
    checks: StartChecks | None = None,
    task_status: TaskStatus[Daemon] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run until cancelled; ``task_status`` gets the daemon once it is listening. ``report``:
    the startup self-test's (None: skipped, and the server is not checked again). With
    ``[[endpoint]]`` tables, ``checks``: the start's self-test of each (those down are
    re-checked against ``expected_dir``). The runtime is built with what they found."""
    chat = settings.mm
    async with AsyncExitStack() as stack:
        # One daemon per state folder: a second one would answer every thread twice, and a
        # restore must not replace the files under a running one.
        stack.enter_context(hold_state(settings.state_dir))
        answers = startup_answers(report, checks)
        runtime = Runtime.open(settings, selftest=answers, expected_dir=expected_dir)
        stack.push_async_callback(runtime.aclose)
        watch = None
        if report is not None:
            watch = ServerWatch(settings, runtime, expected_dir)
            watch.start(report)
        runtime.endpoints.start(
            endpoint_checker(settings, runtime.spec.text, expected_dir),
            checks.down if checks is not None else {},
        )
        runtime.endpoints.log_known()
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
            if watch is not None:
                watch.on_restored = threads.resume_all  # the turns that waited run now
                tg.start_soon(watch.run)
            tg.start_soon(runtime.keep_warm, threads.session_names())
            if settings.metrics_addr is not None:
                await tg.start(serve_runtime, runtime, settings.metrics_addr, adapter.thread_labels)
            tg.start_soon(adapter.run)
            task_status.started(Daemon(runtime, state, client, threads, adapter, watch))


async def serve(
    settings: Settings,
    signals: StopSignals,
    report: SelftestReport | None = None,
    *,
    expected_dir: Path = DEFAULT_DIR,
    checks: StartChecks | None = None,
) -> int:
    """The daemon's life. A loopd error that ends it (at startup: a bad tools file, a token file
    it cannot read, Mattermost refusing the bot) is raised bare, for the command line's one line;
    the task groups would otherwise wrap it."""
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_cancel_on_signal, signals, tg.cancel_scope.cancel)
            await run_daemon(settings, report=report, expected_dir=expected_dir, checks=checks)
    except ExceptionGroup as group:
        if (error := sole_kind(group, LoopdError)) is None:
            raise
        raise error from None
    return 0


async def _cancel_on_signal(signals: StopSignals, cancel: Callable[[], None]) -> None:
    signum = await signals.wait()
    log.info("%s: shutting down", signum.name)
    cancel()


async def startup_endpoints(
    settings: Settings, expected_dir: Path = DEFAULT_DIR
) -> tuple[int, StartChecks]:
    """Every endpoint's self-test, at once (``loopd.endpoints.start``, as every front end
    starts): each one down gets one line and is re-checked once loopd serves; with none up,
    loopd refuses to start with exit status 2, as for the shorthand's one unreachable server
    (systemd retries). Returns the exit status and the checks."""
    tools_text = load_tools_spec(settings.tools_file).text
    checks = await check_at_start(
        settings.endpoints(), endpoint_checker(settings, tools_text, expected_dir)
    )
    if not checks.none_up:
        return 0, checks
    for check in checks.checks:
        print(format_report(check.report) if check.report else down_line(check), file=sys.stderr)
    print("loopd serve: refusing to start: no endpoint passed its self-test", file=sys.stderr)
    return EXIT_NONE_UP, checks


def startup_answers(
    report: SelftestReport | None, checks: StartChecks | None
) -> dict[str, ServerAnswers]:
    """What the start's self-tests found of each server that passed (by endpoint name): the
    shorthand's one ``report``, or each endpoint's ``checks``. A server whose self-test did not
    pass (or did not run) is known by its recorded answers meanwhile."""
    if report is not None and report.ok:
        return {SHORTHAND_ENDPOINT: report.answers}
    if checks is None:
        return {}
    return {
        check.endpoint.name: check.report.answers
        for check in checks.checks
        if check.ok and check.report is not None
    }


async def startup_selftest(settings: Settings, expected_dir: Path = DEFAULT_DIR) -> SelftestReport:
    """The self-test ``loopd serve`` runs first. An unreachable server is refused (the report,
    one line per check, on stderr); one that differs from the recorded expectations starts the
    daemon in the *server changed* state (the report on stderr too). Nobody waits for it, so
    it neither wakes nor loads the model (``loopd.engine.quiet``): with the model asleep or
    not loaded, loopd starts on the layout checks alone, and the probes run once it is awake."""
    tools_text = load_tools_spec(settings.tools_file).text
    report = await run_selftest(
        settings, tools_text=tools_text, expected_dir=expected_dir, purpose=Purpose.WORK
    )
    if report.unreachable:
        print(format_report(report), file=sys.stderr)
        print(
            "loopd serve: refusing to start: the self-test failed (the server is unreachable)",
            file=sys.stderr,
        )
    elif report.model_away is not None:
        print(
            f"loopd serve: starting without the server's checks: {report.model_away} "
            "(loopd does not load it; a person's turn does)",
            file=sys.stderr,
        )
    elif report.interrupted is not None:
        print(format_report(report), file=sys.stderr)
        print(
            "loopd serve: the self-test could not tell whether the server matches (a request "
            f"failed on the way: {report.interrupted}); starting, and checking again shortly",
            file=sys.stderr,
        )
    elif not report.ok:
        print(format_report(report), file=sys.stderr)
        print(
            "loopd serve: the server differs from the recorded expectations: starting anyway; "
            "threads are told it changed until the self-test passes",
            file=sys.stderr,
        )
    else:
        log.info(
            "self-test passed for %s at %s (expectations %s)%s",
            report.model,
            report.url,
            report.expectations,
            f"; its live probes wait: {report.live_skipped}" if report.live_skipped else "",
        )
    return report
