"""The run directory on disk: its paths, its lock, its checkpoints and its JSON records."""
