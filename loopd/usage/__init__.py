"""Usage per person: prompt and generated tokens and GPU seconds, per person, channel and day.

``ledger`` counts them from the session log's records; ``source`` reads the
log and the Mattermost threads' labels for it. ``loopd usage`` prints the ledger
(``loopd.cli.usage``), and ``loopd serve``'s metrics carry its totals (``loopd.status.usage``).
"""
