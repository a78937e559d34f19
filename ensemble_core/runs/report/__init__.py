"""A run's report: ``report.json``, ``report.md`` and the training curves."""
