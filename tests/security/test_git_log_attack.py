"""git_log reads a repository the box wrote, on the host: nothing in it may run a program.

The attack as it was found: the box writes a repository in its workspace whose ``.git/config``
sets ``log.showSignature`` and ``gpg.program`` (and every other key that names a program) to a
script of its own, makes HEAD a signed commit, and asks brokerd's git_log for its log. Each
script appends its name to a marker file on the host and to git's stderr.
"""

import json
import os
import subprocess
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from brokerd.tools.settings import DEFAULT_CATALOGUE_DIR
from tests.security.broker_api import BrokerClient
from tests.security.brokerd_run import brokerd
from tests.security.gitrepo import AttackRepo, attack_repo, git


class Setup:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.workspaces = folder / "workspaces"
        self.marker = folder / "marker"
        self.repo = attack_repo(self.workspaces / "mm_s1" / "repo", self.marker)
        self.outside = folder / "admin-home" / "repo"
        self.outside.mkdir(parents=True)
        git(self.outside, "init", "-q")
        git(self.outside, "commit", "-q", "--allow-empty", "-m", "secret admin commit")
        (self.workspaces / "mm_s1" / "link").symlink_to(self.outside)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Setup, BrokerClient]]:
    folder = Path(tmp_path_factory.mktemp("gitlog"))
    made = Setup(folder)
    variables = {
        "BROKERD_BROKER__AUDIT_DB": str(folder / "state" / "audit.db"),
        "BROKERD_BROKER__HOST_PATH_ROOTS": json.dumps([str(made.workspaces)]),
    }
    with brokerd(folder, variables, only=["broker"]) as running:
        client = BrokerClient(running.socket("broker"))
        try:
            yield made, client
        finally:
            client.close()


@pytest.mark.attack(
    attack="A box-written repository names programs for git_log to run on the host",
    input=".git/config: log.showSignature + gpg.program, core.fsmonitor, core.pager, "
    "diff.external, textconv, core.hooksPath, each a script; HEAD a signed commit",
    expected="git_log lists the commits; no script runs (no marker on the host, none on stderr)",
)
def test_git_log_of_a_hostile_repository_runs_nothing(
    setup: tuple[Setup, BrokerClient], observed: Callable[[str], None]
) -> None:
    made, broker = setup
    answer = broker.call("git_log", {"repo": str(made.repo.path), "max_count": 5})
    observed(f"status {answer['status']}; scripts run: {made.repo.ran() or 'none'}")
    assert made.repo.ran() == []
    assert "ran-" not in answer["result"]
    assert answer["status"] == "ok", answer["result"]
    lines = answer["result"].splitlines()
    assert [line.split(" ", 3)[3] for line in lines] == ["signed commit", "first commit"]


@pytest.mark.attack(
    attack="git_log reads a host repository outside the allowed folders",
    input="repo = an administrator's repository, by absolute path and by `..` out of a workspace",
    expected="refused before anything runs, naming the allowed folders",
)
def test_git_log_refuses_paths_outside_the_allowed_folders(
    setup: tuple[Setup, BrokerClient], observed: Callable[[str], None]
) -> None:
    made, broker = setup
    escape = f"{made.workspaces}/mm_s1/../../admin-home/repo"
    for repo in (str(made.outside), escape):
        answer = broker.call("git_log", {"repo": repo})
        assert answer["status"] == "refused", answer
        assert "secret admin commit" not in answer["result"]
        assert f"must be a path under {made.workspaces}" in answer["result"]
    observed(f"status refused: {answer['result'].replace(str(made.workspaces), '<workspaces>')}")


@pytest.mark.attack(
    attack="git_log's errors tell whether a host path exists",
    input="repo = /etc (exists) and /nonexistent-... (does not); a workspace symlink to a host "
    "repository, and a missing workspace path",
    expected="the same answer for each pair: nothing about the host beyond the allowed folder",
)
def test_git_log_errors_do_not_reveal_host_paths(
    setup: tuple[Setup, BrokerClient], observed: Callable[[str], None]
) -> None:
    made, broker = setup
    outside = [broker.call("git_log", {"repo": repo}) for repo in ("/etc", "/nonexistent-4e1d")]
    assert outside[0] == outside[1]
    link, missing = (made.workspaces / "mm_s1" / name for name in ("link", "missing"))
    through_link = broker.call("git_log", {"repo": str(link)})
    nothing = broker.call("git_log", {"repo": str(missing)})
    assert "secret admin commit" not in through_link["result"]
    assert through_link["status"] == nothing["status"] == "error"
    assert through_link["result"].replace(str(link), "P") == nothing["result"].replace(
        str(missing), "P"
    )
    shown = through_link["result"].replace(str(made.workspaces), "<workspaces>").strip()
    observed(f"/etc and a missing path: identical refusals; symlink out: {shown}")


def shipped_git_log() -> tuple[list[str], list[str], dict[str, str]]:
    """git_log's own options from the shipped catalogue: those before ``-C``, the log options
    that switch programs off, and its environment."""
    spec = tomllib.loads((DEFAULT_CATALOGUE_DIR / "git_log.toml").read_text())
    argv: list[str] = spec["run"]["argv"]
    before_c = argv[1 : argv.index("-C")]
    log_options = [arg for arg in argv[argv.index("log") + 1 :] if arg.startswith("--no-")]
    return before_c, log_options, dict(spec["run"]["env"])


# (what git does, its arguments, the key that makes it run a program)
OTHER_KEYS = [
    ("status", ["status"], "core.fsmonitor"),
    ("diff", ["diff"], "diff.external"),
    ("log -p --textconv", ["log", "-p", "-n", "2", "--no-ext-diff"], "diff.evil.textconv"),
    ("checkout", ["checkout", "-q", "-b", "other"], "core.hooksPath"),
]


@pytest.mark.attack(
    attack="Other keys that make git run a program, against git_log's options alone (no sandbox)",
    input="core.fsmonitor (status), diff.external (diff), textconv (log -p), "
    "core.hooksPath (checkout), in a box-written .git/config",
    expected="each runs its script under plain git; none runs with git_log's options",
)
@pytest.mark.parametrize(("action", "args", "key"), OTHER_KEYS, ids=[k for _, _, k in OTHER_KEYS])
def test_git_logs_options_stop_every_program_key(
    tmp_path: Path, action: str, args: list[str], key: str, observed: Callable[[str], None]
) -> None:
    before_c, log_options, tool_env = shipped_git_log()
    env = {"PATH": os.environ["PATH"], **tool_env}
    plain = attack_repo(tmp_path / "plain", tmp_path / "plain-marker")
    run_git(plain, args, env)
    assert key in plain.ran(), f"{action} under plain git should run {key}: the trick is real"
    hardened = attack_repo(tmp_path / "hardened", tmp_path / "hardened-marker")
    extra = log_options if args[0] in ("log", "diff") else []
    run_git(hardened, [*before_c, "-C", str(hardened.path), *args, *extra], env, prefixed=True)
    observed(f"{action}: plain git ran {plain.ran()}; with git_log's options: {hardened.ran()}")
    assert hardened.ran() == []


def run_git(
    repo: AttackRepo, args: list[str], env: dict[str, str], *, prefixed: bool = False
) -> None:
    argv = ["git", *args] if prefixed else ["git", "-C", str(repo.path), *args]
    subprocess.run(argv, env=env, capture_output=True, check=False, timeout=30)
