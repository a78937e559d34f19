"""System tests: the reliability sweep, real commands through every entry point (make soak)."""
