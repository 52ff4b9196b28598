"""The Mattermost adapter: posts in, answers and status out, one session per thread.

Pure cores (``intake``, ``split``, ``status``, ``attachments``, ``model``) decide; thin shells
(``rest``, ``ws``, ``cursor``, ``outbox``, ``turnposts``) do the I/O; ``threads`` runs the turns
and ``adapter`` ties them together.
"""
