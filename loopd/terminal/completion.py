"""``loopd completion bash|zsh``: a completion script generated from the command line's own
parser (shtab), so it knows every subcommand, option and choice there is, and never drifts.

bash: ``eval "$(loopd completion bash)"`` in ``~/.bashrc``, or the output saved as
``/etc/bash_completion.d/loopd``. zsh: the output saved as ``_loopd`` in a folder of ``$fpath``
(``loopd completion zsh > ~/.zfunc/_loopd`` with ``fpath+=~/.zfunc`` before ``compinit``).
"""

from __future__ import annotations

import argparse

import shtab


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    return shtab.complete(parser, shell=shell)
