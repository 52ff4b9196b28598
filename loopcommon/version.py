"""The installed version of loopd's distribution (loopd and brokerd ship in one)."""

from importlib.metadata import PackageNotFoundError, version
from typing import Final

DISTRIBUTION: Final = "loopd"


def installed_version() -> str:
    """``0.1.0``, or ``unknown`` when the distribution is not installed (a bare checkout)."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def package_version(program: str) -> str:
    """``loopd 0.1.0``: the program and the installed distribution's version."""
    found = installed_version()
    return f"{program} {found}" if found != "unknown" else f"{program} (not installed: no version)"
