"""Keeping a session inside its context window.

``budget`` decides how big the next prompt is, when to compact and how big one input may be;
``compaction`` makes room (a summary starts a new epoch); ``pool`` holds the rules of a shared KV
pool, where the requests running at once share one context. The turn (``loopd.turn.loop``)
asks them before each request.
"""
