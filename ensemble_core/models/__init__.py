"""Models by name, one file each (big_vision style), or the user's own by import path.

``model.name: foo`` is the module ``ensemble_core/models/foo.py``, which defines
``build(cfg: ModelConfig, num_classes: int) -> flax.linen.Module`` and, when it takes
options, a frozen pydantic ``Options`` model of ``model.options``. ``model.name:
package.module:Name`` is the user's own: a ``flax.linen.Module`` or ``flax.nnx.Module``
class or a function returning one, called with ``model.options`` as keyword arguments plus
``num_classes`` when its signature takes it (a class without it, such as the NNX ``CNN`` of
Flax's MNIST example, is used as written, and :func:`check_model` compares its logits'
width with the dataset's class count); a function whose first parameter is ``cfg`` is
called as ``function(cfg: ModelConfig, num_classes: int)`` and validates ``cfg.options``
itself.

A member module takes float32 images ``[B, H, W, C]`` in [0, 1] and returns float32 logits
``[B, num_classes]``, written as Flax's examples write them (``examples/imagenet``):
``nn.BatchNorm(use_running_average=not train)``, ``nn.Dropout(deterministic=not train)``
on the ``'dropout'`` RNG stream, and a mode argument of ``__call__`` (``train``,
``training``, ``is_training``, ``deterministic``, or none:
:data:`ensemble_core.train.forward.MODE_ARGUMENTS`); an NNX module may also take the call's
RNG streams, ``__call__(self, x, rngs)``, as Flax's current NNX examples do
(:func:`ensemble_core.train.nnx_member.call_arguments`). Adding a model to the registry is adding its file;
the config accepts every module found here (:data:`ensemble_core.config.MODEL_NAMES`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import math
import os
import re
import sys
import sysconfig
import traceback
from collections.abc import Mapping
from types import ModuleType

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import pydantic
from flax import nnx

from ensemble_core.config import MODEL_NAMES, ModelConfig
from ensemble_core.config.messages import show
from ensemble_core.errors import ConfigError
from ensemble_core.train.forward import Network
from ensemble_core.train.nnx_member import NnxNetwork
from ensemble_core.user_import import CALL_EXIT_FIX, EXIT_FIX, UserModuleError, import_user_module, user_code

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
        module = import_user_module(module_name)
    except UserModuleError as err:
        raise ConfigError(f"model.name '{path}': {err}", fix=EXIT_FIX) from None
    except ImportError as err:
        missing = getattr(err, "name", None)
        package = (missing or "").split(".")[0]
        if package and "cannot import name" in str(err) and importlib.util.find_spec(package) is not None:
            # installed, but without that name: written for another version (a newer flax.nnx)
            raise ConfigError(
                f"model.name '{path}': module '{module_name}' needs a newer {package} than the installed "
                f"{_version(package)} ({str(err).split(' (')[0]})",
                fix=f"upgrade it (pip install -U {package}) or write the module for the installed version",
            ) from None
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


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "version"


def _is_nnx_class(fn) -> bool:
    return isinstance(fn, type) and issubclass(fn, nnx.Module)


def _parameters(fn) -> Mapping[str, inspect.Parameter]:
    """The arguments ``fn`` is called with (an NNX class's ``__init__``'s without ``self``:
    its metaclass hides them behind ``*args, **kwargs``)."""
    try:
        if _is_nnx_class(fn):
            return dict(list(inspect.signature(fn.__init__).parameters.items())[1:])
        return inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}


def _takes_num_classes(fn, options: Mapping) -> bool:
    """Whether ``fn`` (a class or function named by ``model.name``) is given the dataset's
    class count: a ``num_classes`` argument (or ``**kwargs``), ``model.options.num_classes``,
    or the builder convention ``fn(cfg, num_classes)``."""
    parameters = _parameters(fn)
    names = list(parameters)
    return (
        "num_classes" in parameters
        or "num_classes" in options
        or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        or (bool(names) and names[0] == "cfg")
    )


def _constructor(fn, cfg: ModelConfig, num_classes: int):
    """``fn`` as a constructor of one member, called with ``model.options`` as keyword
    arguments plus ``num_classes=`` when its signature takes it (a module class, whose
    dataclass fields or ``__init__`` arguments are its constructor's, or a function
    returning a module). A class without ``num_classes`` (Flax's MNIST example's NNX
    ``CNN``, its 10 outputs written in) is built as it is: :func:`check_model` accepts it
    when its logits are as wide as the dataset has classes. Returns
    ``(construct, takes_rngs)``: ``construct(**extra)``."""
    parameters = _parameters(fn)
    options = dict(cfg.options)
    if _takes_num_classes(fn, {}):
        options.setdefault("num_classes", num_classes)
    return (lambda **extra: fn(**options, **extra)), "rngs" in parameters


def _built(path: str, call):
    """``call()``, with anything the user's code raises as one ConfigError (an attempt to
    end the process, :func:`~ensemble_core.user_import.user_code`, included)."""
    try:
        with user_code(f"model.name '{path}'"):
            return call()
    except ConfigError:
        raise
    except UserModuleError as err:
        raise ConfigError(str(err), fix=CALL_EXIT_FIX) from None
    except (ImportError, AttributeError) as err:
        if "flax" in str(err) and "nnx" in str(err):
            raise ConfigError(
                f"model.name '{path}' uses a part of flax.nnx that Flax {flax.__version__} does not have ({err})",
                fix="upgrade Flax (pip install -U flax) or write the network for the installed version",
            ) from None
        raise _raised(path, err) from None
    except Exception as err:  # noqa: BLE001  (the user's function validates model.options and may raise anything)
        raise _raised(path, err) from None


def _raised(path: str, err: Exception) -> ConfigError:
    return ConfigError(
        f"model.name '{path}' raised {type(err).__name__}: {str(err)[:300]}",
        fix="check model.options (the constructor's or function's keyword arguments) and the code it names",
    )


def build_model(cfg: ModelConfig, num_classes: int) -> Network:
    """The network of one member named by ``cfg.name``, with ``num_classes`` outputs: a
    ``flax.linen.Module``, or an :class:`~ensemble_core.train.nnx_member.NnxNetwork` for a
    ``flax.nnx.Module`` class (or a function taking ``rngs`` that returns one), which is
    constructed abstractly here (no compute) and once per member, from the member's key,
    when the ensemble is initialised.

    Raises:
      ConfigError: an unknown registry name, bad options (:func:`model_options`), an import
        path that does not import (naming a missing dependency) or name a class or function,
        one that raises, an NNX module on a Flax too old
        for it (or using a part of ``flax.nnx`` the installed Flax lacks), an NNX module
        built without ``rngs`` (every member would start from the same weights), or
        anything else than a Flax module; each one line with the fix.
    """
    if not is_import_path(cfg.name):
        model_options(cfg)
        return _registry_module(cfg).build(cfg, num_classes)
    fn = import_model_function(cfg.name)
    names = list(_parameters(fn))
    if names and names[0] == "cfg":  # the project's builder convention: fn(cfg, num_classes)
        model = _built(cfg.name, lambda: fn(cfg, num_classes))
    else:
        construct, takes_rngs = _constructor(fn, cfg, num_classes)
        if _is_nnx_class(fn) or takes_rngs:
            if not takes_rngs:
                raise _without_rngs(cfg.name)
            return _built(cfg.name, lambda: NnxNetwork.from_constructor(cfg.name, lambda rngs: construct(rngs=rngs)))
        model = _built(cfg.name, construct)
    if isinstance(model, nnx.Module):
        raise _without_rngs(cfg.name)
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"model.name '{cfg.name}' returned a {type(model).__name__}, not a flax.linen or flax.nnx Module",
            fix="return the network of one member",
        )
    return model


def _without_rngs(path: str) -> ConfigError:
    return ConfigError(
        f"model.name '{path}' builds a flax.nnx module without taking rngs, so every member would start "
        f"from the same weights",
        fix="give the class (or function) an argument rngs: nnx.Rngs and build its layers with it",
    )


def check_model(
    model: Network, cfg: ModelConfig, image_shape: tuple[int, ...], num_classes: int, *, outputs: int = 1
) -> int:
    """Initialise one member on a dummy batch of the dataset's shape and run it in training
    and inference mode, abstractly (``jax.eval_shape``: no compute, no memory), called as
    the train step and the predictions call it (:func:`ensemble_core.train.forward.describe_call`).

    Returns:
      The member's parameter count.

    Raises:
      ConfigError: one line naming the model and the fix: a ``__call__`` the pipeline
        cannot call (:func:`ensemble_core.train.forward.check_call`); initialisation or a
        forward pass fails (naming the failing call and its argument when arguments do not
        fit a signature, the images only when their shape or dtype is the cause,
        :func:`_trace_refusal`); or the logits are not float ``[B, num_classes]``
        (``[outputs, B, num_classes]`` for a network of ``outputs`` members,
        :mod:`ensemble_core.networks`); a network given no ``num_classes`` is accepted
        when its logits are as wide as the dataset has classes, and refused naming both
        numbers when they are not.
    """
    from ensemble_core.train.forward import (
        apply_inference,
        check_call,
        init_variables,
        split_variables,
        train_unsharded,
    )

    check_call(model, cfg.name)
    batch = jax.ShapeDtypeStruct((2, *image_shape), jnp.float32)
    stage = "initialisation"
    try:
        with user_code(f"model '{cfg.name}' (initialised and run on a batch of 2)"):
            variables = jax.eval_shape(lambda: init_variables(model, jax.random.key(0), tuple(image_shape)))
            params, _ = split_variables(variables)
            stage = "inference mode"
            logits = jax.eval_shape(lambda v, x: apply_inference(model, v, x), variables, batch)
            stage = "training mode"
            trained, _ = jax.eval_shape(lambda v, x: train_unsharded(model, v, x), variables, batch)
    except ConfigError:
        raise
    except UserModuleError as err:
        raise ConfigError(str(err), fix=CALL_EXIT_FIX) from None
    except Exception as err:  # noqa: BLE001  (a user's network may raise anything while tracing)
        raise _trace_refusal(model, cfg.name, tuple(image_shape), stage, err) from None
    expected = (2, num_classes) if outputs == 1 else (outputs, 2, num_classes)
    for mode, out in (("inference", logits), ("training", trained)):
        shape = getattr(out, "shape", None)
        if shape != expected or not jnp.issubdtype(out.dtype, jnp.floating):
            width = shape[1] if shape is not None and len(shape) == 2 and shape[0] == 2 else num_classes
            if outputs == 1 and width != num_classes and _fixed_classes(cfg):
                raise ConfigError(
                    f"model '{cfg.name}' takes no num_classes and returns logits of width {width}, but the "
                    f"dataset has {num_classes} classes",
                    fix=f"make its last layer's outputs {num_classes}, or give it an argument num_classes: int "
                    f"for them (the pipeline passes the dataset's {num_classes})",
                )
            raise ConfigError(
                f"model '{cfg.name}' returns {_describe(out)} in {mode} mode for a batch of 2, not float logits "
                f"{list(expected)}",
                fix=f"end the network with a Dense layer of num_classes={num_classes} outputs",
            )
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(params))


def _fixed_classes(cfg: ModelConfig) -> bool:
    """Whether ``model.name`` is a user's class or function given no ``num_classes``
    (:func:`_takes_num_classes`): its logits' width is its own."""
    if not is_import_path(cfg.name):
        return False
    return not _takes_num_classes(import_model_function(cfg.name), cfg.options)


#: Python's messages for a call whose arguments do not fit the callee's signature; CPython
#: names the callee by its qualified name (``CNN.__call__() missing 1 required ...``).
_SIGNATURE_ERROR = re.compile(
    r"^(?P<call>[\w.<>]+)\(\) (?:missing \d+ required (?:positional|keyword-only) arguments?"
    r"|got an unexpected keyword argument|got multiple values for argument"
    r"|takes (?:from \d+ to )?\d+ (?:positional )?arguments? but \d+ (?:was|were) given"
    r"|got some positional-only arguments passed as keyword arguments)"
)
#: An error about an array's shape or dtype: the images can be the cause.
_ARRAY_ERROR = re.compile(r"shape|dimension|rank|dtype|incompatible|size", re.IGNORECASE)
#: Where library code lives (JAX, Flax, this project): a traceback's frames there are not
#: the user's; nor are the standard library's (outside its site-packages).
_LIBRARY_DIRS = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (jax.__file__, flax.__file__, os.path.dirname(os.path.abspath(__file__)))
)
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep


def _users(filename: str) -> bool:
    if filename.startswith("<") or filename.startswith(_LIBRARY_DIRS):
        return False
    return not filename.startswith(_STDLIB) or "-packages" in filename


def _where(err: BaseException) -> str:
    """`` at file.py:line`` of the innermost frame of ``err``'s traceback in the user's
    code (not JAX's, Flax's, the project's or Python's), or ``""``."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if _users(os.path.abspath(f.filename))]
    return f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""


def _trace_refusal(model: Network, name: str, image_shape: tuple[int, ...], stage: str, err: Exception) -> ConfigError:
    """The refusal of a network that failed while traced in ``stage`` (initialisation,
    inference mode, training mode): the cause as it is, not blamed on the images unless
    it is about an array's shape or dtype.

    - arguments that do not fit a signature (a ``TypeError`` of Python's call binding):
      the failing call and its argument, with a fix about that signature; the pipeline's
      own call of ``__call__`` (the arguments it passes, :func:`~ensemble_core.train.forward.describe_call`)
      or a call in the network's code (where);
    - an error about a shape, dimension or dtype: the images' shape and the call;
    - anything else: the call, the error and where in the network's code it was raised.
    """
    from ensemble_core.train.forward import MODE_ARGUMENTS, describe_call

    call = describe_call(model, stage == "training mode")
    text = str(err).splitlines()[0][:300] if str(err) else ""
    where = _where(err)
    cls = model.module_type if isinstance(model, NnxNetwork) else type(model)
    bad_call = _SIGNATURE_ERROR.match(text) if isinstance(err, TypeError) else None
    if bad_call and bad_call["call"] == f"{cls.__qualname__}.__call__":
        rngs = ", and rngs (flax.nnx modules)" if isinstance(model, NnxNetwork) else ""
        return ConfigError(
            f"model '{name}': the pipeline's call {call} ({stage}) does not fit {bad_call['call']}'s signature "
            f"(TypeError: {text})",
            fix=f"make {bad_call['call']} take the images first, then only arguments with defaults or those the "
            f"pipeline passes by name: a mode argument ({', '.join(MODE_ARGUMENTS)}){rngs}",
        )
    if bad_call:
        return ConfigError(
            f"model '{name}': the network's call {bad_call['call']}(){where} does not fit its signature, in "
            f"{stage} as {call} (TypeError: {text})",
            fix=f"call {bad_call['call']} with the arguments its signature takes{where}",
        )
    if _ARRAY_ERROR.search(text):
        return ConfigError(
            f"model '{name}' cannot run on images of shape {image_shape} ({stage}, {call}{where}: "
            f"{type(err).__name__}: {text})",
            fix="make the network accept float32 [B, H, W, C] images in [0, 1] and return [B, num_classes] logits",
        )
    if "rngs=None" in call and isinstance(err, AttributeError) and "'NoneType'" in text:
        fix = (
            f"in inference mode the pipeline passes rngs=None, as Flax's examples' evaluation steps do: pass rngs "
            f"on to nnx.Dropout(...)(x, rngs=rngs), which draws no key in model.eval() mode, or draw from it only "
            f"when it is not None{where}"
        )
    else:
        fix = f"make the network's code{where} run when called as {call}"
    return ConfigError(f"model '{name}': {call} raised {type(err).__name__} in {stage}{where}: {text}", fix=fix)


def _describe(out) -> str:
    if hasattr(out, "shape"):
        return f"an array of shape {tuple(out.shape)} and dtype {out.dtype}"
    return f"a {type(out).__name__}"
