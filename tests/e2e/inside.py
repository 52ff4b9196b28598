"""A probe run inside the sandbox: what can a process there reach? Then, optionally, exec a command.

``python -m tests.e2e.inside --report R.json [--tcp HOST:PORT ...] [--get NAME=SOCKET:TARGET ...]
[-- COMMAND ...]`` tries each TCP connection and each HTTP GET over a Unix socket, writes what
happened to the report (JSON), and then replaces itself with COMMAND, so the command runs in the
very namespace the probe examined. Standard library only, and it never fails on a refused
connection: it reports it. The test decides what is expected.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

TCP_TIMEOUT_S = 2.0
UNIX_TIMEOUT_S = 10.0


def try_tcp(address: str) -> dict[str, Any]:
    """Open (and close) a TCP connection to ``host:port``; say whether it worked and, if not,
    the errno's name."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    outcome: dict[str, Any] = {"address": address}
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(TCP_TIMEOUT_S)
        try:
            sock.connect((host, int(port)))
        except TimeoutError:
            outcome.update(connected=False, errno="timeout")
        except OSError as exc:
            name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            outcome.update(connected=False, errno=name, error=str(exc))
        else:
            outcome.update(connected=True)
    return outcome


def try_unix_get(spec: str) -> dict[str, Any]:
    """``NAME=SOCKET:TARGET``: GET TARGET over the Unix socket; the status code, or the error."""
    name, _, rest = spec.partition("=")
    path, _, target = rest.partition(":")
    outcome: dict[str, Any] = {"name": name, "target": target}
    request = f"GET {target} HTTP/1.1\r\nHost: box\r\nConnection: close\r\n\r\n".encode()
    received = bytearray()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(UNIX_TIMEOUT_S)
            sock.connect(path)
            sock.sendall(request)
            while data := sock.recv(65536):
                received += data
    except OSError as exc:
        outcome.update(status=None, error=str(exc))
        return outcome
    status_line = bytes(received).split(b"\r\n", 1)[0].decode("latin-1")
    parts = status_line.split()
    outcome.update(status=int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None)
    return outcome


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.inside")
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--tcp", action="append", default=[], metavar="HOST:PORT")
    parser.add_argument("--get", action="append", default=[], metavar="NAME=SOCKET:TARGET")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    report = {
        "interfaces": [name for _, name in socket.if_nameindex()],
        "tcp": [try_tcp(address) for address in args.tcp],
        "unix": [try_unix_get(spec) for spec in args.get],
    }
    args.report.write_text(json.dumps(report, indent=2))
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if command:
        sys.stdout.flush()
        os.execvp(command[0], command)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
