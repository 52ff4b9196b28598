"""The file tools: read_file, write_file, edit_file, list_dir, search_files.

Each one is a blocking function over the confined I/O of ``workspace``; the runner calls it in a
worker thread. What a tool decides (an edit, a listing, a match) is a pure function of its input,
kept apart so it can be tested without a disk. Failures the model can act on are raised as
``ToolFailure`` with the message it will read.

search_files matches regexes with RE2 (google-re2), whose time is linear in the text: a pattern
such as ``^(a+)+$``, which makes a backtracking engine (Python's ``re``) run for minutes on a
short line, costs RE2 no more than any other. A whole search is also bounded in time
(``ToolLimits.search_max_seconds``).
"""

import time
from collections.abc import Callable
from typing import Any

from loopcommon.linearregex import RegexError, compile_linear
from loopd.tools.errors import ToolFailure
from loopd.tools.limits import ToolLimits
from loopd.tools.quota import free_bytes, usage
from loopd.tools.workspace import (
    DirEntry,
    TextWindow,
    WalkReport,
    Workspace,
    describe_size,
    list_entries,
    read_text_whole,
    read_text_window,
    walk_text_files,
    write_file_atomic,
)

# --- pure decisions ----------------------------------------------------------------------------


def apply_edit(text: str, old: str, new: str, raw: str) -> str:
    """Replace the one occurrence of ``old``; refuse when there is none or more than one."""
    if old == new:
        raise ToolFailure(f"{raw}: old_string and new_string are the same; nothing to change")
    count = text.count(old)
    if count == 0:
        raise ToolFailure(
            f"{raw}: old_string was not found; read the file and copy the text exactly"
        )
    if count > 1:
        raise ToolFailure(
            f"{raw}: old_string occurs {count} times; include more surrounding text "
            "so that it occurs once"
        )
    return text.replace(old, new, 1)


def render_window(raw: str, window: TextWindow, max_bytes: int) -> str:
    if window.next_line is None and not window.text:
        if window.first_line > 1:
            return f"{raw} has fewer than {window.first_line} lines"
        return f"{raw} is empty"
    if window.cut_mid_line:
        return (
            f"{window.text}\n[line {window.first_line} is longer than "
            f"{describe_size(max_bytes)} and was cut; use run_command (head -c, cut) to see more]"
        )
    if window.next_line is None:
        return window.text
    last = window.next_line - 1
    return (
        f"{window.text}\n[lines {window.first_line}-{last} of {raw} shown "
        f"({describe_size(window.size)} in all); continue with offset={window.next_line}]"
    )


def render_listing(raw: str, entries: list[DirEntry], max_entries: int) -> str:
    if not entries:
        return f"{raw} is an empty directory"
    lines = [_entry_line(entry) for entry in entries[:max_entries]]
    if len(entries) > max_entries:
        left_out = len(entries) - max_entries
        lines.append(f"[{left_out} more {'entry' if left_out == 1 else 'entries'} not shown]")
    return "\n".join(lines)


def _entry_line(entry: DirEntry) -> str:
    if entry.kind == "dir":
        return f"{entry.name}/"
    if entry.kind == "link":
        return f"{entry.name} -> {entry.link_target}"
    if entry.kind == "file":
        return f"{entry.name} ({describe_size(entry.size)})"
    return f"{entry.name} (special file)"


def compile_regex(pattern: str) -> Any:
    """The pattern compiled by RE2, or a ``ToolFailure`` naming why it cannot be."""
    try:
        return compile_linear(pattern)
    except RegexError as exc:
        raise ToolFailure(
            f"search_files: the regex {pattern!r} cannot be used: {exc}. search_files uses RE2 "
            "syntax, which has no backreferences or lookaround so that every search runs in "
            "linear time; use a simpler pattern, or regex=false for a plain substring"
        ) from None


def line_matcher(pattern: str, regex: bool) -> Callable[[str], bool]:
    if not regex:
        return lambda line: pattern in line
    compiled = compile_regex(pattern)
    return lambda line: compiled.search(line) is not None


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def shorten(line: str, max_chars: int) -> str:
    return line if len(line) <= max_chars else line[:max_chars] + " [line cut]"


# --- the tools ---------------------------------------------------------------------------------


def read_file(
    workspace: Workspace, path: str, offset: int, limit: int | None, limits: ToolLimits
) -> str:
    try:
        window = read_text_window(
            workspace, path, offset=offset, limit=limit, max_bytes=limits.read_max_bytes
        )
    except ToolFailure as exc:
        # A guessed name, or a folder read as a file: the model's next step is better when it
        # reads what is there than when it guesses again (small models re-read the same path).
        around = _what_is_there(workspace, path, limits)
        if around is None:
            raise
        raise ToolFailure(f"{exc}. {around}") from exc
    return render_window(path, window, limits.read_max_bytes)


# How many names a failed read shows of the folder it looked in.
NAMES_SHOWN = 20


def _what_is_there(workspace: Workspace, raw: str, limits: ToolLimits) -> str | None:
    """For a read of a folder, or of a path that does not exist: what the folder (or the
    nearest folder above the path that exists) holds; None for any other failure, and for an
    empty folder (the failure says enough)."""
    try:
        relative = workspace.resolve(raw)
    except ToolFailure:
        return None
    folder = relative if (workspace.root / relative).is_dir() else relative.parent
    if folder == relative and not relative.parts:
        return None  # the workspace itself: the failure says so
    if folder != relative and (workspace.root / relative).exists():
        return None  # it exists: the failure is about the file itself
    while folder.parts and not (workspace.root / folder).is_dir():
        folder = folder.parent
    shown = folder.as_posix() if folder.parts else "."
    try:
        entries = list_entries(workspace, shown)
    except ToolFailure:
        return None
    if not entries:
        return None
    names = [_entry_line(entry) for entry in entries[:NAMES_SHOWN]]
    if len(entries) > NAMES_SHOWN:
        names.append(f"and {len(entries) - NAMES_SHOWN} more")
    where = "The workspace folder (.)" if shown == "." else f"The folder {shown}"
    return f"{where} holds: {', '.join(names)}."


def check_room(workspace: Workspace, adding: int, limits: ToolLimits) -> None:
    """Refuse a write of ``adding`` bytes that would pass the workspace's quota or the disk's
    reserve (``loopd.tools.quota``)."""
    refusal = limits.quota.refusal(usage(workspace.root), free_bytes(workspace.root), adding)
    if refusal is not None:
        raise ToolFailure(f"refused: {refusal}")


def write_file(workspace: Workspace, path: str, content: str, limits: ToolLimits) -> str:
    data = content.encode("utf-8")
    check_room(workspace, len(data), limits)
    created = write_file_atomic(workspace, path, data, max_bytes=limits.write_max_bytes)
    return f"{'created' if created else 'wrote'} {path} ({describe_size(len(data))})"


def edit_file(workspace: Workspace, path: str, old: str, new: str, limits: ToolLimits) -> str:
    text = read_text_whole(workspace, path, max_bytes=limits.write_max_bytes)
    edited = apply_edit(text, old, new, path)
    check_room(workspace, max(len(edited.encode("utf-8")) - len(text.encode("utf-8")), 0), limits)
    write_file_atomic(workspace, path, edited.encode("utf-8"), max_bytes=limits.write_max_bytes)
    return f"edited {path}: replaced 1 occurrence"


def list_dir(workspace: Workspace, path: str, limits: ToolLimits) -> str:
    return render_listing(path, list_entries(workspace, path), limits.list_max_entries)


def search_files(
    workspace: Workspace,
    pattern: str,
    path: str,
    regex: bool,
    limits: ToolLimits,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    matches = line_matcher(pattern, regex)
    deadline = clock() + limits.search_max_seconds
    report = WalkReport()
    found: list[str] = []
    files = walk_text_files(
        workspace,
        path,
        max_file_bytes=limits.search_max_file_bytes,
        max_files=limits.search_max_files,
        report=report,
    )
    for searched, file in enumerate(files, start=1):
        text = file.data.decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            if clock() > deadline:
                files.close()
                raise ToolFailure(_out_of_time(found, searched, file.path, limits))
            if matches(line):
                found.append(f"{file.path}:{number}: {shorten(line, limits.search_line_chars)}")
                if len(found) >= limits.search_max_matches:
                    files.close()
                    return _search_summary(found, report, limits, full=True)
    if not found:
        return _search_summary([f"no matches for {pattern!r} under {path}"], report, limits)
    return _search_summary(found, report, limits)


def _out_of_time(found: list[str], searched: int, at: str, limits: ToolLimits) -> str:
    head = (
        f"search_files: stopped after {limits.search_max_seconds:g} s, in {at} "
        f"({_count(searched, 'file')} reached); narrow the path or the pattern"
    )
    if not found:
        return f"{head}. No match so far."
    return "\n".join([f"{head}. The matches so far:", *found])


def _search_summary(
    lines: list[str], report: WalkReport, limits: ToolLimits, *, full: bool = False
) -> str:
    notes = []
    if full:
        notes.append(f"stopped at {limits.search_max_matches} matches; narrow the search")
    if report.stopped_at_files:
        notes.append(f"stopped after {limits.search_max_files} files")
    if report.skipped_large:
        too_large = describe_size(limits.search_max_file_bytes)
        notes.append(f"{_count(report.skipped_large, 'file')} over {too_large} skipped")
    if report.skipped_binary:
        notes.append(f"{_count(report.skipped_binary, 'binary file')} skipped")
    if notes:
        lines = [*lines, f"[{'; '.join(notes)}]"]
    return "\n".join(lines)
