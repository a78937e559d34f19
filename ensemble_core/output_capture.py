"""Capturing the output a user's code prints, so that it cannot flood the run's output.

What the user's code prints (at import, while a network is built, and whenever it is
traced: the model check, training's step, evaluation, ``flows.predict``) is captured by
:func:`captured_output` into a bounded buffer (the first and last :data:`KEPT_LINES` lines
and a count) and logged once when the code returns. Every way out is captured: ``print``
and ``sys.stdout``/``sys.stderr`` (their ``buffer`` too), file descriptors 1 and 2
(``os.write``, C code, ``ctypes`` ``printf``: ``os.dup2`` onto a pipe drained by a
thread), the records of ``logging`` loggers that are not the project's or Prefect's, and
``warnings`` (they are written to ``sys.stderr``, or logged). A root logger the code
reconfigures (its level, its handlers) is put back. Under a flow with ``log_prints=True``
Prefect's patched ``print`` would otherwise turn every call into an API log record: a
network that printed 200,000 lines took minutes to build, a network printing while traced
made each trace of a run minutes long, and the run did not obey SIGTERM until the records
drained (issue "reliability round five", class 4). The project's own code run inside a
capture (training's callbacks) writes where it would without it (:func:`output_released`).
"""

from __future__ import annotations

import builtins
import codecs
import contextlib
import ctypes
import io
import logging
import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

__all__ = [
    "KEPT_LINES",
    "BoundedOutput",
    "captured_output",
    "output_released",
]

#: Lines of a user's output kept from its start and from its end; the rest are counted.
KEPT_LINES = 5
_LINE_CHARS = 200  # a kept line is cut to this many characters
#: Loggers whose records a capture lets through: the project's own and Prefect's.
_OWN_LOGGERS = ("ensemble_core", "flows", "tasks", "prefect")

# The summary's logger keeps the name it had before this module was split out of
# user_import: what reads the log (the tests too) matches on it.
log = logging.getLogger("ensemble_core.user_import")


# MARK: the bounded buffer

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_LINE_ENDS = "\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # what str.splitlines splits at


def _shown(line: str) -> str:
    """``line`` as one printable line: terminal escape sequences (colours, cursor moves)
    dropped, any other control character, lone surrogate or undecodable byte escaped."""
    line = _ANSI.sub("", line)
    if line.isprintable():
        return line
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in line)


class BoundedOutput:
    """A write-only text stream that keeps the first and last ``kept`` non-blank lines
    written to it (each cut to 200 characters) and counts them all: memory and time per
    line stay constant however much is written, in one line or many. A line ends at any
    line break ``str.splitlines`` knows (a carriage return too: a progress bar's updates
    are lines); :meth:`write_bytes` takes raw bytes (undecodable ones replaced).
    Thread-safe."""

    def __init__(self, kept: int = KEPT_LINES):
        self.kept = kept
        self.first: list[str] = []
        self.last: deque[str] = deque(maxlen=kept)
        self.lines = 0
        self._partial = ""
        self._cut = False  # the partial line was longer than is kept of it
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._lock = threading.Lock()
        self.closed = False

    def write(self, text: str) -> int:
        text = text if isinstance(text, str) else str(text)
        with self._lock:
            self._take(text)
        return len(text)

    def write_bytes(self, data: bytes) -> int:
        """Raw bytes (a file descriptor's): UTF-8, undecodable bytes replaced."""
        with self._lock:
            self._take(self._decoder.decode(bytes(data)))
        return len(data)

    def _take(self, text: str) -> None:
        if not text:
            return
        parts = (self._partial + text).splitlines(keepends=True)
        tail = parts.pop() if parts and parts[-1] == parts[-1].rstrip(_LINE_ENDS) else ""
        for line in parts:
            self._add(line.rstrip(_LINE_ENDS))
            self._cut = False
        if len(tail) > 2 * _LINE_CHARS:  # a huge line without its end: its start is kept
            tail, self._cut = tail[: 2 * _LINE_CHARS], True
        self._partial = tail

    def _add(self, line: str) -> None:
        if not line.strip():
            return
        self.lines += 1
        line = line.rstrip()
        if len(line) > _LINE_CHARS or self._cut:
            line = line[:_LINE_CHARS] + "..."
        if len(self.first) < self.kept:
            self.first.append(line)
        else:
            self.last.append(line)

    def flush(self) -> None:
        pass

    def close(self) -> None:  # a user's code that closes sys.stdout closes nothing real
        self.closed = True

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def summary(self) -> str:
        """The kept lines joined by `` | ``, with how many lines between them were left out;
        one line (escape sequences dropped, control characters escaped)."""
        with self._lock:
            if self._partial.strip():
                self._add(self._partial)
                self._partial, self._cut = "", False
            shown = len(self.first) + len(self.last)
            first, last = [_shown(x) for x in self.first], [_shown(x) for x in self.last]
            if self.lines <= shown:
                return " | ".join([*first, *last])
            return " | ".join([*first, f"... {self.lines - shown} more lines ...", *last])

    def pending(self) -> bool:
        """Whether anything was written (a line, or the start of one)."""
        return bool(self.lines or self._partial.strip())


# MARK: what sys.stdout and sys.stderr are during a capture


class _Stream(io.TextIOBase):
    """``sys.stdout`` or ``sys.stderr`` while a capture is active: writes go to its
    :class:`BoundedOutput`. While the capture is released (:func:`output_released`), and
    once it has ended (a ``logging.StreamHandler`` the user's code made at import still
    holds it), writes go to the stream it replaced."""

    def __init__(self, capture: _Capture, name: str, fd: int, replaced):
        super().__init__()
        self._capture, self._name, self._fd, self._replaced = capture, name, fd, replaced
        self.buffer = _BinaryStream(self)

    def _live(self) -> bool:
        return self._capture.active

    def _after(self):
        return self._replaced

    def write(self, text) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if self._live():
            return self._capture.buffer.write(text)
        stream = self._after()
        return stream.write(text) if stream is not None else len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if not self._live() and (stream := self._after()) is not None:
            stream.flush()

    def close(self) -> None:  # closing the captured stream closes nothing real
        pass

    @property
    def closed(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]  # read-only here, as sys.stdout's
        return "utf-8"

    @property
    def errors(self) -> str:  # type: ignore[override]  # read-only here, as sys.stdout's
        return "replace"

    @property
    def name(self) -> str:
        return f"<{self._name}, captured>"

    @property
    def line_buffering(self) -> bool:
        return False

    def reconfigure(self, **_settings) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        """The real descriptor (itself captured) when the capture holds descriptors."""
        if self._capture.fds:
            return self._fd
        raise io.UnsupportedOperation("fileno")


class _BinaryStream(io.RawIOBase):
    """``sys.stdout.buffer`` during a capture: bytes go to the same :class:`BoundedOutput`."""

    def __init__(self, text: _Stream):
        super().__init__()
        self._text = text

    def write(self, data) -> int:
        data = bytes(data)
        if self._text._live():
            return self._text._capture.buffer.write_bytes(data)
        stream = self._text._after()
        target = getattr(stream, "buffer", None)
        if target is not None:
            return target.write(data)
        return stream.write(data.decode("utf-8", "replace")) if stream is not None else len(data)

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        pass

    @property
    def closed(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._text.fileno()


def _plain_print(*args, sep=" ", end="\n", file=None, flush=False) -> None:
    """``print`` that writes to its file (``sys.stdout`` by default), whatever a flow's
    ``log_prints`` has made of ``builtins.print``."""
    target = sys.stdout if file is None else file
    if target is None:
        return
    target.write((" " if sep is None else sep).join(map(str, args)) + ("\n" if end is None else end))
    if flush:
        target.flush()


class _Divert(logging.Filter):
    """On the root logger's handlers during a capture: a record of a logger that is not the
    project's or Prefect's (:data:`_OWN_LOGGERS`: the user's own, ``py.warnings``, a
    library's) goes into the capture's buffer as ``LEVEL name: message`` instead."""

    def __init__(self, capture: _Capture):
        super().__init__()
        self.capture = capture

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name or ""
        if not self.capture.active or name.split(".")[0] in _OWN_LOGGERS:
            return True
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001  (the user's arguments do not fit its format)
            message = str(record.msg)
        self.capture.buffer.write(f"{record.levelname} {name}: {message}\n")
        return False


@contextlib.contextmanager
def output_released() -> Iterator[None]:
    """Inside :func:`captured_output`, run the body (the project's own code: a callback
    between a user's network's steps) with its output going where it would without the
    capture; a capture entered inside it is a capture of its own. Outside one, nothing."""
    with _capture_lock:
        capture = _active[-1] if _active and _active[-1].active else None
        if capture is not None:
            capture.active = False
    try:
        yield
    finally:
        if capture is not None:
            with _capture_lock:
                capture.active = True


def _flush_c_stdio() -> None:
    """What C code wrote with ``printf`` and has not flushed (a pipe or file is fully
    buffered), out to its file descriptor now."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).fflush(None)


# MARK: the capture


class _Capture:
    """What one capture changed, and how to undo it (:func:`captured_output`)."""

    def __init__(self, heading: str, fds: bool):
        self.heading = heading
        self.buffer = BoundedOutput()  # print, sys.stdout, sys.stderr, logging, warnings
        self.descriptors = BoundedOutput()  # descriptors 1 and 2 (C code, os.write), read by a thread
        self.fds = False  # descriptors 1 and 2 are held (set once they are)
        self._want_fds = fds
        self.active = False
        self.depth = 0
        self.notes: list[str] = []
        self._undo: list[Callable[[], None]] = []

    def install(self) -> None:
        """Redirect everything; on any exception (a stop signal meanwhile) undo what was done."""
        try:
            self._install()
        except BaseException:
            self.uninstall()
            raise

    def _install(self) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        if self._want_fds and (release := self.hold_descriptors()) is not None:
            self._undo.append(release)
        self.active = True
        self._undo.append(self._deactivate)
        streams = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Stream(self, "stdout", 1, streams[0]), _Stream(self, "stderr", 2, streams[1])
        self._undo.append(lambda: self._restore_streams(streams))
        printer = builtins.print
        builtins.print = _plain_print
        self._undo.append(lambda: setattr(builtins, "print", printer))
        root = logging.getLogger()
        level, handlers = root.level, list(root.handlers)
        divert = _Divert(self)
        diverted = [*handlers, logging.lastResort] if logging.lastResort is not None else handlers
        for handler in diverted:
            handler.addFilter(divert)
        self._undo.append(lambda: self._restore_logging(root, level, handlers, diverted, divert))

    def _deactivate(self) -> None:
        self.active = False

    def _restore_streams(self, streams) -> None:
        sys.stdout, sys.stderr = streams

    def _restore_logging(self, root, level, handlers, diverted, divert) -> None:
        for handler in {*diverted, *root.handlers}:
            handler.removeFilter(divert)
        if root.level != level or root.handlers != handlers:
            note = "it set the root logger's level or handlers; they are the pipeline's own again"
            if note not in self.notes:
                self.notes.append(note)
            root.setLevel(level)
            root.handlers[:] = handlers

    def hold_descriptors(self) -> Callable[[], None] | None:
        """Descriptors 1 and 2 onto a pipe a thread drains into :attr:`descriptors`
        (``os.dup2``); a descriptor that is not open is left alone. Returns what puts them
        back (idempotent), None when none was held (none open, or held already)."""
        if self.fds:
            return None
        for stream in (sys.__stdout__, sys.__stderr__):
            if stream is not None:  # None without a console (pythonw, a closed descriptor)
                with contextlib.suppress(Exception):
                    stream.flush()
        _flush_c_stdio()
        saved: dict[int, int] = {}
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                saved[fd] = os.dup(fd)
        if not saved:
            return None
        read_end, write_end = os.pipe()
        reader = threading.Thread(target=self._drain, args=(read_end,), name="captured-output", daemon=True)
        reader.start()
        self.fds = True
        try:
            for fd in saved:
                os.dup2(write_end, fd)
        except BaseException:
            self._release_descriptors(saved, reader)
            raise
        finally:
            os.close(write_end)
        return lambda: self._release_descriptors(saved, reader)

    def _drain(self, read_end: int) -> None:
        try:
            while data := os.read(read_end, 1 << 16):
                self.descriptors.write_bytes(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                os.close(read_end)

    def _release_descriptors(self, saved: dict[int, int], reader: threading.Thread) -> None:
        for stream in (sys.__stdout__, sys.__stderr__):
            if stream is not None:  # None without a console (pythonw, a closed descriptor)
                with contextlib.suppress(Exception):
                    stream.flush()
        _flush_c_stdio()
        for fd, copy in list(saved.items()):
            with contextlib.suppress(OSError):
                os.dup2(copy, fd)
            with contextlib.suppress(OSError):
                os.close(copy)
            del saved[fd]
        self.fds = False
        # the pipe's last writer is gone: the thread reads what is left and ends (a process
        # the user's code started may still hold the pipe: then it is left to drain alone)
        reader.join(timeout=2.0)

    def uninstall(self) -> None:
        """Undo everything, in reverse; a stop signal's exception raised meanwhile is raised
        once everything is undone (the undo steps are idempotent: an interrupted one runs again)."""
        pending: BaseException | None = None
        while self._undo:
            try:
                self.run_undo(self._undo[-1])
            except BaseException as err:  # noqa: BLE001  (raised again below)
                pending = pending or err
            self._undo.pop()
        self.active = False
        if pending is not None:
            raise pending

    @staticmethod
    def run_undo(step: Callable[[], None]) -> None:
        """``step()``, run again when an exception (a stop signal's) interrupts it; the first
        such exception is raised once it has completed."""
        pending: BaseException | None = None
        for _ in range(5):
            try:
                step()
                break
            except BaseException as err:  # noqa: BLE001  (raised again below)
                pending = pending or err
        if pending is not None:
            raise pending


_capture_lock = threading.Lock()
_active: list[_Capture] = []  # the process's captures: the last one is current, the others released
# The last summary logged and when: the same one again within _REPEAT_S (each member's call
# traced the same way, the network built again for the flow) is not logged again.
_last_logged: list = [None, 0.0]
_REPEAT_S = 60.0


@contextlib.contextmanager
def captured_output(heading: str, *, fds: bool = True) -> Iterator[BoundedOutput]:
    """Run the body (a user's code) with everything it writes going to a
    :class:`BoundedOutput`, and log what it wrote once afterwards: ``"<heading>: first |
    ... | ... N more lines ... | last"`` (what reached the file descriptors after
    ``; on file descriptors 1 and 2: ``, summarised the same way), one line however much
    it was.

    Captured: ``print`` (plain meanwhile, so a flow's ``log_prints`` does not turn each call
    into a Prefect log record) and everything written to ``sys.stdout``/``sys.stderr``
    (``warnings`` included), their ``buffer`` (bytes: undecodable ones replaced); with
    ``fds``, file descriptors 1 and 2 (``os.write``, C code), put onto a pipe with
    ``os.dup2``; and the records of loggers other than the project's and Prefect's (the
    user's own, ``py.warnings``, a library's), which the root logger's handlers would have
    written. A root logger whose level or handlers the body changed is put back. The
    capture is the process's: a capture entered while one is active (a nested call, another
    thread) joins it, and the outermost logs; one with ``fds`` that joins a capture of the
    streams alone (training's, whose callbacks' own output must get out) holds the
    descriptors for its own body. While the capture is released (:func:`output_released`)
    everything goes where it would without it. Identical summaries within a minute (each
    member's call traced the same way) are logged once.

    ``fds=False``: for a long body that runs the project's code too (a training loop): a
    descriptor is the whole process's, whichever thread writes.

    A stop signal meanwhile interrupts the body as it would (its exception propagates),
    and everything is undone before it does.
    """
    release = None
    with _capture_lock:
        if not _active or not _active[-1].active:
            capture = _Capture(heading, fds)
            capture.install()
            _active.append(capture)
        capture = _active[-1]
        capture.depth += 1
        if fds and not capture.fds:  # joining a capture of the streams alone: descriptors too, for this body
            try:
                release = capture.hold_descriptors()
            except BaseException:
                capture.depth -= 1
                raise
    try:
        yield capture.buffer
    finally:
        last = False
        try:
            with _capture_lock:
                if release is not None:
                    capture.run_undo(release)
                capture.depth -= 1
                if capture.depth == 0:
                    last = True
                    _active.remove(capture)
                    capture.uninstall()
        finally:
            if last and (capture.buffer.pending() or capture.descriptors.pending() or capture.notes):
                parts = [capture.buffer.summary()] if capture.buffer.pending() else []
                if capture.descriptors.pending():
                    parts.append(f"on file descriptors 1 and 2: {capture.descriptors.summary()}")
                text = "; ".join([*parts, *capture.notes] or ["nothing"])
                now = time.monotonic()
                if _last_logged[0] != (capture.heading, text) or now - _last_logged[1] > _REPEAT_S:
                    log.info("%s: %s", capture.heading, text)
                    _last_logged[:] = [(capture.heading, text), now]
