"""Run inside the loopd container (``podman exec -i loopd python3 - < box_probe.py``): what the
box is and whether run_command's sandbox works there, printed as one JSON object.

Standard library and loopd only: this file is not in the image, it is sent on stdin.
"""

from __future__ import annotations

import errno
import http.client
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import anyio

from loopd.tools.command import detect_sandbox, run_command

# Run through run_command: each line says what the sandboxed shell can see or do.
SANDBOXED = """
test -e /var/lib/loopd && echo state=visible || echo state=hidden
test -e /run/loopd/infer.sock && echo sockets=visible || echo sockets=hidden
test -e /run/loopd-metrics/metrics.sock && echo metrics=visible || echo metrics=hidden
test -e /etc/loopd/loopd.toml && echo config=visible || echo config=hidden
echo shell_pid=$$
touch written-by-a-command && echo workspace=writable
unshare -U true 2>/dev/null && echo user_namespace=made || echo user_namespace=refused
"""


def status(name: str) -> str:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return line.split(":", 1)[1].strip()
    return ""


def root_is_read_only() -> bool:
    try:
        Path("/opt/loopd/probe").write_text("x")
    except OSError as exc:
        return exc.errno == errno.EROFS
    return False


async def sandbox_report(workspace: Path) -> dict[str, Any]:
    sandbox = await detect_sandbox()
    outcome = await run_command(
        SANDBOXED, workspace=workspace, sandbox=sandbox, timeout_s=60, output_max_bytes=65536
    )
    lines = outcome.output.splitlines()
    return {
        "isolated": sandbox.isolated,
        "reason": sandbox.reason,
        "privileges_kept": sandbox.privileges_kept,
        "exit_code": outcome.exit_code,
        "seen": dict(line.split("=", 1) for line in lines if "=" in line),
        "output": outcome.output,
    }


def broker(path: str, body: dict[str, str]) -> dict[str, Any]:
    """POST to brokerd's tool broker through its socket, as loopd's broker client does."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(60)
    sock.connect("/run/loopd/broker.sock")
    connection = http.client.HTTPConnection("broker")
    connection.sock = sock
    headers = {"Content-Type": "application/json"}
    connection.request("POST", path, body=json.dumps(body), headers=headers)
    answer: dict[str, Any] = json.loads(connection.getresponse().read())
    connection.close()
    return answer


def broker_call() -> dict[str, Any]:
    """host_uptime from brokerd's catalogue: brokerd runs it confined, on the host."""
    broker("/v1/find_tool", {"session": "box-probe", "query": "uptime"})
    call = {"session": "box-probe", "call_id": "probe-1", "name": "host_uptime", "arguments": "{}"}
    return broker("/v1/call_tool", call)


def main() -> int:
    workspace = Path("/workspace/box-probe")
    workspace.mkdir(exist_ok=True)
    report = {
        "uid": os.getuid(),
        "uid_map": Path("/proc/self/uid_map").read_text().split(),
        "cap_eff": status("CapEff"),
        "no_new_privs": status("NoNewPrivs"),
        "root_read_only": root_is_read_only(),
        # loopd's own view: the socket the sandboxed shell must not see is there.
        "metrics_socket": Path("/run/loopd-metrics/metrics.sock").is_socket(),
        "environ": dict(os.environ),
        "sandbox": anyio.run(sandbox_report, workspace),
        "broker_call": broker_call(),
    }
    json.dump(report, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
