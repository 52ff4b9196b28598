"""systemd's readiness protocol (sd_notify): one datagram to ``$NOTIFY_SOCKET``.

With ``Type=notify`` (deploy/brokerd.service) systemd counts brokerd as started only once it
sends ``READY=1``, which ``serve`` does after every socket accepts connections; units ordered
after brokerd (the loopd container) therefore never start before the sockets exist.
"""

import logging
import os
import socket

logger = logging.getLogger(__name__)


def notify(state: str) -> bool:
    """Send ``state`` (``READY=1``, ``STOPPING=1``) to systemd; False when not run by systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        # systemd then times the start out and says so; brokerd itself can still serve.
        logger.warning("cannot tell systemd %s at %s: %s", state, address, exc)
        return False
    return True
