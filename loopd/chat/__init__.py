"""The Mattermost adapter: posts in, replies and status out, one session per thread.

Pure cores (``intake``, ``split``, ``status``, ``model``) decide; thin shells (``rest``, ``ws``,
``cursor``, ``outbox``) do the I/O; ``adapter`` ties them together.
"""
