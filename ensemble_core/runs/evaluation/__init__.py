"""The evaluation stage: every configured evaluator on a run's ensemble."""
