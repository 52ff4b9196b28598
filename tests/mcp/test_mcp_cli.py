"""``brokerd tools list [--json]`` with MCP servers configured in brokerd's TOML file."""

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.mcp.support import REPO_ROOT, time_server, tiny_server


def toml_config(folder: Path, *tables: str) -> Path:
    path = folder / "brokerd.toml"
    path.write_text(f'[broker]\naudit_db = "{folder / "audit.db"}"\n\n' + "\n".join(tables))
    return path


def mcp_table(name: str, command: tuple[str, ...], paths: tuple[str, ...] = ()) -> str:
    lines = [f"name = {json.dumps(name)}", f"command = {json.dumps(list(command))}"]
    lines.append(f"paths = {json.dumps(list(paths))}")
    return "[[mcp]]\n" + "\n".join(lines) + "\n"


def brokerd(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "BROKERD_CONFIG": str(config)}
    return subprocess.run(
        [sys.executable, "-m", "brokerd", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_tools_list_shows_each_tools_source_and_server_state(tmp_path: Path) -> None:
    time, tiny = time_server(), tiny_server()
    assert time.command is not None
    assert tiny.command is not None
    config = toml_config(
        tmp_path,
        mcp_table("time", time.command),
        mcp_table("tiny", tiny.command, tiny.paths),
        mcp_table("broken", ("/bin/false",)),
        '[broker.approval]\n"tiny.write_bytes" = "ask"\n',
    )
    listed = brokerd(config, "tools", "list")
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()]
    assert rows[0] == ["TOOL", "SOURCE", "MODE", "SERVER"]
    assert ["clock_now", "builtin", "auto", "-"] in rows
    assert ["git_log", "command", "auto", "-"] in rows
    assert ["time.get_current_time", "mcp", "time", "auto", "up"] in rows
    assert ["tiny.crash", "mcp", "tiny", "auto", "up"] in rows
    assert ["tiny.write_bytes", "mcp", "tiny", "ask", "up"] in rows  # [broker.approval] says so
    broken = next(row for row in rows if row[0] == "broken.*")
    assert broken[:4] == ["broken.*", "mcp", "broken", "-"]
    # /bin/false exits at once: brokerd sees either its exit or its input closing first (both
    # say it is down, and why); on a busy machine either wins.
    said = " ".join(broken[4:])
    assert re.match(
        r"down \((exited with status 1|stopped reading its input); brokerd restarts it", said
    ), said

    as_json = brokerd(config, "tools", "list", "--json")
    assert as_json.returncode == 0, as_json.stderr
    listing = json.loads(as_json.stdout)
    tools = {tool["name"]: tool for tool in listing["tools"]}
    assert tools["clock_now"] == {"name": "clock_now", "source": "builtin", "mode": "auto"}
    assert tools["time.convert_time"] == {
        "name": "time.convert_time",
        "source": "mcp",
        "mode": "auto",
        "server": "time",
        "up": True,
    }
    servers = {server["name"]: server for server in listing["mcp_servers"]}
    assert servers["broken"]["up"] is False
    assert servers["tiny"]["tools"] == 7


def test_a_bad_mcp_table_is_one_line_and_exit_2(tmp_path: Path) -> None:
    config = toml_config(
        tmp_path, '[[mcp]]\nname = "x"\ncommand = ["a"]\nurl = "http://127.0.0.1:1/mcp"\n'
    )
    listed = brokerd(config, "tools", "list")
    assert listed.returncode == 2
    assert listed.stderr == (
        f"brokerd: bad config: `mcp[0]` in {config}: give either command (a stdio server) or url "
        "(streamable HTTP)\n"
    )


def test_a_server_program_that_is_not_there_is_named(tmp_path: Path) -> None:
    config = toml_config(tmp_path, mcp_table("x", ("no-such-mcp-server",)))
    listed = brokerd(config, "tools", "list")
    assert listed.returncode == 2
    assert listed.stderr.strip() == (
        "brokerd: bad config: mcp server x: no-such-mcp-server: not found on PATH "
        "/usr/local/bin:/usr/bin:/bin"
    )
