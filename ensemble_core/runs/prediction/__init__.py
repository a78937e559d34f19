"""Predictions of a run's ensemble on new images, and the prediction flow's files."""
