"""Files attached to a post: text files are read into the message, with their names; images and
other binaries are named with one clear line saying they are not read.

Pure: the adapter fetches each file's info and (for a text file) its first bytes, and this module
decides what the model and the thread are told."""

from __future__ import annotations

from dataclasses import dataclass

from loopd.chat.model import FileInfo

_TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/xml",
        "application/x-yaml",
        "application/yaml",
        "application/toml",
        "application/x-sh",
        "application/javascript",
        "application/sql",
        "application/x-ndjson",
    }
)
# fmt: off
_TEXT_EXTENSIONS = frozenset({
    "txt", "md", "markdown", "rst", "csv", "tsv", "log", "json", "jsonl", "ndjson", "yaml", "yml",
    "toml", "ini", "cfg", "conf", "xml", "html", "htm", "css", "js", "ts", "tsx", "jsx", "py", "rb",
    "go", "rs", "java", "kt", "c", "h", "cc", "cpp", "hpp", "cs", "sh", "bash", "zsh", "sql",
    "diff", "patch", "env", "gitignore", "dockerfile", "makefile", "tf", "lua", "pl", "php",
    "swift", "r", "scala", "proto", "graphql",
})
# fmt: on


def kind_of(info: FileInfo) -> str:
    """``text``, ``image`` or ``binary``, from the file's type and name."""
    mime = info.mime_type.split(";")[0].strip().lower()
    if mime.startswith("image/"):
        return "image"
    extension = info.name.rsplit(".", 1)[-1].lower() if "." in info.name else info.name.lower()
    if mime.startswith("text/") or mime in _TEXT_TYPES or extension in _TEXT_EXTENSIONS:
        return "text"
    return "binary"


def size_words(size: int) -> str:
    if size < 1024:
        return f"{size} bytes"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KB"
    return f"{size / (1024 * 1024):.1f} MB"


@dataclass(frozen=True)
class ReadFile:
    """What became of one attachment: ``text`` for the model (empty when not read) and, when it
    was not read or not read whole, ``notice`` for the thread."""

    name: str
    text: str
    notice: str = ""


def read_file(info: FileInfo, head: bytes | None, max_bytes: int) -> ReadFile:
    """The attachment as the model reads it. ``head``: the file's first ``max_bytes`` bytes and
    one more when it is longer; None when it was not fetched (not a text file)."""
    name = info.name or info.id
    kind = kind_of(info)
    if kind != "text" or head is None:
        what = "an image" if kind == "image" else f"a binary file ({info.mime_type or 'unknown'})"
        line = f"{name} is {what}; I read only text files."
        return ReadFile(name, f"[attached: {name}, {what}, not read]", line)
    cut = len(head) > max_bytes
    body = head[:max_bytes]
    if b"\0" in body:
        line = f"{name} is not text (it holds NUL bytes); I read only text files."
        return ReadFile(name, f"[attached: {name}, not text, not read]", line)
    text = body.decode("utf-8", errors="replace")
    if cut:
        # A cut may split a UTF-8 sequence; the replacement character marks it honestly.
        note = f"[cut: {name} has {size_words(info.size)}; only the first {size_words(max_bytes)}]"
        line = f"{name} has {size_words(info.size)}; I read only its first {size_words(max_bytes)}."
        return ReadFile(name, _framed(name, info, text + "\n" + note), line)
    return ReadFile(name, _framed(name, info, text))


def _framed(name: str, info: FileInfo, text: str) -> str:
    return f"[attached file {name} ({size_words(info.size)})]\n{text}\n[end of {name}]"


def unread_notice(files: list[ReadFile]) -> str:
    """One line for the thread about the attachments not read (whole), or empty."""
    lines = [f.notice for f in files if f.notice]
    return "📎 " + " ".join(lines) if lines else ""
