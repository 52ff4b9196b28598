"""scripts/quadlet.py: deploy/loopd.container as podman arguments and as a systemd service.

Podman 4.3 (Debian 12) has no quadlet generator, so the image test and deploy/install.sh take
the container's flags from the unit file through this translation; these tests pin it to what
podman-systemd.unit(5) documents for each key.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from scripts import quadlet

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy"


def unit(text: str, name: str = "test.container") -> quadlet.UnitFile:
    return quadlet.parse_unit(text, name)


def args_of(text: str, *, under_systemd: bool = False) -> list[str]:
    return quadlet.podman_run_args(unit(text), {}, under_systemd=under_systemd)


def test_parse_reads_sections_continuations_and_comments() -> None:
    parsed = unit(
        "# a comment\n[Unit]\nDescription=x\n\n[Container]\n; another\nExec=serve \\\n"
        "  # inside a continuation\n  --flag\nVolume=a:/a\nVolume=b:/b\n"
    )
    assert parsed.values("Unit", "Description") == ["x"]
    assert parsed.last("Container", "Exec") == "serve  --flag"
    assert parsed.values("Container", "Volume") == ["a:/a", "b:/b"]


def test_a_line_outside_a_section_is_refused_by_line_number() -> None:
    with pytest.raises(quadlet.QuadletError, match=r"test.container:1: not a Key=Value line"):
        unit("Image=x\n")


def test_the_shipped_unit_gives_every_isolation_flag() -> None:
    container, volumes = quadlet.load_container(DEPLOY / "loopd.container")
    args = quadlet.podman_run_args(container, volumes, under_systemd=False)
    joined = " ".join(args)
    assert args[:5] == ["run", "--name", "loopd", "--replace", "--rm"]
    assert "--network none" in joined
    assert "--read-only=true" in args
    assert "--cap-drop all" in joined
    assert "--security-opt=no-new-privileges" in args
    assert "--userns keep-id:uid=1000,gid=1000" in joined
    assert "--pull never" in joined
    assert "--security-opt unmask=/proc/*" in joined
    volumes_given = [args[i + 1] for i, arg in enumerate(args) if arg == "-v"]
    assert volumes_given == [
        "%t/brokerd:/run/loopd:ro",  # the folder with infer.sock, chat.sock and broker.sock
        "loopd-state:/var/lib/loopd:U",  # VolumeName= of loopd-state.volume
        "loopd-workspace:/workspace:U",
        # loopd's metrics socket: a folder of the account's, which brokerd may enter
        "%h/.local/state/loopd/metrics:/run/loopd-metrics",
        "%h/.config/loopd/loopd.toml:/etc/loopd/loopd.toml:ro",
        "%h/.config/loopd/expected:/etc/loopd/expected:ro",
    ]
    image = args.index("localhost/loopd:latest")
    assert args[image + 1 :] == ["serve", "--expected-dir", "/etc/loopd/expected"]
    assert not {"--cgroups=split", "--sdnotify=conmon", "-d"} & set(args)


def test_the_example_metrics_settings_name_the_folder_the_unit_mounts() -> None:
    """loopd's metrics_addr (in the box) and brokerd's metrics_relay (on the host, /home/loopd
    being the home install.sh puts there) are one socket in the folder loopd.container mounts."""
    container, _ = quadlet.load_container(DEPLOY / "loopd.container")
    [mount] = [v for v in container.values("Container", "Volume") if "loopd-metrics" in v]
    host, box = mount.split(":")
    loopd_example = (DEPLOY / "loopd.toml").read_text()
    brokerd_example = (DEPLOY / "brokerd.toml").read_text()
    assert f'# metrics_addr = "unix:{box}/metrics.sock"' in loopd_example.splitlines()
    relay = host.replace("%h", "/home/loopd") + "/metrics.sock"
    assert f'# metrics_relay = "{relay}"' in brokerd_example.splitlines()
    assert f'"$HOME/{host.removeprefix("%h/")}"' in (DEPLOY / "install.sh").read_text()


def test_under_systemd_the_service_flags_quadlet_adds_are_there() -> None:
    args = args_of("[Container]\nImage=i\n", under_systemd=True)
    assert args == [
        "run",
        "--name",
        "systemd-test",
        "--replace",
        "--rm",
        "--cgroups=split",
        "--sdnotify=conmon",
        "-d",
        "i",
    ]


def test_each_key_maps_to_its_documented_flag() -> None:
    args = args_of(
        "[Container]\nImage=i\nContainerName=c\nNetwork=none\nReadOnly=no\n"
        "DropCapability=ALL NET_RAW\nNoNewPrivileges=true\nUserNS=keep-id\n"
        'Environment=A=1 "B=two words"\nEnvironmentFile=/e.env\nUnmask=/proc/a /proc/b\n'
        "Volume=/anon\nExec=run 'one arg'\n"
    )
    assert args == [
        "run",
        "--name",
        "c",
        "--replace",
        "--rm",
        "--network",
        "none",
        "--security-opt=no-new-privileges",
        "--cap-drop",
        "all",
        "--cap-drop",
        "net_raw",
        "--read-only=false",
        "--userns",
        "keep-id",
        "-v",
        "/anon",
        "--env",
        "A=1",
        "--env",
        "B=two words",
        "--env-file",
        "/e.env",
        "--security-opt",
        "unmask=/proc/a",
        "--security-opt",
        "unmask=/proc/b",
        "i",
        "run",
        "one arg",
    ]


def test_a_key_it_does_not_translate_is_refused_by_name() -> None:
    with pytest.raises(quadlet.QuadletError, match=r"PublishPort not translated"):
        args_of("[Container]\nImage=i\nPublishPort=8080:80\n")


def test_a_volume_unit_that_was_not_given_is_refused() -> None:
    with pytest.raises(quadlet.QuadletError, match=r"data.volume was not given"):
        args_of("[Container]\nImage=i\nVolume=data.volume:/data\n")


def test_a_volume_unit_without_a_name_gets_quadlets_default_name() -> None:
    volumes = {"data.volume": unit("[Volume]\n", "data.volume")}
    container = unit("[Container]\nImage=i\nVolume=data.volume:/data:U\n")
    args = quadlet.podman_run_args(container, volumes, under_systemd=False)
    assert "systemd-data:/data:U" in args


def test_a_bad_boolean_is_refused() -> None:
    with pytest.raises(quadlet.QuadletError, match=r"ReadOnly=maybe is not a boolean"):
        args_of("[Container]\nImage=i\nReadOnly=maybe\n")


def test_specifiers_expand_as_systemd_would() -> None:
    specifiers = {"h": "/home/op", "t": "/run/user/5"}
    assert (
        quadlet.expand("%t/brokerd:%h/x:100%%", specifiers) == "/run/user/5/brokerd:/home/op/x:100%"
    )
    with pytest.raises(quadlet.QuadletError, match=r"specifier %Z"):
        quadlet.expand("%Z", specifiers)


@pytest.mark.parametrize("word", ["plain", "two words", 'a "quote"', "back\\slash", "", "a;b"])
def test_systemd_quoting_reads_back_as_the_same_word(word: str) -> None:
    # systemd splits ExecStart= like a shell for these characters.
    assert shlex.split(quadlet.systemd_quote(word)) == [word]


def test_the_service_runs_the_translated_command_and_keeps_the_units_sections() -> None:
    container, volumes = quadlet.load_container(DEPLOY / "loopd.container")
    service = unit(quadlet.service_unit(container, volumes, "/usr/bin/podman"), "loopd.service")
    assert list(service.sections) == ["Unit", "Service", "Install"]
    assert service.values("Unit", "Requires") == ["brokerd.service"]
    assert service.values("Unit", "After") == ["brokerd.service"]
    assert service.last("Service", "Type") == "notify"
    assert service.last("Service", "Restart") == "on-failure"
    assert service.last("Install", "WantedBy") == "default.target"
    exec_start = service.last("Service", "ExecStart")
    assert exec_start is not None
    expected = quadlet.podman_run_args(container, volumes, under_systemd=True)
    assert shlex.split(exec_start) == ["/usr/bin/podman", *expected]
    assert service.last("Service", "ExecStop") == "/usr/bin/podman rm -v -f -i loopd"


def test_brokerds_unit_gives_its_command_and_environment() -> None:
    path = DEPLOY / "brokerd.service"
    service = quadlet.parse_unit(path.read_text(), str(path))
    argv, env = quadlet.exec_start(service, {"h": "/home/op", "t": "/run/user/5"})
    assert argv == ["/home/op/.local/share/brokerd/bin/brokerd", "serve"]
    assert env == {
        "BROKERD_CONFIG": "/home/op/.config/brokerd/brokerd.toml",
        "BROKERD_SOCKET_DIR": "/run/user/5/brokerd",
    }


def test_brokerds_unit_waits_for_readiness_and_is_a_user_unit() -> None:
    path = DEPLOY / "brokerd.service"
    service = quadlet.parse_unit(path.read_text(), str(path))
    assert service.last("Service", "Type") == "notify"
    # A user manager cannot order against the system's network-online.target.
    assert not [v for _, v in service.sections["Unit"] if "network-online.target" in v]
    assert service.last("Service", "RuntimeDirectory") == "brokerd"
    assert service.last("Service", "RuntimeDirectoryPreserve") == "yes"


def test_the_command_line_prints_the_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    code = quadlet.main(
        ["run-args", str(DEPLOY / "loopd.container"), "--home", "/h", "--runtime-dir", "/r"]
    )
    assert code == 0
    printed = capsys.readouterr().out.splitlines()
    assert "/r/brokerd:/run/loopd:ro" in printed
    assert "/h/.config/loopd/loopd.toml:/etc/loopd/loopd.toml:ro" in printed


def test_the_command_line_names_a_missing_file_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert quadlet.main(["service", str(tmp_path / "none.container")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("scripts/quadlet.py: ")
    assert err.count("\n") == 1
