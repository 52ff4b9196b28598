"""The state folder (``LOOPD_STATE_DIR``): refused in one line when loopd cannot use it.

Checked by the commands before they open anything in it, so that a folder that is a file, or one
loopd may not read or write, is named as the setting at fault rather than surfacing as an OS error
from deep inside SQLite or ``mkdir``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from loopcommon.errors import ConfigError

SETTING: Final = "LOOPD_STATE_DIR"


def check_state_dir(path: Path, *, create: bool) -> None:
    """``ConfigError`` when ``path`` cannot hold loopd's files: a file, a folder loopd may not
    read, or (``create``: the commands that write) one it cannot create or write in. A folder
    that does not exist is fine for reading: a fresh install has no sessions yet."""
    if create:
        _create(path)
    try:
        with os.scandir(path) as entries:
            next(entries, None)
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise ConfigError(f"{SETTING}: {path} is {_what_is_in_the_way(path)}") from None
    except OSError as exc:
        raise ConfigError(f"{SETTING}: cannot read {path}: {_reason(exc)}") from None
    wanted = os.R_OK | os.X_OK | (os.W_OK if create else 0)
    if not os.access(path, wanted):
        verb = "write in" if create else "read"
        raise ConfigError(f"{SETTING}: cannot {verb} {path}: permission denied")


def _create(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ConfigError(f"{SETTING}: {path} is {_what_is_in_the_way(path)}") from None
    except OSError as exc:
        raise ConfigError(f"{SETTING}: cannot create {path}: {_reason(exc)}") from None


def _what_is_in_the_way(path: Path) -> str:
    if path.is_file():
        return "a file, not a folder"
    return "not a folder (a file is in the way)"


def _reason(exc: OSError) -> str:
    return (exc.strerror or str(exc)).lower()
