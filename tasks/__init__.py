"""One thin Prefect task per pipeline stage; the work is in ``ensemble_core.pipeline``."""
