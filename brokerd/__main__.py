"""``python -m brokerd``: the same entry as the ``brokerd`` command."""

from loopd.entry import brokerd

brokerd()
