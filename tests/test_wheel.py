"""The wheel is the product: what loopd needs at run time must be inside it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from loopd.config import CORE_TOOLS_FILE, load_settings

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy: setuptools writes build/ and *.egg-info into the tree it builds.
    source = tmp_path_factory.mktemp("source") / "loopd"
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__", "state"),
    )
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("loopd-*.whl")
    return built


def test_the_wheel_carries_the_core_tools_file(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "loopd/data/tools.schema.json" in names


def test_the_wheel_carries_the_product_only(wheel: Path) -> None:
    packages = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {"loopd", "brokerd"} <= packages
    assert not packages & {"loopd_dev", "tests", "bench"}
    assert not [n for n in zipfile.ZipFile(wheel).namelist() if "fakes" in n or "devserver" in n]


def test_the_default_tools_file_lies_inside_the_package() -> None:
    package = Path(__file__).resolve().parents[1] / "loopd"
    assert load_settings().tools_file == CORE_TOOLS_FILE
    assert CORE_TOOLS_FILE.is_relative_to(package)
    assert CORE_TOOLS_FILE.is_file()
