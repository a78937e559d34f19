"""A user's NNX network written for a Flax newer than the installed one: it imports a part
of ``flax.nnx`` this Flax lacks (the refusal must say so, not "install it")."""

from flax.nnx import LayerFromAFutureFlax  # type: ignore[attr-defined]  # noqa: F401


class Net:  # pragma: no cover  (never reached)
    pass
