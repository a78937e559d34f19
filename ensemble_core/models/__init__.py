"""Models by name, one file each (big_vision style), or the user's own by import path.

``model.name: foo`` is the module ``ensemble_core/models/foo.py``, which defines
``build(cfg: ModelConfig, num_classes: int) -> flax.linen.Module`` and, when it takes
options, a frozen pydantic ``Options`` model of ``model.options``. ``model.name:
package.module:Name`` is the user's own: a ``flax.linen.Module`` class or a function
returning one, called with ``model.options`` as keyword arguments plus ``num_classes`` when
its signature takes it; a function whose first parameter is ``cfg`` is called as
``function(cfg: ModelConfig, num_classes: int)`` and validates ``cfg.options`` itself.

A member module takes float32 images ``[B, H, W, C]`` in [0, 1] and returns float32 logits
``[B, num_classes]``, written as Flax's examples write them (``examples/imagenet``):
``nn.BatchNorm(use_running_average=not train)``, ``nn.Dropout(deterministic=not train)``
on the ``'dropout'`` RNG stream, and a mode argument of ``__call__`` (``train``,
``training``, ``is_training``, ``deterministic``, or none:
:data:`ensemble_core.train.forward.MODE_ARGUMENTS`). Adding a model to the registry is adding its file;
the config accepts every module found here (:data:`ensemble_core.config.MODEL_NAMES`).
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import sys
from collections.abc import Mapping
from types import ModuleType

import flax.linen as nn
import jax
import jax.numpy as jnp
import pydantic

from ensemble_core.config import MODEL_NAMES, ModelConfig
from ensemble_core.config.messages import show
from ensemble_core.errors import ConfigError

__all__ = ["MODEL_NAMES", "build_model", "check_model", "import_model_function", "is_import_path", "model_options"]


def is_import_path(name: str) -> bool:
    """Whether ``model.name`` is an import path ``package.module:function`` (not a registry name)."""
    return ":" in name


def _registry_module(cfg: ModelConfig) -> ModuleType:
    if cfg.name not in MODEL_NAMES:
        raise ConfigError(
            f"unknown model.name '{cfg.name}'",
            fix=f"use one of {MODEL_NAMES} or an import path package.module:function",
        )
    return importlib.import_module(f"ensemble_core.models.{cfg.name}")


def model_options(cfg: ModelConfig) -> pydantic.BaseModel | None:
    """A registry model's ``model.options`` validated by its module's ``Options`` (defaults
    filled in); None for a model without options or one given by import path.

    Raises:
      ConfigError: an unknown option or a bad value (one line naming ``model.options.<key>``),
        or options given to a registry model that takes none.
    """
    if is_import_path(cfg.name):
        return None
    schema = getattr(_registry_module(cfg), "Options", None)
    if schema is None:
        if cfg.options:
            raise ConfigError(
                f"model.options {sorted(cfg.options)} given but model '{cfg.name}' takes no options; "
                f"fix: remove model.options"
            )
        return None
    try:
        return schema.model_validate(dict(cfg.options))
    except pydantic.ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        known = ", ".join(schema.model_fields)
        got = "" if "got" in first["msg"] else f" (got {show(first.get('input'))})"
        raise ConfigError(
            f"model.options.{where}: {first['msg']}{got}", fix=f"model '{cfg.name}' takes options {known}"
        ) from None


def import_model_function(path: str):
    """The callable named by ``model.name`` = ``package.module:function`` (the current
    directory is on the path, as for ``python -m``).

    Raises:
      ConfigError: the module does not import, or has no such callable; one line with the fix.
    """
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"model.name '{path}' is not an import path", fix="write it as package.module:function")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        missing = getattr(err, "name", None)
        if missing and not module_name.startswith(missing) and not missing.startswith(module_name):
            # the module was found, but a module it imports is missing (No module named 'tensorflow')
            raise ConfigError(
                f"model.name '{path}': module '{module_name}' imports '{missing}', which is not installed ({err})",
                fix=f"install {missing.split('.')[0]} where the run runs, or remove that import",
            ) from None
        raise ConfigError(
            f"model.name '{path}': cannot import module '{module_name}' ({err})",
            fix="install it or run from the directory that holds it (or add that directory to PYTHONPATH)",
        ) from None
    except Exception as err:  # noqa: BLE001  (the user's module may raise anything at import)
        raise ConfigError(
            f"model.name '{path}': importing '{module_name}' raised {type(err).__name__}: {str(err)[:200]}; "
            f"fix: make the module importable"
        ) from None
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise ConfigError(
                f"model.name '{path}': module '{module_name}' has no '{attr}'", fix="name a function defined there"
            )
        fn = getattr(fn, part)
    if not callable(fn):
        raise ConfigError(
            f"model.name '{path}' is a {type(fn).__name__}, not a function or class",
            fix="name a module class or a function",
        )
    return fn


def _construct(path: str, fn, cfg: ModelConfig, num_classes: int):
    """``fn`` called as a model: ``fn(cfg, num_classes)`` for the project's builder
    convention (a first parameter named ``cfg``), else ``fn(**model.options)`` plus
    ``num_classes=`` when its signature takes it (a module class, whose dataclass fields
    are its constructor's arguments, or a function returning a module)."""
    parameters: Mapping[str, inspect.Parameter]
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        parameters = {}
    names = list(parameters)
    if names and names[0] == "cfg":
        return fn(cfg, num_classes)
    options = dict(cfg.options)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    if "num_classes" in parameters or takes_any:
        options.setdefault("num_classes", num_classes)
    elif isinstance(fn, type) and issubclass(fn, nn.Module):
        raise ConfigError(
            f"model.name '{path}': {fn.__name__} takes no num_classes, so its outputs cannot be set to the "
            f"dataset's {num_classes} classes",
            fix="add a field num_classes: int to the module, or name a function that builds it with that many outputs",
        )
    return fn(**options)


def build_model(cfg: ModelConfig, num_classes: int) -> nn.Module:
    """The Flax module of one member named by ``cfg.name``, with ``num_classes`` outputs.

    Raises:
      ConfigError: an unknown registry name, bad options (:func:`model_options`), an import
        path that does not import (naming a missing dependency) or name a class or function,
        a class without ``num_classes``, one that raises, or one that does not give a
        ``flax.linen.Module``; each one line with the fix.
    """
    if not is_import_path(cfg.name):
        model_options(cfg)
        return _registry_module(cfg).build(cfg, num_classes)
    fn = import_model_function(cfg.name)
    try:
        model = _construct(cfg.name, fn, cfg, num_classes)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001  (the user's function validates model.options and may raise anything)
        raise ConfigError(
            f"model.name '{cfg.name}' raised {type(err).__name__}: {str(err)[:300]}",
            fix="check model.options: they are the constructor's (or function's) keyword arguments",
        ) from None
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"model.name '{cfg.name}' returned a {type(model).__name__}, not a flax.linen.Module; "
            f"fix: return the network of one member"
        )
    return model


def check_model(model: nn.Module, cfg: ModelConfig, image_shape: tuple[int, ...], num_classes: int) -> int:
    """Initialise one member on a dummy batch of the dataset's shape and run it in training
    and inference mode, abstractly (``jax.eval_shape``: no compute, no memory).

    Returns:
      The member's parameter count.

    Raises:
      ConfigError: initialisation or a forward pass fails, or the logits are not float
        ``[B, num_classes]``; one line naming the model and the fix.
    """
    from ensemble_core.train.forward import apply_inference, init_variables, split_variables, trace_train

    batch = jax.ShapeDtypeStruct((2, *image_shape), jnp.float32)
    try:
        variables = jax.eval_shape(lambda: init_variables(model, jax.random.key(0), tuple(image_shape)))
        params, model_state = split_variables(variables)
        logits = jax.eval_shape(lambda v, x: apply_inference(model, v, x), variables, batch)
        trained = jax.eval_shape(
            lambda v, x: trace_train(model, v, x, mutable=list(model_state) or False), variables, batch
        )
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001  (a user's network may raise anything while tracing)
        raise ConfigError(
            f"model '{cfg.name}' cannot run on images of shape {tuple(image_shape)} "
            f"({type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''})",
            fix="make the network accept float32 [B, H, W, C] images in [0, 1] and return [B, num_classes] logits",
        ) from None
    for mode, out in (("inference", logits), ("training", trained[0] if model_state else trained)):
        shape = getattr(out, "shape", None)
        if shape != (2, num_classes) or not jnp.issubdtype(out.dtype, jnp.floating):
            raise ConfigError(
                f"model '{cfg.name}' returns {_describe(out)} in {mode} mode for a batch of 2, not float logits "
                f"[2, {num_classes}]",
                fix=f"end the network with a Dense layer of num_classes={num_classes} outputs",
            )
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(params))


def _describe(out) -> str:
    if hasattr(out, "shape"):
        return f"an array of shape {tuple(out.shape)} and dtype {out.dtype}"
    return f"a {type(out).__name__}"
