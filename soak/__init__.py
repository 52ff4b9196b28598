"""The load-and-chaos run (``make soak``): many threads on the two slots of the real llama-server
for minutes, with processes killed and services failing at random, and nothing lost.

Not shipped (like ``bench/``): it drives the whole stack from the outside, as separate processes
(llama-server in router mode, brokerd with its three sockets, ``loopd serve`` under a supervisor,
the fake Mattermost), and checks the outcome from what each of them left behind. How it is built
and what it checks: docs/soak.md, which the run writes.
"""
