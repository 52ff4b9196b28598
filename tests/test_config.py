"""Configuration: environment and TOML sources, one clear error per bad value, README in sync."""

import os
import re
from dataclasses import fields
from pathlib import Path

import pytest

from loopcommon.configload import known_variables
from loopcommon.errors import ConfigError
from loopd.config import (
    DEFAULTS,
    NO_MODEL,
    Settings,
    load_settings,
    settings_table,
    settings_tables,
)
from loopd.contextwindow.budget import BudgetRules
from loopd.engine.limits import Limits
from loopd.engine.request import Sampling

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's own LOOPD_* variables must not change what these tests read."""
    for name in list(os.environ):
        if name.upper().startswith("LOOPD_"):
            monkeypatch.delenv(name)


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


def test_the_mattermost_settings_are_read_from_the_mm_table_and_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "loopd.toml"
    config.write_text(
        '[mm]\nurl = "https://chat.example.org/"\nallowed_users = ["alice", "bob"]\n'
        "status_interval_s = 1.5\n"
    )
    monkeypatch.setenv("LOOPD_CONFIG", str(config))
    monkeypatch.setenv("LOOPD_MM_STATUS_INTERVAL_S", "2")
    monkeypatch.setenv("LOOPD_MM_ALLOWED_CHANNELS", "dev, ops")
    mm = load_settings().mm
    assert mm.url == "https://chat.example.org"
    assert mm.allowed_users == ("alice", "bob")
    assert mm.allowed_channels == ("dev", "ops")
    assert mm.status_interval_s == 2.0  # the environment wins, key by key


def test_the_long_session_knobs_are_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = load_settings()
    assert (defaults.compact_at, defaults.summary_max_tokens, defaults.prewarm) == (
        0.75,
        512,
        False,
    )
    monkeypatch.setenv("LOOPD_COMPACT_AT", "0.5")
    monkeypatch.setenv("LOOPD_PREWARM", "1")
    settings = load_settings()
    assert (settings.compact_at, settings.prewarm) == (0.5, True)
    monkeypatch.setenv("LOOPD_COMPACT_AT", "1.5")
    with pytest.raises(ConfigError, match=r"^LOOPD_COMPACT_AT: "):
        load_settings()


def test_the_engines_records_default_to_the_settings() -> None:
    """``Limits`` and ``BudgetRules`` carry no numbers of their own for what is a setting."""
    limits, rules = Limits(), BudgetRules()
    assert (limits.first_byte_s, limits.silence_s, limits.think_cap, limits.loop_window) == (
        DEFAULTS.first_byte_s,
        DEFAULTS.silence_s,
        DEFAULTS.think_cap,
        DEFAULTS.loop_window,
    )
    assert (rules.compact_at, rules.max_tokens, rules.summary_max_tokens) == (
        DEFAULTS.compact_at,
        DEFAULTS.max_tokens,
        DEFAULTS.summary_max_tokens,
    )
    shared = {f.name for f in fields(Limits)} | {f.name for f in fields(BudgetRules)}
    assert shared & set(Settings.model_fields) == {
        "first_byte_s",
        "silence_s",
        "think_cap",
        "loop_window",
        "compact_at",
        "max_tokens",
        "summary_max_tokens",
    }


def test_the_sampling_settings_default_to_the_requests_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Sampling`` holds the defaults; the settings take theirs from it and build it back."""
    assert DEFAULTS.sampling == Sampling()
    monkeypatch.setenv("LOOPD_TEMPERATURE", "0.2")
    monkeypatch.setenv("LOOPD_TOP_K", "5")
    assert load_settings().sampling == Sampling(temperature=0.2, top_k=5)


@pytest.mark.parametrize(
    ("env", "value", "said"),
    [
        ("LOOPD_INFER_URL", "ftp://x", "LOOPD_INFER_URL: must start with http://"),
        ("LOOPD_INFER_URL", "unix:", "LOOPD_INFER_URL: unix: URL needs a socket path"),
        ("LOOPD_SLOTS", "a", "LOOPD_SLOTS: must be a comma list of slot ids, e.g. 0,1"),
        ("LOOPD_SLOTS", "1,1", "LOOPD_SLOTS: slot ids must be distinct"),
        ("LOOPD_SILENCE_S", "-1", "LOOPD_SILENCE_S: Input should be greater than 0"),
        ("LOOPD_LOG_FORMAT", "xml", "LOOPD_LOG_FORMAT: must be auto, human or json"),
        ("LOOPD_LOG_LEVEL", "BOGUS", "LOOPD_LOG_LEVEL: must be a logging level"),
        ("LOOPD_MM_URL", "ftp://x", "LOOPD_MM_URL: must be unix:/path/to.sock"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, said: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert str(error.value).startswith(said)
    assert "\n" not in str(error.value)


def test_a_bad_value_in_the_file_names_the_key_and_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "loopd.toml"
    config.write_text('[mm]\nurl = "ftp://x"\n')
    monkeypatch.setenv("LOOPD_CONFIG", str(config))
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert str(error.value) == (
        f"`mm.url` in {config}: must be unix:/path/to.sock, http://host or https://host"
    )


@pytest.mark.parametrize(
    ("variable", "meant"),
    [
        ("LOOPD_FIRST_BYTES_S", "LOOPD_FIRST_BYTE_S"),
        ("LOOPD_MM_ALLOWED_USER", "LOOPD_MM_ALLOWED_USERS"),
        ("loopd_thinkcap", "LOOPD_THINK_CAP"),
    ],
)
def test_an_unknown_variable_is_refused_with_the_likely_name(
    monkeypatch: pytest.MonkeyPatch, variable: str, meant: str
) -> None:
    monkeypatch.setenv(variable, "1")
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert str(error.value) == f"unknown setting {variable.upper()}; did you mean {meant}?"


def test_the_config_variable_is_known_and_the_dev_cache_is_not_loopds() -> None:
    known = known_variables(Settings)
    assert {"LOOPD_CONFIG", "LOOPD_MM_URL", "LOOPD_STATE_DIR"} <= known
    assert not any("CACHE" in name for name in known)  # the dev kit's build cache is its own
    assert "LOOPD_MM" not in known  # the table itself is not a variable: its keys are


# Files that name unknown variables on purpose, and the one variable no loopd process reads (a
# secret a tools test puts in the environment to see that run_command does not pass it on).
ON_PURPOSE = {"test_config.py", "test_cli_errors.py"}
NOT_A_SETTING = {"LOOPD_BOT_TOKEN"}
# A variable as it is set or named: before "=", or quoted (a dict key, setenv, `docs`).
VARIABLE = re.compile(r"\bLOOPD_[A-Z0-9_]*[A-Z0-9](?=[=`\"'])")


def test_every_loopd_variable_the_repository_sets_is_a_setting() -> None:
    """No script, document or test sets a LOOPD_ variable that loopd would refuse."""
    root = Path(__file__).resolve().parent.parent
    files = [root / "Makefile", root / "README.md", *(root / "deploy").iterdir()]
    for folder in ("docs", "scripts", "tests", "bench", "dev"):
        files += [p for p in (root / folder).rglob("*") if p.suffix in {".py", ".md", ".sh"}]
    known = known_variables(Settings) | NOT_A_SETTING
    named = {
        (name, path.relative_to(root).as_posix())
        for path in files
        if path.is_file() and path.name not in ON_PURPOSE
        for name in VARIABLE.findall(path.read_text(errors="replace"))
    }
    assert sorted(pair for pair in named if pair[0] not in known) == []


def test_missing_or_broken_toml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    absent = tmp_path / "absent.toml"
    monkeypatch.setenv("LOOPD_CONFIG", str(absent))
    with pytest.raises(ConfigError, match=f"^LOOPD_CONFIG: no such file: {absent}$"):
        load_settings()
    broken = tmp_path / "broken.toml"
    broken.write_text("model = \n")
    monkeypatch.setenv("LOOPD_CONFIG", str(broken))
    with pytest.raises(ConfigError, match=rf"^LOOPD_CONFIG: {broken}: "):
        load_settings()


@pytest.mark.parametrize(
    ("text", "key", "meant"),
    [
        ("modle = 'typo'\n", "modle", "model"),
        ("[mm]\nurll = 'unix:/x.sock'\n", "mm.urll", "mm.url"),
    ],
)
def test_an_unknown_key_in_the_file_is_refused_with_the_likely_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str, key: str, meant: str
) -> None:
    config = tmp_path / "loopd.toml"
    config.write_text(text)
    monkeypatch.setenv("LOOPD_CONFIG", str(config))
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert str(error.value) == f"unknown setting `{key}` in {config}; did you mean `{meant}`?"


@pytest.mark.parametrize(
    ("think_cap", "max_tokens", "refused"),
    [
        (5000, 4096, True),
        (8192, 8192, True),
        (3073, 4096, True),
        (3072, 4096, False),
        (0, 64, False),
    ],
)
def test_a_thinking_cap_must_leave_the_answer_room_below_max_tokens(
    monkeypatch: pytest.MonkeyPatch, think_cap: int, max_tokens: int, refused: bool
) -> None:
    monkeypatch.setenv("LOOPD_THINK_CAP", str(think_cap))
    monkeypatch.setenv("LOOPD_MAX_TOKENS", str(max_tokens))
    if not refused:
        assert load_settings().max_tokens == max_tokens
        return
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert str(error.value) == (
        f"contradictory settings (think_cap_leaves_answer_room): think_cap {think_cap} leaves no "
        f"room for the answer below max_tokens {max_tokens}: think_cap + 1024 must be at most "
        "max_tokens (think_cap 0: no cap)"
    )


def test_the_defaults_keep_the_rule_and_a_zero_cap_is_no_cap() -> None:
    settings = load_settings()
    assert (settings.think_cap, settings.max_tokens) == (6144, 12288)
    assert settings.stream_think_cap == 6144
    uncapped = load_settings(think_cap=0, max_tokens=64)
    assert uncapped.stream_think_cap > uncapped.max_tokens  # thinking never reaches it


def test_the_example_config_sets_the_mattermost_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPD_CONFIG", str(DEPLOY / "loopd.toml"))
    settings = load_settings()
    assert settings.mm.url == "unix:/run/loopd/chat.sock"
    assert settings.mm.allowed_users == ()
    assert (settings.think_cap, settings.max_tokens) == (6144, 12288)


def test_readme_tables_match_the_models() -> None:
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    tables = settings_tables()
    assert settings_table() == "\n\n".join(tables)
    for table in tables:
        assert table in readme, "regenerate with: loopd config --table"
    assert "| `LOOPD_APPROVAL_WRITE_FILE` |" in tables[1]
    assert "| `LOOPD_MM_URL` |" in tables[2]


def test_a_log_level_is_taken_in_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPD_LOG_LEVEL", "debug")
    assert load_settings().log_level == "DEBUG"


TWO_ENDPOINTS = """
[[endpoint]]
name = "gpu1"
url = "unix:/run/loopd/infer-gpu1.sock"
model = "qwen"
slots = [0, 1]

[[endpoint]]
name = "gpu2"
url = "http://gpu2:8080/"
model = "qwen"
"""


def test_endpoint_tables_are_the_servers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "loopd.toml"
    config.write_text(TWO_ENDPOINTS)
    monkeypatch.setenv("LOOPD_CONFIG", str(config))
    settings = load_settings()
    assert settings.has_endpoint_tables
    assert [(e.name, e.url, e.model, e.slots) for e in settings.endpoints()] == [
        ("gpu1", "unix:/run/loopd/infer-gpu1.sock", "qwen", (0, 1)),
        ("gpu2", "http://gpu2:8080", "qwen", (0,)),
    ]
    one = settings.for_endpoint(settings.endpoints()[1])
    assert (one.infer_url, one.model, one.slots, one.endpoints()[0].name) == (
        "http://gpu2:8080",
        "qwen",
        (0,),
        "default",
    )


def test_the_one_server_variables_are_the_shorthand(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPD_INFER_URL", "unix:/run/loopd/infer.sock")
    monkeypatch.setenv("LOOPD_MODEL", "qwen")
    monkeypatch.setenv("LOOPD_SLOTS", "2,3")
    settings = load_settings()
    assert not settings.has_endpoint_tables
    assert [(e.name, e.url, e.model, e.slots) for e in settings.endpoints()] == [
        ("default", "unix:/run/loopd/infer.sock", "qwen", (2, 3))
    ]


def test_the_model_has_no_default_and_a_server_without_one_is_one_line() -> None:
    """An operator names the model; only what talks to a server needs it (not ``loopd log``)."""
    settings = load_settings()
    assert settings.model == ""
    with pytest.raises(ConfigError) as error:
        settings.endpoints()
    assert str(error.value) == NO_MODEL
    assert "\n" not in NO_MODEL
    assert "LOOPD_MODEL" in NO_MODEL


@pytest.mark.parametrize(
    ("variables", "extra", "problem"),
    [
        (
            {"LOOPD_MODEL": "x"},
            "",
            "contradictory settings (one_endpoint_form): model (LOOPD_MODEL) set beside "
            "[[endpoint]] tables",
        ),
        ({}, '[[endpoint]]\nname = "gpu1"\nurl = "http://x"\nmodel = "m"\n', "named 'gpu1'"),
        (
            {},
            '[[endpoint]]\nname = "gpu3"\nurl = "ftp://x"\nmodel = "m"\nslots = [-1]\n',
            "`endpoint[2].url` in {config}: must start with http://, https:// or unix:; "
            "`endpoint[2].slots` in {config}: slot ids must be distinct non-negative integers",
        ),
        ({}, '[[endpoint]]\nname = "gpu3"\nurl = "http://x"\n', "`endpoint[2].model`"),
    ],
)
def test_a_bad_endpoint_table_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    variables: dict[str, str],
    extra: str,
    problem: str,
) -> None:
    config = tmp_path / "loopd.toml"
    config.write_text(TWO_ENDPOINTS + extra)
    monkeypatch.setenv("LOOPD_CONFIG", str(config))
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert "\n" not in str(error.value)
    assert problem.format(config=config) in str(error.value)


def test_an_empty_endpoint_variable_is_no_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    # What a dump of the default settings gives, as a child process's environment.
    monkeypatch.setenv("LOOPD_ENDPOINT", "")
    assert load_settings().endpoint == ()
    monkeypatch.setenv("LOOPD_ENDPOINT", "[{")
    with pytest.raises(ConfigError, match=r"^LOOPD_ENDPOINT: Expecting property name"):
        load_settings()
