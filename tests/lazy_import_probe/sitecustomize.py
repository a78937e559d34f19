"""Test-only probe, put on PYTHONPATH of a worker or flow-run process by the tests.

``tensorflow_datasets`` imports itself inside ``etils.epy.lazy_imports()``, which replaces
``builtins.__import__`` for the whole process while it runs; an import made by any other
thread in that window gets a lazy proxy and can fail. This probe records, for every time
the window opens, which Python threads are alive (one JSON line per window in
``$ENSEMBLE_LAZY_IMPORT_PROBE``), and keeps the window open ``$ENSEMBLE_LAZY_IMPORT_WIDEN``
seconds longer so that a thread importing concurrently hits it instead of missing it by
luck.
"""

import contextlib
import json
import os
import sys
import threading
import time

_OUT = os.environ.get("ENSEMBLE_LAZY_IMPORT_PROBE")

if _OUT:
    from etils import epy

    _original = epy.lazy_imports
    _widen = float(os.environ.get("ENSEMBLE_LAZY_IMPORT_WIDEN", "0"))

    @contextlib.contextmanager
    def _probed(*args, **kwargs):
        with _original(*args, **kwargs):
            threads = sorted(t.name for t in threading.enumerate() if t is not threading.current_thread())
            caller = sys._getframe(2)  # the module whose `with epy.lazy_imports():` this is
            where = f"{caller.f_code.co_filename}:{caller.f_lineno}"
            with open(_OUT, "a") as f:
                f.write(json.dumps({"pid": os.getpid(), "where": where, "other_threads": threads}) + "\n")
            yield
            time.sleep(_widen)

    epy.lazy_imports = _probed
