"""The turn engine: a turn's requests built, streamed and recorded.

``client`` is the one HTTP client of llama-server; ``request`` builds a body; ``stream`` reads one
request to its end, asking the policies ``liveness`` and ``thinkcap`` and the repetition watch
``loops``; ``turn`` runs requests and tools until the model answers, with the loop ``guards``
and ``notes``. Their vocabulary: ``limits``,
``progress`` (what a request is doing) and ``outcome`` (how it ended). ``cacheloss`` is the rule
that names a request's cache loss; ``pinning`` chooses a session's slot and whether its requests
are pinned to it. Keeping inside the context is ``loopd.contextwindow``'s; prewarm is
``loopd.prewarm``'s.
"""
