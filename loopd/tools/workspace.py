"""Paths confined to the session's workspace, and the file I/O that honours them.

The model names files by paths relative to the workspace. A path is refused when it is absolute
or has a ``..`` part (``check_relative``), or when, with every symlink resolved, it leads outside
the workspace (``confine``). Those two are pure decisions.

Checking a path and then opening it leaves a gap in which a directory can be swapped for a
symlink. So the I/O here never opens a checked path by name from the root of the filesystem: it
walks the resolved path one part at a time from a descriptor of the workspace, opening every part
with ``O_NOFOLLOW``. A symlink that appears after the check makes that open fail (``ELOOP``)
instead of being followed out of the workspace.

Each session's workspace is one folder under the workspaces root, named by
``workspace_folder_name``: a different folder for every session name, and never the root itself
or anything above it. ``migrate_legacy_workspaces`` moves the folders an earlier naming made.
"""

import codecs
import errno
import hashlib
import logging
import os
import shutil
import stat
import string
from collections.abc import Collection, Generator, Iterable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path, PurePosixPath

from loopd.tools.errors import (
    LimitExceeded,
    PathRefused,
    ToolFailure,
    ToolSetupError,
    WorkspaceRefused,
)

log = logging.getLogger("loopd.tools")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_LINE_PIECE = 64 * 1024
_BINARY_SNIFF = 8 * 1024
_TEMP_PREFIX = ".loopd-write-"


# --- pure decisions ----------------------------------------------------------------------------


def check_relative(raw: str) -> PurePosixPath:
    """Accept a plain relative path (``""`` means the workspace itself); refuse anything else."""
    if "\x00" in raw:
        raise PathRefused(f"{raw!r}: a path cannot contain a NUL character")
    path = PurePosixPath(raw or ".")
    if path.is_absolute():
        raise PathRefused(
            f"{raw}: absolute paths are refused; give a path relative to the workspace"
        )
    if ".." in path.parts:
        raise PathRefused(f"{raw}: '..' is refused; give a path inside the workspace")
    return path


def confine(root: PurePosixPath, resolved: PurePosixPath, raw: str) -> PurePosixPath:
    """Return ``resolved`` relative to ``root``, or refuse it when it lies outside.

    Both paths must be absolute and free of symlinks and ``..`` (as ``os.path.realpath`` gives
    them), so a lexical comparison is exact.
    """
    try:
        return resolved.relative_to(root)
    except ValueError:
        raise PathRefused(f"{raw}: refused, a symlink leads outside the workspace") from None


def describe_size(size: int) -> str:
    return f"{size:,} bytes"


# --- session workspaces: one folder per session name ------------------------------------------

_FOLDER_SAFE = frozenset(string.ascii_letters + string.digits + "-_.")
_FOLDER_MAX_BYTES = 200  # NAME_MAX is 255; room to spare for a temporary suffix
_HASHED_MARK = "%~"  # never in a plain encoding, where every "%" starts "%XX"
_REFUSED_NAMES = ("", ".", "..")


def workspace_folder_name(session: str) -> str:
    """The folder of a session's workspace: one path component, a different one for every name.

    ASCII letters, digits, ``-``, ``_`` and ``.`` stand for themselves; every other byte of the
    name (UTF-8) is written ``%XX``, so ``mm:abc`` is ``mm%3Aabc`` and ``mm_abc`` stays
    ``mm_abc``. A folder that would be longer than 200 bytes keeps its start and ends with
    ``%~`` and the sha256 of the name. ``""``, ``.`` and ``..`` are refused: they would name
    the workspaces root or what is above it.
    """
    if session in _REFUSED_NAMES:
        raise WorkspaceRefused(
            f"session {session!r} cannot have a workspace: the names '', '.' and '..' are "
            "refused (they would name the workspaces root or its parent); use another name"
        )
    # surrogatepass: a name from the command line may hold lone surrogates; still one folder each.
    encoded = "".join(
        chr(byte) if chr(byte) in _FOLDER_SAFE else f"%{byte:02X}"
        for byte in session.encode("utf-8", "surrogatepass")
    )
    if len(encoded) <= _FOLDER_MAX_BYTES:
        return encoded
    digest = hashlib.sha256(session.encode("utf-8", "surrogatepass")).hexdigest()
    head = encoded[: _FOLDER_MAX_BYTES - len(_HASHED_MARK) - len(digest)]
    head = head[: head.rfind("%")] if "%" in head[-2:] else head  # no "%X" cut in half
    return f"{head}{_HASHED_MARK}{digest}"


def legacy_folder_name(session: str) -> str:
    """The folder earlier versions gave a session (it let names collide, and ``.`` be the root)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in session)[:120] or "_"


def session_workspace(root: Path, session: str) -> Path:
    """The session's workspace folder under ``root``, made when missing."""
    folder = root / workspace_folder_name(session)
    if folder.is_symlink():
        raise WorkspaceRefused(f"the workspace of session {session!r} is a symlink; refused")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@dataclass(frozen=True)
class WorkspaceMove:
    """One legacy folder to bring under a session's new folder name."""

    session: str
    source: str
    target: str
    copy: bool
    """True when the source stays: another session owns it too (they shared it before)."""


def plan_workspace_moves(names: Iterable[str], existing: Collection[str]) -> list[WorkspaceMove]:
    """What to move or copy so that every session finds the files its legacy folder held.

    A legacy folder claimed by one session alone is renamed. One that several sessions shared
    (the legacy naming collided), or that is also a session's folder under the new naming, is
    copied to each claimant (and renamed for the last one when nobody keeps it): no session
    loses a file it could see before.
    """
    claims: dict[str, list[tuple[str, str]]] = {}
    kept: set[str] = set()
    for name in names:
        try:
            target = workspace_folder_name(name)
        except WorkspaceRefused:
            continue
        kept.add(target)
        source = legacy_folder_name(name)
        if source in (target, ".", "..") or source not in existing or target in existing:
            continue
        claims.setdefault(source, []).append((target, name))
    moves = []
    for source, claimants in sorted(claims.items()):
        ordered = sorted(set(claimants))
        for index, (target, name) in enumerate(ordered):
            last = index == len(ordered) - 1
            moves.append(WorkspaceMove(name, source, target, copy=source in kept or not last))
    return moves


NAMING_MARK = "%%workspace-names-v2"
"""The file in the workspaces root that says its folders are named by ``workspace_folder_name``.

"%%" is in no session's folder name. Once it is there, no folder is taken for a legacy one: a
folder the new naming made (``mm_abc``) must never be copied to another session (``mm:abc``).
"""


def migrate_legacy_workspaces(root: Path, names: Iterable[str]) -> list[WorkspaceMove]:
    """Once per workspaces root: legacy folders to their new names (``plan_workspace_moves``).

    ``names`` are every session of the log. A move that fails is logged and left: its files stay
    where they were.
    """
    mark = root / NAMING_MARK
    if mark.exists():
        return []
    root.mkdir(parents=True, exist_ok=True)
    with os.scandir(root) as scan:
        existing = {entry.name for entry in scan if entry.is_dir(follow_symlinks=False)}
    moves = plan_workspace_moves(names, existing)
    for move in moves:
        try:
            _apply(root, move)
        except OSError as exc:
            log.warning("workspace of session %r not migrated: %s", move.session, exc)
    mark.write_text("The folders here are named by loopd.tools.workspace.workspace_folder_name.\n")
    return moves


def _apply(root: Path, move: WorkspaceMove) -> None:
    source, target = root / move.source, root / move.target
    if move.copy:
        # Copied under a temporary name first, so a crash never leaves a half copy in place.
        partial = root / f"{move.target[:100]}%%partial-{os.urandom(4).hex()}"
        shutil.copytree(source, partial, symlinks=True)
        os.rename(partial, target)
    else:
        os.rename(source, target)
    verb = "copied" if move.copy else "moved"
    log.info("workspace of session %r %s from %s to %s", move.session, verb, source, target)


# --- the workspace and confined opening --------------------------------------------------------


@dataclass(frozen=True)
class Workspace:
    """The session's workspace directory; ``root`` is absolute with every symlink resolved."""

    root: Path

    @classmethod
    def at(cls, path: Path) -> "Workspace":
        root = Path(os.path.realpath(path))
        if not root.is_dir():
            raise ToolSetupError(f"workspace {path} is not a directory")
        return cls(root)

    def resolve(self, raw: str) -> PurePosixPath:
        """The path the model named, relative to the root, with symlinks resolved as of now."""
        relative = check_relative(raw)
        resolved = os.path.realpath(self.root / relative)
        return confine(PurePosixPath(self.root), PurePosixPath(resolved), raw)

    @contextmanager
    def open_dir(self, relative: PurePosixPath, *, create: bool = False) -> Iterator[int]:
        """A descriptor of a directory inside the workspace, reached without following symlinks.

        With ``create``, missing directories on the way are made (each one inside a directory
        already reached, so they cannot land outside).
        """
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            for part in relative.parts:
                if create:
                    with suppress(FileExistsError):
                        os.mkdir(part, dir_fd=fd)
                next_fd = _open_dir_part(fd, part)
                os.close(fd)
                fd = next_fd
            yield fd
        finally:
            os.close(fd)


def _open_dir_part(dir_fd: int, part: str) -> int:
    try:
        return os.open(part, _DIR_FLAGS, dir_fd=dir_fd)
    except NotADirectoryError:
        # O_DIRECTORY reports a symlink as "not a directory"; say what really happened.
        if stat.S_ISLNK(os.stat(part, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), part) from None
        raise


@contextmanager
def translate_os_errors(raw: str) -> Iterator[None]:
    """Turn an ``OSError`` from the file system into a ``ToolFailure`` the model can read."""
    try:
        yield
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PathRefused(
                f"{raw}: refused, a symlink in the path changed while it was being opened"
            ) from exc
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise ToolFailure(f"{raw}: {reason.lower()}") from exc


def _split(relative: PurePosixPath, raw: str) -> tuple[PurePosixPath, str]:
    if not relative.parts:
        raise ToolFailure(f"{raw or '.'} is the workspace directory, not a file")
    return relative.parent, relative.name


@contextmanager
def open_regular_file(workspace: Workspace, raw: str) -> Iterator[tuple[BufferedReader, int]]:
    """Open a regular file for reading; yield the stream and its size."""
    parent, name = _split(workspace.resolve(raw), raw)
    with translate_os_errors(raw), workspace.open_dir(parent) as dir_fd:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
        with os.fdopen(fd, "rb") as stream:
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                raise ToolFailure(f"{raw}: is a directory; use list_dir")
            if not stat.S_ISREG(info.st_mode):
                raise ToolFailure(f"{raw}: not a regular file")
            os.set_blocking(fd, True)
            yield stream, info.st_size


# --- reading -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TextWindow:
    """Part of a text file: lines ``first_line`` onwards, at most a byte cap of them.

    ``next_line`` is where to continue (``None`` at the end of the file); ``cut_mid_line`` says
    the byte cap fell inside a line, so the last line shown is incomplete.
    """

    text: str
    first_line: int
    next_line: int | None
    cut_mid_line: bool
    size: int


def read_text_window(
    workspace: Workspace, raw: str, *, offset: int, limit: int | None, max_bytes: int
) -> TextWindow:
    """Read lines ``offset..offset+limit-1`` of a file, holding at most ``max_bytes`` of it."""
    with open_regular_file(workspace, raw) as (stream, size), translate_os_errors(raw):
        if b"\x00" in stream.peek(_BINARY_SNIFF)[:_BINARY_SNIFF]:
            raise ToolFailure(f"{raw}: a binary file ({describe_size(size)}); not shown")
        if not _skip_lines(stream, offset - 1):
            return TextWindow("", offset, None, cut_mid_line=False, size=size)
        return _take_lines(stream, offset, limit, max_bytes, size)


def _skip_lines(stream: BufferedReader, count: int) -> bool:
    """Skip ``count`` lines without holding any of them whole; False when the file ends first."""
    skipped = 0
    while skipped < count:
        piece = stream.readline(_LINE_PIECE)
        if not piece:
            return False
        if piece.endswith(b"\n"):
            skipped += 1
    return True


def _take_lines(
    stream: BufferedReader, first_line: int, limit: int | None, max_bytes: int, size: int
) -> TextWindow:
    data = bytearray()
    taken = 0
    line_start = 0
    while limit is None or taken < limit:
        # One byte over the room left tells "exactly full" from "cut".
        piece = stream.readline(max_bytes - len(data) + 1)
        if not piece:
            return TextWindow(_decode(data, final=True), first_line, None, False, size)
        if len(data) + len(piece) > max_bytes:
            return _cut(data, piece, line_start, first_line, taken, max_bytes, size)
        data += piece
        if piece.endswith(b"\n"):
            taken += 1
            line_start = len(data)
    more = bool(stream.read(1))
    next_line = first_line + taken if more else None
    return TextWindow(_decode(data, final=True), first_line, next_line, False, size)


def _cut(
    data: bytearray,
    piece: bytes,
    line_start: int,
    first_line: int,
    taken: int,
    max_bytes: int,
    size: int,
) -> TextWindow:
    """End a window at the byte cap: after the last whole line, or inside a first huge line."""
    next_line = first_line + taken
    if taken:
        return TextWindow(
            _decode(data[:line_start], final=True), first_line, next_line, False, size
        )
    data += piece[: max_bytes - len(data)]
    return TextWindow(_decode(data, final=False), first_line, next_line, True, size)


def _decode(data: bytes | bytearray, *, final: bool) -> str:
    """UTF-8 with replacement; a character cut in half at a cap is dropped, not garbled."""
    return codecs.getincrementaldecoder("utf-8")("replace").decode(bytes(data), final=final)


def read_text_whole(workspace: Workspace, raw: str, *, max_bytes: int) -> str:
    """The whole of a UTF-8 text file, refused when larger than ``max_bytes``."""
    with open_regular_file(workspace, raw) as (stream, size), translate_os_errors(raw):
        if size > max_bytes:
            raise LimitExceeded(
                f"{raw}: {describe_size(size)}, over the {describe_size(max_bytes)} limit"
            )
        data = stream.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise LimitExceeded(f"{raw}: over the {describe_size(max_bytes)} limit")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolFailure(f"{raw}: not UTF-8 text") from None


# --- writing -----------------------------------------------------------------------------------


def check_write_size(raw: str, data: bytes, max_bytes: int) -> None:
    if len(data) > max_bytes:
        raise LimitExceeded(
            f"{raw}: content is {describe_size(len(data))}, "
            f"over the {describe_size(max_bytes)} limit; write it in smaller files"
        )


def write_file_atomic(workspace: Workspace, raw: str, data: bytes, *, max_bytes: int) -> bool:
    """Replace (or create) a file in one step; return True when it was created.

    The bytes go to a temporary file beside the target, which is then renamed over it, so a
    failed write leaves the old content intact. Missing parent directories are created.
    """
    check_write_size(raw, data, max_bytes)
    parent, name = _split(workspace.resolve(raw), raw)
    with translate_os_errors(raw), workspace.open_dir(parent, create=True) as dir_fd:
        mode = _existing_mode(dir_fd, name, raw)
        temp = _TEMP_PREFIX + os.urandom(6).hex()
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temp, flags, 0o644 if mode is None else mode, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as stream:
                stream.write(data)
            os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
            raise
    return mode is None


def _existing_mode(dir_fd: int, name: str, raw: str) -> int | None:
    """The permission bits of the file being replaced, or None when there is none yet."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(info.st_mode):
        raise ToolFailure(f"{raw}: is a directory")
    if not stat.S_ISREG(info.st_mode):
        # A symlink here was put in after the path was resolved; a FIFO or socket is no file.
        raise PathRefused(f"{raw}: not a regular file; refused")
    return stat.S_IMODE(info.st_mode)


# --- listing and walking -----------------------------------------------------------------------


@dataclass(frozen=True)
class DirEntry:
    name: str
    kind: str  # "dir", "file", "link" or "other"
    size: int
    link_target: str | None


def list_entries(workspace: Workspace, raw: str) -> list[DirEntry]:
    """The entries of a workspace directory, sorted by name; symlinks are shown, not followed."""
    relative = workspace.resolve(raw)
    with (
        translate_os_errors(raw),
        workspace.open_dir(relative) as dir_fd,
        os.scandir(dir_fd) as scan,
    ):
        entries = [_describe_entry(dir_fd, entry) for entry in scan]
    return sorted(entries, key=lambda entry: entry.name)


def _describe_entry(dir_fd: int, entry: "os.DirEntry[str]") -> DirEntry:
    if entry.is_symlink():
        return DirEntry(entry.name, "link", 0, os.readlink(entry.name, dir_fd=dir_fd))
    if entry.is_dir(follow_symlinks=False):
        return DirEntry(entry.name, "dir", 0, None)
    if entry.is_file(follow_symlinks=False):
        return DirEntry(entry.name, "file", entry.stat(follow_symlinks=False).st_size, None)
    return DirEntry(entry.name, "other", 0, None)


@dataclass(frozen=True)
class TextFile:
    """A file met while walking: its path relative to the workspace and its bytes."""

    path: str
    data: bytes


@dataclass
class WalkReport:
    """What a walk left out, so a search can say so."""

    skipped_binary: int = 0
    skipped_large: int = 0
    stopped_at_files: bool = False


def walk_text_files(
    workspace: Workspace,
    raw: str,
    *,
    max_file_bytes: int,
    max_files: int,
    report: WalkReport,
    skip_dirs: frozenset[str] = frozenset({".git"}),
) -> Generator[TextFile, None, None]:
    """Yield the text files under a workspace path (or the file itself), in a stable order.

    Symlinks are never followed, binary files and files over ``max_file_bytes`` are skipped and
    counted in ``report``, and at most ``max_files`` files are read.
    """
    relative = workspace.resolve(raw)
    with translate_os_errors(raw), ExitStack() as stack:
        try:
            dir_fd = stack.enter_context(workspace.open_dir(relative))
        except NotADirectoryError:
            yield from _single_file(workspace, raw, relative, max_file_bytes, report)
            return
        yield from _walk(dir_fd, relative, max_file_bytes, max_files, report, skip_dirs)


def _single_file(
    workspace: Workspace, raw: str, prefix: PurePosixPath, max_file_bytes: int, report: WalkReport
) -> Iterator[TextFile]:
    with open_regular_file(workspace, raw) as (stream, size):
        data = stream.read(max_file_bytes + 1) if size <= max_file_bytes else b""
    kept = _as_text(data, size, max_file_bytes, report)
    if kept is not None:
        yield TextFile(str(prefix), kept)


def _walk(
    top_fd: int,
    prefix: PurePosixPath,
    max_file_bytes: int,
    max_files: int,
    report: WalkReport,
    skip_dirs: frozenset[str],
) -> Iterator[TextFile]:
    seen = 0
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(".", dir_fd=top_fd):
        dirnames[:] = sorted(name for name in dirnames if name not in skip_dirs)
        for name in sorted(filenames):
            if seen >= max_files:
                report.stopped_at_files = True
                return
            data = _read_small_regular(dir_fd, name, max_file_bytes, report)
            if data is None:
                continue
            seen += 1
            yield TextFile(str(prefix / PurePosixPath(dirpath) / name), data)


def _read_small_regular(
    dir_fd: int, name: str, max_file_bytes: int, report: WalkReport
) -> bytes | None:
    """The bytes of a regular text file; None for symlinks, special files and skipped files."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None  # a symlink (ELOOP), or gone since the directory was listed
    with os.fdopen(fd, "rb") as stream:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        os.set_blocking(fd, True)
        data = stream.read(max_file_bytes + 1) if info.st_size <= max_file_bytes else b""
    return _as_text(data, info.st_size, max_file_bytes, report)


def _as_text(data: bytes, size: int, max_file_bytes: int, report: WalkReport) -> bytes | None:
    if size > max_file_bytes or len(data) > max_file_bytes:
        report.skipped_large += 1
        return None
    if b"\x00" in data[:_BINARY_SNIFF]:
        report.skipped_binary += 1
        return None
    return data
