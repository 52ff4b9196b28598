"""The Mattermost adapter's settings (``loopd.chat``): the ``mm`` table of loopd's ``Settings``
(``LOOPD_MM_*`` variables, or the ``[mm]`` table of the ``LOOPD_CONFIG`` file). The adapter takes
them as one object, ``settings.mm``. Beside ``loopd.config``, below it, as the adapter is far
above: the settings are read before anything else."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import NoDecode

from loopcommon.errors import ConfigError


def _comma_list(value: Any) -> Any:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


class ChatSettings(BaseModel):
    """How loopd reaches Mattermost and whom it answers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(
        default="unix:/run/loopd/chat.sock",
        description="Mattermost, or brokerd's chat proxy: `unix:/path` or `http(s)://host`.",
    )
    token_file: Path | None = Field(
        default=None,
        description="Development only: a file holding a bot token, for a URL without the proxy "
        "(the proxy adds the token itself, so in the box this stays unset).",
    )
    # NoDecode: the environment gives "alice,bob", not JSON; the validators below parse it.
    allowed_users: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="Usernames or user ids loopd answers (comma list; `*` for everyone).",
    )
    allowed_teams: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(), description="Teams (names or ids) whose channels loopd works in (`*` for all)."
    )
    allowed_channels: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(), description="Channels (names or ids) loopd works in, besides the allowed teams."
    )
    admins: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="Usernames or user ids who may stop anyone's turn and answer any tool's "
        "approval question (comma list).",
    )
    stop_word: str = Field(
        default="stop",
        description="A thread reply of only this word stops the turn (from the person who "
        "asked, or an admin).",
    )
    thread_policy: Literal["all", "mentions"] = Field(
        default="all",
        description="In a channel thread loopd is in: `all` answers every later reply, "
        "`mentions` only replies that mention it (direct messages are always answered).",
    )
    max_waiting_per_user: int = Field(
        default=3, ge=1, description="Threads one person may have waiting for an answer at once."
    )
    max_waiting_per_thread: int = Field(
        default=5, ge=1, description="Messages that may wait in one thread while its turn runs."
    )
    max_file_bytes: int = Field(
        default=262144, ge=0, description="Text attachments are read up to this many bytes each."
    )
    typing_interval_s: float = Field(
        default=4.0,
        gt=0,
        description="How often the typing indicator is sent while a turn waits or thinks.",
    )
    stop_reaction: str = Field(
        default="octagonal_sign",
        description="This reaction on a turn's status or answer post stops it.",
    )
    retry_reaction: str = Field(
        default="repeat",
        description="This reaction on a thread's latest answer generates it again (or runs "
        "again a turn that ended without an answer, reacted on its closing post).",
    )
    allow_reaction: str = Field(
        default="white_check_mark",
        description="This reaction on a tool's approval question allows the call.",
    )
    deny_reaction: str = Field(
        default="x", description="This reaction on a tool's approval question denies the call."
    )
    status_interval_s: float = Field(
        default=3.0, ge=0, description="Least time between two edits of a status post."
    )
    ping_interval_s: float = Field(
        default=30.0,
        gt=0,
        description="WebSocket application ping; no reply by the next one reconnects.",
    )
    hello_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A socket with no hello (or resume) this long is an auth fault.",
    )
    catchup_overlap_s: float = Field(
        default=60.0, ge=0, description="REST catch-up re-reads this much before the stored cursor."
    )
    resume_max_age_s: float = Field(
        default=240.0,
        ge=0,
        description="A stored WebSocket connection older than this is not resumed.",
    )
    backoff_s: float = Field(
        default=3.0,
        gt=0,
        description="First reconnect delay (less up to half, at random); doubles per failure.",
    )
    backoff_cap_s: float = Field(default=300.0, gt=0, description="Longest reconnect delay.")
    retry_for_s: float = Field(
        default=180.0,
        gt=0,
        description="How long a REST call is retried through 5xx, 429 and outages.",
    )
    max_message_chars: int = Field(
        default=32000,
        gt=0,
        description="Longer posts are cut to this many characters (the user is told).",
    )

    @field_validator("allowed_users", "allowed_teams", "allowed_channels", "admins", mode="before")
    @classmethod
    def _parse_list(cls, value: Any) -> Any:
        return _comma_list(value)

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        if value.startswith("unix:") and value[len("unix:") :]:
            return value
        if value.startswith(("http://", "https://")):
            return value.rstrip("/")
        raise ValueError("must be unix:/path/to.sock, http://host or https://host")

    def token(self) -> str | None:
        """The development token, if a token file is configured."""
        if self.token_file is None:
            return None
        try:
            return self.token_file.read_text(encoding="utf-8").strip() or None
        except (OSError, UnicodeDecodeError) as exc:
            problem = f"cannot read {self.token_file}: {exc}"
            raise ConfigError(f"LOOPD_MM_TOKEN_FILE: {problem}") from None
