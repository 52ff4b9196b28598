"""The chat tests' fixtures (short socket paths, the fake llama-server), here too."""

from tests.chat.conftest import fake_llama, llama, sockets

__all__ = ["fake_llama", "llama", "sockets"]
