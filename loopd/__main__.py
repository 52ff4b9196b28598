"""``python -m loopd``: the same entry as the ``loopd`` command."""

from loopd.entry import loopd

loopd()
