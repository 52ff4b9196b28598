"""The pure decisions of the workspace quota and the disk reserve (``loopd.tools.quota``)."""

from loopd.tools.quota import Quota

QUOTA = 20 * 1024**2


def test_a_command_is_stopped_only_once_it_adds_to_the_workspace() -> None:
    """The pure decision of the monitor: a bound passed before the command began stops it only
    once the workspace holds more than then; a bound it passes itself stops it at once."""
    held = QUOTA + 4096
    assert Quota(QUOTA, 0).stop(started=held, used=held, free=1024**3) is None
    assert Quota(QUOTA, 0).stop(started=held, used=held - 4096, free=1024**3) is None
    grown = Quota(QUOTA, 0).stop(started=held, used=held + 4096, free=1024**3)
    assert "LOOPD_WORKSPACE_MAX_BYTES" in (grown or "")
    crossed = Quota(QUOTA, 0).stop(started=QUOTA - 4096, used=held, free=1024**3)
    assert "LOOPD_WORKSPACE_MAX_BYTES" in (crossed or "")
    # The disk under its reserve, filled by others: the command runs on until it grows.
    assert Quota(0, 2 * 1024**2).stop(started=0, used=0, free=1024**2) is None
    under = Quota(0, 2 * 1024**2).stop(started=0, used=4096, free=1024**2)
    assert "LOOPD_DISK_RESERVE_BYTES" in (under or "")
