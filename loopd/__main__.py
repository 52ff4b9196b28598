"""``python -m loopd``: the same entry as the ``loopd`` command."""

from loopcommon.entry import loopd

loopd()
