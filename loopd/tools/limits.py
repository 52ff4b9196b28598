"""The caps every core tool works within.

Each cap bounds memory in loopd and tokens in the next prompt: whatever a tool returns is replayed
in every later request of the session, so a result is cut (with a note saying so) rather than sent
whole. The ``command_max_*`` caps bound what one run_command may take of the machine.
"""

from dataclasses import dataclass

from loopd.tools.quota import Quota


@dataclass(frozen=True)
class ToolLimits:
    read_max_bytes: int = 64_000
    """The most bytes of a file one read_file call returns."""
    write_max_bytes: int = 1_000_000
    """The largest file write_file and edit_file will write (and edit_file will read)."""
    list_max_entries: int = 300
    search_max_matches: int = 100
    search_max_file_bytes: int = 1_000_000
    """Larger files are skipped by search_files (and counted as skipped)."""
    search_max_files: int = 5_000
    search_line_chars: int = 240
    """A matching line longer than this is shown cut."""
    search_max_seconds: float = 20.0
    """A search still running after this long stops and says so (with what it found)."""
    command_timeout_s: float = 120.0
    """The timeout of run_command when the model gives none."""
    command_timeout_max_s: float = 600.0
    """The most the model may ask for with timeout_s."""
    command_output_max_bytes: int = 32_000
    command_max_memory_bytes: int = 4 * 1024**3
    """Writable memory of each process of a command (``RLIMIT_DATA``): past it, allocation fails."""
    command_max_file_bytes: int = 1024**3
    """The largest file a command may write (``RLIMIT_FSIZE``); past it the write fails."""
    command_max_processes: int = 256
    """Processes and threads a command may add (``RLIMIT_NPROC``, or a pids cgroup for root)."""
    command_max_cpu_s: int = 600
    """CPU seconds of each process of a command (``RLIMIT_CPU``); past it, it is killed."""
    result_max_chars: int = 80_000
    """The last cap, on any result text."""
    workspace_max_bytes: int = 1024**3
    """The most a session's workspace may hold (0: no quota; ``loopd.tools.quota``)."""
    disk_reserve_bytes: int = 64 * 1024**2
    """Free space the workspaces' filesystem keeps for the session log."""

    @property
    def quota(self) -> Quota:
        return Quota(self.workspace_max_bytes, self.disk_reserve_bytes)
