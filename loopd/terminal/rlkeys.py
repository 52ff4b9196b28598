"""Keys bound to loopd's own functions in GNU readline: Python's ``readline`` module cannot.

The module binds keys only to readline's own commands and macros. loopd needs three keys of its
own while a line is read: Ctrl-Z (the terminal's suspend is off at the prompt, so that a pasted
0x1a byte is text: ``lineinput``), Ctrl-C (likewise), and the start of a bracketed paste (so that
a long paste is read whole and drawn as one short line, not drawn line by line). So the functions
are bound through readline's C interface (``rl_bind_keyseq``, with ``ctypes``), in the library
the ``readline`` module itself is linked to; a bound function runs on the main thread, inside
``input()``, with the line being edited intact.

Where the module is not GNU readline (libedit), ``GnuReadline.load`` is None and the chat works
without these keys (Ctrl-Z and Ctrl-C then act through the terminal's signals).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

# int (*rl_command_func_t)(int count, int key)
_COMMAND = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int)
_STUFFED_MAX = 511  # readline's own buffer of keys to read next


class GnuReadline:
    """The few functions and variables of the GNU readline library loopd uses."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._lib = library
        self._bound: list[Any] = []  # the C callbacks, alive as long as their bindings
        library.rl_bind_keyseq.argtypes = [ctypes.c_char_p, _COMMAND]
        library.rl_bind_keyseq.restype = ctypes.c_int
        library.rl_insert_text.argtypes = [ctypes.c_char_p]
        library.rl_insert_text.restype = ctypes.c_int
        library.rl_replace_line.argtypes = [ctypes.c_char_p, ctypes.c_int]
        library.rl_replace_line.restype = None
        library.rl_forced_update_display.restype = ctypes.c_int
        library.rl_stuff_char.argtypes = [ctypes.c_int]
        library.rl_stuff_char.restype = ctypes.c_int

    @classmethod
    def load(cls, module: ModuleType) -> GnuReadline | None:
        """The GNU readline library behind Python's ``readline`` module, or None (libedit, or
        a module without a file)."""
        if "libedit" in (module.__doc__ or ""):
            return None
        path = getattr(module, "__file__", None)
        if path is None:
            return None
        try:
            library = ctypes.CDLL(path)  # its own symbols and those of the library it links
            for name in ("rl_bind_keyseq", "rl_forced_update_display", "rl_done"):
                getattr(library, name)
        except (OSError, AttributeError) as exc:
            log.info("readline's own keys are not available (%s)", exc)
            return None
        return cls(library)

    def bind(self, keys: str, function: Callable[[], None]) -> None:
        """Run ``function`` when ``keys`` (readline's notation: ``\\C-z``, ``\\e[200~``) are
        typed while a line is read. An exception in it is logged, never raised into readline."""

        def command(count: int, key: int) -> int:
            try:
                function()
            except Exception:
                log.exception("the key %r failed", keys)
            return 0

        callback = _COMMAND(command)
        self._bound.append(callback)
        if self._lib.rl_bind_keyseq(keys.encode(), callback) != 0:
            log.warning("readline refused to bind %r", keys)

    def insert(self, text: str) -> None:
        """Insert ``text`` at the cursor of the line being read."""
        self._lib.rl_insert_text(text.encode("utf-8", "surrogateescape"))

    def stuff(self, keys: bytes) -> None:
        """Have readline read ``keys`` next, as if typed (keys read past a paste's end)."""
        for byte in keys[:_STUFFED_MAX]:
            self._lib.rl_stuff_char(byte)

    def redraw(self) -> None:
        """Draw the prompt and the line again from scratch (after the screen changed under it:
        the chat was suspended, a paste was read)."""
        self._lib.rl_forced_update_display()

    def accept_empty(self) -> None:
        """End the line being read now, as an empty line (``input()`` returns "")."""
        self._lib.rl_replace_line(b"", 0)
        ctypes.c_int.in_dll(self._lib, "rl_done").value = 1
