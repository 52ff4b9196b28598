"""First-class fakes of a llama-server and a Mattermost server, for tests and for anyone."""
