"""brokerd's socket proxies: inference (llama-server) and chat (Mattermost)."""

from brokerd.proxy.chat import CHAT_ROUTES, create_chat_app
from brokerd.proxy.chatpolicy import ChatPolicy
from brokerd.proxy.inference import ALLOWED_ROUTES, create_inference_app
from brokerd.proxy.upstream import BadUpstreamURL, Upstream, parse_upstream

__all__ = [
    "ALLOWED_ROUTES",
    "CHAT_ROUTES",
    "BadUpstreamURL",
    "ChatPolicy",
    "Upstream",
    "create_chat_app",
    "create_inference_app",
    "parse_upstream",
]
