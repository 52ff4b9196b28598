"""A git repository as a box would write it to attack the host: its config names a script for
every key that makes git run a program, and HEAD is a commit with a signature header."""

import subprocess
from dataclasses import dataclass
from pathlib import Path

# The config keys that make git run a program, each with the script it names.
PROGRAM_KEYS = (
    "gpg.program",
    "core.fsmonitor",
    "core.pager",
    "diff.external",
    "diff.evil.textconv",
    "core.hooksPath",
)
IDENTITY = ["-c", "user.name=Box", "-c", "user.email=box@example.org"]


@dataclass(frozen=True)
class AttackRepo:
    path: Path
    marker: Path  # each script appends its name here, on the host

    def ran(self) -> list[str]:
        return self.marker.read_text().split() if self.marker.exists() else []


def git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        ["git", *IDENTITY, "-C", str(repo), *args],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return result.stdout


def attack_repo(path: Path, marker: Path) -> AttackRepo:
    """Write the repository at ``path``; its scripts record a run in ``marker`` and on stderr."""
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / "a.txt").write_text("first\n")
    (path / "b.txt").write_text("first\n")
    git(path, "add", "a.txt", "b.txt")
    git(path, "commit", "-q", "-m", "first commit")
    tree, parent = git(path, "rev-parse", "HEAD^{tree}", "HEAD").split()
    signed = (
        f"tree {tree}\nparent {parent}\n"
        "author Box <box@example.org> 1700000000 +0000\n"
        "committer Box <box@example.org> 1700000000 +0000\n"
        "gpgsig -----BEGIN PGP SIGNATURE-----\n \n iQEzBAABCAAdFiEE\n -----END PGP SIGNATURE-----\n"
        "\nsigned commit\n"
    )
    object_file = path.parent / f"{path.name}.commit"
    object_file.write_text(signed)
    sha = git(path, "hash-object", "-t", "commit", "-w", str(object_file)).strip()
    git(path, "update-ref", "HEAD", sha)
    hooks = path / "hooks"
    hooks.mkdir()
    for key in PROGRAM_KEYS:
        script = path / f"{key}.sh"
        script.write_text(f'#!/bin/sh\necho {key} >> {marker}\necho ran-{key} >&2\ncat "$1"\n')
        script.chmod(0o755)
        git(path, "config", key, str(hooks if key == "core.hooksPath" else script))
    for hook in ("post-checkout", "pre-commit", "post-commit"):
        (hooks / hook).write_text(f"#!/bin/sh\necho core.hooksPath >> {marker}\n")
        (hooks / hook).chmod(0o755)
    git(path, "config", "log.showSignature", "true")
    # a.txt is shown through diff.external, b.txt through the textconv driver.
    (path / ".gitattributes").write_text("b.txt diff=evil\n")
    (path / "a.txt").write_text("first\nchanged\n")  # so status and diffs have work to do
    return AttackRepo(path, marker)
