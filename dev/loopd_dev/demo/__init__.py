"""``make demo``'s chat page, served beside the fake Mattermost (``python -m loopd_dev.demo``)."""

from loopd_dev.demo.page import PageOptions, page_config, page_routes

__all__ = ["PageOptions", "page_config", "page_routes"]
