"""A run's ensemble: its pool, the select stage, stratification, and loading the ensemble."""
