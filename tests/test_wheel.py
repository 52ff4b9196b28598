"""The wheel is the product: what loopd needs at run time must be inside it."""

from __future__ import annotations

import json
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
    assert {"loopcommon", "loopd", "brokerd"} <= packages
    assert not packages & {"loopd_dev", "tests", "bench"}
    assert not [n for n in zipfile.ZipFile(wheel).namelist() if "fakes" in n or "devserver" in n]


def test_the_default_tools_file_lies_inside_the_package() -> None:
    package = Path(__file__).resolve().parents[1] / "loopd"
    assert load_settings().tools_file == CORE_TOOLS_FILE
    assert CORE_TOOLS_FILE.is_relative_to(package)
    assert CORE_TOOLS_FILE.is_file()


# --- the wheel installed on its own: what an operator gets from `pip install` -------------------


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with the wheel installed (not editable); its bin folder."""
    venv = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", str(wheel)],
        check=True,
        capture_output=True,
        timeout=900,
    )
    return venv / "bin"


@pytest.fixture
def empty_dir(tmp_path: Path) -> Path:
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty"


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """From an empty folder, with nothing of this checkout in the environment."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "LANG": "C.UTF-8"}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)


def test_the_installed_commands_start_from_an_empty_folder(
    installed: Path, empty_dir: Path
) -> None:
    for argv in (["loopd", "selftest", "--help"], ["brokerd", "serve", "--help"]):
        result = _run([str(installed / argv[0]), *argv[1:]], empty_dir)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("usage: "), result.stdout


def test_every_file_the_installed_config_names_exists(installed: Path, empty_dir: Path) -> None:
    result = _run([str(installed / "loopd"), "config"], empty_dir)
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    files = {key: Path(value) for key, value in config.items() if key.endswith("_file") and value}
    assert "tools_file" in files
    site_packages = next((installed.parent / "lib").glob("python3*/site-packages"))
    for key, path in files.items():
        assert path.is_file(), f"{key}: {path}"
        assert path.is_relative_to(site_packages), f"{key}: {path} is not the installed package's"


def test_the_installed_package_carries_the_expectations_and_the_catalogue(
    installed: Path, empty_dir: Path
) -> None:
    program = (
        "from loopd.selftest.expected import DEFAULT_DIR; "
        "from brokerd.tools.settings import DEFAULT_CATALOGUE_DIR; "
        "print(DEFAULT_DIR); print(DEFAULT_CATALOGUE_DIR)"
    )
    result = _run([str(installed / "python"), "-c", program], empty_dir)
    assert result.returncode == 0, result.stderr
    expected_dir, catalogue_dir = (Path(line) for line in result.stdout.splitlines())
    assert sorted(p.name for p in expected_dir.glob("*.json"))
    assert sorted(p.name for p in catalogue_dir.iterdir())
    assert not expected_dir.is_relative_to(REPO)


def test_unzip_lists_no_fakes(wheel: Path) -> None:
    unzip = shutil.which("unzip")
    assert unzip is not None, "unzip is required (apt-get install unzip)"
    listing = subprocess.run([unzip, "-l", str(wheel)], capture_output=True, text=True, check=True)
    assert "loopd/data/tools.schema.json" in listing.stdout
    for needle in ("fakes", "devserver", "loopd_dev", "bench"):
        assert needle not in listing.stdout, needle
