"""Training a run's members: one trainer, and member groups and JAX processes as its topologies."""
