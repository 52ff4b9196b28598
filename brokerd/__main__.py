"""``python -m brokerd``: the same entry as the ``brokerd`` command."""

from loopcommon.entry import brokerd

brokerd()
