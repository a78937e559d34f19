"""The champion's life: promotion, retraining signals and retention of old runs."""
