"""brokerd's socket proxies: inference (llama-server) and chat (Mattermost)."""
