"""loopd's command line: the parser (``main``) and one module per group of subcommands.

Each module's ``register(subparsers)`` adds its parsers, each with a ``handler(args, settings)``
(``base.Handler``); the work itself lives in the pieces the commands drive (the session log, the
daemon, the terminal, the self-test), which import nothing of this package.
"""
