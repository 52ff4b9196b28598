"""brokerd's settings: environment over the TOML file, and one clear line for bad config."""

from pathlib import Path

import pytest

from brokerd.config import load_settings, read_secret, read_secrets
from loopcommon.errors import ConfigError


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("BROKERD_"):
            monkeypatch.delenv(name)


def test_environment_overrides_the_toml_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "brokerd.toml"
    config.write_text(
        'socket_dir = "/srv/socks"\n'
        'inference_url = "unix:/run/llama.sock"\n'
        "body_cap_bytes = 1000\n"
        "[broker]\n"
        'audit_db = "/var/lib/brokerd/audit.db"\n'
    )
    monkeypatch.setenv("BROKERD_CONFIG", str(config))
    monkeypatch.setenv("BROKERD_BODY_CAP_BYTES", "2000")
    monkeypatch.setenv("BROKERD_MATTERMOST_URL", "https://chat.example.org")
    settings = load_settings()
    assert settings.socket_dir == Path("/srv/socks")
    assert settings.inference_url == "unix:/run/llama.sock"
    assert settings.body_cap_bytes == 2000
    assert settings.mattermost_url == "https://chat.example.org"
    assert settings.broker is not None
    assert settings.broker.audit_db == Path("/var/lib/brokerd/audit.db")


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("BROKERD_INFERENCE_URL", "ftp://host", "BROKERD_INFERENCE_URL"),
        ("BROKERD_MATTERMOST_URL", "https://user:pw@chat.example.org", "BROKERD_MATTERMOST_URL"),
        ("BROKERD_BODY_CAP_BYTES", "0", "BROKERD_BODY_CAP_BYTES"),
        ("BROKERD_LOG_LEVEL", "loud", "BROKERD_LOG_LEVEL"),
        ("BROKERD_BROKER__DEFAULT_TIMEOUT_S", "5", "BROKERD_BROKER__AUDIT_DB"),
    ],
)
def test_bad_config_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, named: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as error:
        load_settings()
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"{named}: ")
    assert "pw" not in message


def test_a_bad_value_in_the_file_names_the_key_and_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "brokerd.toml"
    config.write_text("[broker]\naudit_db = '/x.db'\nfind_tool_limit = 99\n")
    monkeypatch.setenv("BROKERD_CONFIG", str(config))
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert str(error.value) == (
        f"`broker.find_tool_limit` in {config}: Input should be less than or equal to 20"
    )


def test_a_misspelt_variable_is_refused_with_the_likely_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BROKERD_INFER_UPSTREAM", "unix:/run/llama.sock")
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert str(error.value) == (
        "unknown setting BROKERD_INFER_UPSTREAM; did you mean BROKERD_INFERENCE_URL?"
    )


def test_every_setting_has_a_variable_that_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check knows the nested broker names too, and the names are not case sensitive."""
    monkeypatch.setenv("BROKERD_SOCKET_DIR", "/srv/socks")
    monkeypatch.setenv("brokerd_log_level", "debug")
    monkeypatch.setenv("BROKERD_BROKER__AUDIT_DB", "/var/lib/brokerd/audit.db")
    monkeypatch.setenv("BROKERD_BROKER__FIND_TOOL_LIMIT", "5")
    settings = load_settings()
    assert settings.log_level == "debug"
    assert settings.broker is not None
    assert settings.broker.find_tool_limit == 5


def test_a_missing_config_file_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BROKERD_CONFIG", str(tmp_path / "absent.toml"))
    with pytest.raises(ConfigError, match=r"^BROKERD_CONFIG: no such file: .*absent\.toml$"):
        load_settings()


def test_a_malformed_config_file_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("socket_dir = \n")
    monkeypatch.setenv("BROKERD_CONFIG", str(config))
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert str(error.value).startswith("BROKERD_CONFIG: ")
    assert "\n" not in str(error.value)


def test_secrets_are_read_from_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("abc123\n")
    monkeypatch.setenv("BROKERD_MATTERMOST_TOKEN_FILE", str(token))
    secrets = read_secrets(load_settings())
    assert (secrets.bot_token, secrets.inference_key) == ("abc123", None)
    assert secrets.values() == ["abc123"]


@pytest.mark.parametrize(("content", "problem"), [("", "is empty"), ("a b", "more than one")])
def test_a_bad_secret_file_is_named(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "key"
    path.write_text(content)
    with pytest.raises(ConfigError, match=f"^BROKERD_INFERENCE_KEY_FILE: .*{problem}"):
        read_secret(path, "BROKERD_INFERENCE_KEY_FILE")
    with pytest.raises(ConfigError, match=r"^BROKERD_INFERENCE_KEY_FILE: cannot read"):
        read_secret(tmp_path / "absent", "BROKERD_INFERENCE_KEY_FILE")


def test_an_unreadable_secret_file_named_in_the_environment_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("BROKERD_MATTERMOST_TOKEN_FILE", str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match=r"^BROKERD_MATTERMOST_TOKEN_FILE: cannot read"):
        read_secrets(load_settings())


TWO_ENDPOINTS = """
[[endpoint]]
name = "gpu1"
url = "http://gpu1:8080"
inference_slots = [0, 1]
inference_models = ["qwen"]

[[endpoint]]
name = "gpu2"
url = "unix:/run/llama/gpu2.sock"
key_file = "{key}"
"""


def test_endpoint_tables_are_the_servers_and_each_key_is_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    key = tmp_path / "gpu2.key"
    key.write_text("secret-two\n")
    config = tmp_path / "brokerd.toml"
    config.write_text(TWO_ENDPOINTS.format(key=key))
    monkeypatch.setenv("BROKERD_CONFIG", str(config))
    settings = load_settings()
    gpu1, gpu2 = settings.inference_endpoints()
    assert gpu1 is not None
    assert gpu2 is not None
    assert (gpu1.name, gpu1.url, gpu1.inference_slots, gpu1.inference_models) == (
        "gpu1",
        "http://gpu1:8080",
        (0, 1),
        ("qwen",),
    )
    assert (gpu2.socket_name, gpu2.inference_slots, gpu2.inference_models) == (
        "infer-gpu2.sock",
        (),
        (),
    )
    secrets = read_secrets(settings)
    assert secrets.endpoint_keys == {"gpu2": "secret-two"}
    assert secrets.values() == ["secret-two"]


def test_without_endpoint_tables_the_single_server_is_served() -> None:
    assert load_settings().inference_endpoints() == (None,)


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        (
            'inference_url = "http://gpu0:8080"\n',
            "contradictory settings (one_inference_form): inference_url with [[endpoint]] tables",
        ),
        (
            "[[endpoint]]\nname = 'gpu1'\nurl = 'http://other:8080'\n",
            "two [[endpoint]] tables are named 'gpu1'",
        ),
        (
            "[[endpoint]]\nname = 'gpu3'\nurl = 'ftp://gpu3'\n",
            "`endpoint[2].url` in {config}: expected http://, https:// or unix:/path",
        ),
        (
            "[[endpoint]]\nname = '../x'\nurl = 'http://gpu3'\n",
            "`endpoint[2].name` in {config}: String should match pattern",
        ),
        (
            "[[endpoint]]\nname = 'gpu3'\nurl = 'http://gpu3'\nmodels = ['x']\n",
            "unknown setting `endpoint[2].models` in {config}",
        ),
    ],
)
def test_a_bad_endpoint_table_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, extra: str, problem: str
) -> None:
    config = tmp_path / "brokerd.toml"
    # A top-level key must come before the first table.
    top, tables = (extra, "") if extra.startswith("inference_url") else ("", extra)
    config.write_text(top + TWO_ENDPOINTS.format(key=tmp_path / "k") + tables)
    monkeypatch.setenv("BROKERD_CONFIG", str(config))
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert "\n" not in str(error.value)
    assert problem.format(config=config) in str(error.value)


def test_an_unreadable_endpoint_key_names_the_endpoint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "brokerd.toml"
    config.write_text(TWO_ENDPOINTS.format(key=tmp_path / "absent"))
    monkeypatch.setenv("BROKERD_CONFIG", str(config))
    with pytest.raises(ConfigError, match=r"^BROKERD_ENDPOINT gpu2: key_file: cannot read"):
        read_secrets(load_settings())


def test_each_server_bounds_its_own_save_folders(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "brokerd.toml"
    config.write_text(
        "[[endpoint]]\nname = 'gpu1'\nurl = 'http://gpu1:8080'\n"
        "slot_save_dirs = ['/srv/saves/a', '/srv/saves/b']\nslot_save_max_bytes = 1000\n"
        "[[endpoint]]\nname = 'gpu2'\nurl = 'http://gpu2:8080'\n"
    )
    monkeypatch.setenv("BROKERD_CONFIG", str(config))
    gpu1, gpu2 = load_settings().inference_endpoints()
    assert gpu1 is not None
    assert gpu2 is not None
    assert (gpu1.slot_save_dirs, gpu1.slot_save_max_bytes) == (
        (Path("/srv/saves/a"), Path("/srv/saves/b")),
        1000,
    )
    assert gpu2.slot_save_dirs == ()
    monkeypatch.setenv("BROKERD_SLOT_SAVE_DIRS", '["/srv/saves"]')
    with pytest.raises(ConfigError, match=r"one_inference_form.*slot_save_dirs"):
        load_settings()
