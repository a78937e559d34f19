"""Prefect flows: the pipeline DAG and its CLI entry point."""

from flows import _env  # noqa: F401  (sets XLA_FLAGS before anything imports JAX)
