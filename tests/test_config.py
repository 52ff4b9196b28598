"""Configuration: environment and TOML sources, one clear error per bad value, README in sync."""

from pathlib import Path

import pytest

from loopd.chat.config import ChatSettings
from loopd.config import load_settings, settings_table
from loopd.errors import ConfigError


def test_defaults_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPD_SLOTS", "0, 2")
    monkeypatch.setenv("LOOPD_INFER_URL", "unix:/run/x.sock")
    settings = load_settings()
    assert settings.slots == (0, 2)
    assert settings.infer_url == "unix:/run/x.sock"
    assert settings.temperature == 0.6


def test_toml_file_is_read_and_environment_wins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "loopd.toml"
    config.write_text('model = "from-file"\nsilence_s = 5\n')
    monkeypatch.setenv("LOOPD_CONFIG", str(config))
    monkeypatch.setenv("LOOPD_SILENCE_S", "7")
    settings = load_settings()
    assert settings.model == "from-file"
    assert settings.silence_s == 7


@pytest.mark.parametrize(
    ("env", "value", "named"),
    [
        ("LOOPD_INFER_URL", "ftp://x", "LOOPD_INFER_URL"),
        ("LOOPD_INFER_URL", "unix:", "LOOPD_INFER_URL"),
        ("LOOPD_SLOTS", "a", "LOOPD_SLOTS"),
        ("LOOPD_SLOTS", "1,1", "LOOPD_SLOTS"),
        ("LOOPD_SILENCE_S", "-1", "LOOPD_SILENCE_S"),
        ("LOOPD_LOG_FORMAT", "xml", "LOOPD_LOG_FORMAT"),
        ("LOOPD_LOG_LEVEL", "BOGUS", "LOOPD_LOG_LEVEL"),
        ("LOOPD_NO_SUCH_KNOB", "1", None),
    ],
)
def test_bad_values_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, named: str | None
) -> None:
    monkeypatch.setenv(env, value)
    if named is None:
        load_settings()  # unknown LOOPD_ variables in the environment are ignored
        return
    with pytest.raises(ConfigError, match=named):
        load_settings()


def test_missing_or_broken_toml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LOOPD_CONFIG", str(tmp_path / "absent.toml"))
    with pytest.raises(ConfigError, match=r"absent\.toml"):
        load_settings()
    broken = tmp_path / "broken.toml"
    broken.write_text("model = \n")
    monkeypatch.setenv("LOOPD_CONFIG", str(broken))
    with pytest.raises(ConfigError, match=r"broken\.toml"):
        load_settings()


def test_unknown_key_in_toml_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "loopd.toml"
    config.write_text("modle = 'typo'\n")
    monkeypatch.setenv("LOOPD_CONFIG", str(config))
    with pytest.raises(ConfigError, match="modle"):
        load_settings()


def test_readme_tables_match_the_models() -> None:
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    assert settings_table() in readme, "regenerate with: loopd config --table"
    assert settings_table(ChatSettings) in readme, "regenerate with: loopd config --table"


def test_a_log_level_is_taken_in_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPD_LOG_LEVEL", "debug")
    assert load_settings().log_level == "DEBUG"
