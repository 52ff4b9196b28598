"""The self-test: does the llama-server loopd talks to still match what loopd was built against?

``run_selftest`` (``run.py``) gathers facts from the server (``probe.py``), judges them against
the expectations recorded per model (``expected.py``, files in ``loopd/data/expected/``) with
pure checks (``checks.py``), and reports. ``template_keeps_reasoning`` (``probe.py``) answers
the one template question other code needs at run time. The package imports none of them: a
command that only reads the recorded expectations (``loopd run``) does not load the probes.
"""
