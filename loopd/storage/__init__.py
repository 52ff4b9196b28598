"""SQLite plumbing shared by every file loopd and brokerd own; see ``migrations``."""
