"""What loopd and brokerd share, and nothing else: the config loader, schema migrations, log set-up,
addresses and the HTTP server shell, the request-id headers and their log context, broker call
statuses, the status page's data and rendering, the error root, the retry policy, the version and
the HTTP client transport both daemons read streamed answers through, the bubblewrap sandbox,
the tools' output cap and the one way an SQLite file is opened.

brokerd imports nothing of loopd but this package (``tests/test_architecture.py`` keeps it so), and
this package imports neither daemon.
"""
