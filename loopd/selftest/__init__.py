"""The self-test: does the llama-server loopd talks to still match what loopd was built against?

``run_selftest`` (``run.py``) gathers facts from the server (``probe.py``), judges them against
the expectations recorded per model (``expected.py``, files in ``loopd/data/expected/``) with
pure checks (``checks.py``), and reports. ``template_keeps_reasoning`` answers the one template
question other code needs at run time.
"""

from loopd.selftest.probe import template_keeps_reasoning
from loopd.selftest.run import run_selftest
from loopd.selftest.template import TemplateAnswer

__all__ = [
    "TemplateAnswer",
    "run_selftest",
    "template_keeps_reasoning",
]
