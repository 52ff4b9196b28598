"""The one way loopd turns a Python value into JSON text.

Everything loopd replays to the server (messages, the tools array) is serialized exactly once,
when it is appended to the session log, with this function. Replays use the stored text and never
call it again, so a change of key order or spacing can never reach a request already sent.
"""

import json
from typing import Any


def dumps(value: Any) -> str:
    """Compact JSON, UTF-8 kept as is (no ``\\uXXXX`` escapes), keys in insertion order."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
