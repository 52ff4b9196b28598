"""loopd in a terminal: ``loopd chat`` (``chat``), ``loopd run`` (``oneshot``) and shell
completion (``completion``). ``render`` (what a turn looks like) and ``slash`` (the ``/``
commands) are pure; ``core`` runs the session on the event loop, ``link`` connects it to the main
thread, which reads the keyboard (``lineinput``)."""
