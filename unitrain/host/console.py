"""What reaches the console and what only the run's log file: a terminal shows a run's results;
detail and a framework's advice a user cannot act on go to the log, where they can be read."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
from typing import Callable, Iterator, Sequence, TextIO

log = logging.getLogger("unitrain")
#: Detail's own name: a launched worker's log has no log file of its own to single out, and the
#: main process echoes only records named ``unitrain`` from it to the console.
detail = logging.getLogger("unitrain.detail")
#: A run's log file in its run directory: Hydra's, named for its job (hydra.job.name=unitrain).
RUN_LOG = "unitrain.log"


def to_log_file(message: str) -> None:
    """``message`` into the log file only, not the console. Without a log file (a loop of one's
    own, a launched worker whose output is its log), logged as ``unitrain.detail``."""
    files = [h for h in logging.getLogger().handlers + log.handlers if isinstance(h, logging.FileHandler)]
    if not files:
        detail.info("%s", message)
        return
    record = detail.makeRecord(detail.name, logging.INFO, __file__, 0, "%s", (message,), None)
    for handler in files:
        if record.levelno >= handler.level:
            handler.handle(record)


class _Sorted:
    """stderr, with the lines that start with one of ``quiet`` sent to the log file. A stream
    handler a library makes while this is in place keeps it: every other line still reaches
    the real stderr, whole."""

    def __init__(self, stream: TextIO, quiet: Sequence[str]):
        self.stream, self.quiet, self.pending = stream, tuple(quiet), ""

    def write(self, text: str) -> int:
        self.pending += text
        while "\n" in self.pending:
            line, self.pending = self.pending.split("\n", 1)
            if line.lstrip("\r").startswith(self.quiet):
                to_log_file(line.split("\r")[-1])  # a progress bar: where it ended
            else:
                self.stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        if self.pending and not self.pending.lstrip("\r").startswith(self.quiet):
            self.stream.write(self.pending)
            self.pending = ""
        self.stream.flush()

    def __getattr__(self, name: str):  # fileno, isatty, encoding: the real stream's
        return getattr(self.stream, name)


@contextlib.contextmanager
def printed_to_log_file(quiet: Sequence[str]) -> Iterator[None]:
    """Lines printed to stderr meanwhile that start with one of ``quiet`` go to the log file."""
    if not quiet:
        yield
        return
    real = sys.stderr
    sorted_ = _Sorted(real, quiet)
    sys.stderr = sorted_
    try:
        yield
    finally:
        sorted_.flush()
        if sys.stderr is sorted_:
            sys.stderr = real


class _ToLogFile(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        to_log_file(f"{record.name}: {record.getMessage()}")


@contextlib.contextmanager
def logged_to_file(names: Sequence[str]) -> Iterator[None]:
    """The records of the loggers ``names`` (a library's, with handlers of its own or printed by
    the console's) go to the log file meanwhile, and nowhere else."""
    loggers = [logging.getLogger(name) for name in names]
    saved = [(logger.handlers[:], logger.propagate) for logger in loggers]
    for logger in loggers:
        logger.handlers, logger.propagate = [_ToLogFile()], False
    try:
        yield
    finally:
        for logger, (handlers, propagate) in zip(loggers, saved):
            logger.handlers, logger.propagate = handlers, propagate


@contextlib.contextmanager
def captured_stdout(pass_on: bool = False) -> Iterator[Callable[[], str]]:
    """What is printed on file descriptor 1 meanwhile, C and C++ libraries' output included
    (beyond sys.stdout): the function it yields returns it so far inside the block, all of it
    after. ``pass_on``: it is also written to the real output once the block ends."""
    sys.stdout.flush()
    saved, final = os.dup(1), []
    with tempfile.TemporaryFile() as sink:

        def printed() -> str:
            if final:
                return final[0]
            # pread: the sink's offset is where fd 1 writes; moving it would overwrite what comes next.
            return os.pread(sink.fileno(), os.fstat(sink.fileno()).st_size, 0).decode(errors="replace")

        os.dup2(sink.fileno(), 1)
        try:
            yield printed
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
            final.append(printed())
            if pass_on:
                os.write(1, final[0].encode())


class _Unread(io.RawIOBase):
    """File descriptor ``fd`` (1 or 2) as a command's console: once its reader is gone (``| head``
    has read enough), /dev/null takes the descriptor's place, for this process's later writes and
    for the children it starts, and what was written is dropped, as nobody would read it.
    ``stop``: the write that found the reader gone raises BrokenPipeError, once, to stop a command
    whose output is its only product."""

    def __init__(self, fd: int, name: str, stop: bool):
        super().__init__()
        self.fd, self._name, self.stop, self.unread = fd, name, stop, False

    @property
    def name(self) -> str:
        return self._name

    def fileno(self) -> int:
        return self.fd

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return os.isatty(self.fd)

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        done = 0
        try:
            while done < len(view):
                done += os.write(self.fd, view[done:])
        except BrokenPipeError:
            self._to_devnull()
            if self.stop:
                raise
        return len(view)

    def _to_devnull(self) -> None:
        if not self.unread:
            self.unread = True
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.fd)
            os.close(devnull)


def _guard(stream: object) -> "_Unread | None":
    buffer = getattr(stream, "buffer", None)
    raw = getattr(buffer, "raw", buffer)
    return raw if isinstance(raw, _Unread) else None


def unread(stream: object) -> bool:
    """Whether ``stream`` (sys.stdout, say) is a console :func:`quiet_when_unread` guards whose
    reader has gone."""
    guard = _guard(stream)
    return guard is not None and guard.unread


def quiet_when_unread(stop: bool = False) -> None:
    """sys.stdout and sys.stderr as Unix tools treat a reader that went away: no error, no
    traceback, no "Logging error" dump for each line logged after it. A job runs on to its own
    outcome (its results are files; its output is dropped); with ``stop``, the first write to a
    stdout nobody reads raises BrokenPipeError, for a command that has nothing else to do."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        try:
            if stream is None or _guard(stream) is not None or stream.fileno() != fd:
                continue
        except (AttributeError, OSError, ValueError):  # not a file (pytest's capture, say)
            continue
        stream.flush()
        raw = _Unread(fd, f"<{name}>", stop and name == "stdout")
        unbuffered = isinstance(stream.buffer, io.RawIOBase)  # python -u, PYTHONUNBUFFERED
        guarded = io.TextIOWrapper(
            raw if unbuffered else io.BufferedWriter(raw),
            encoding=stream.encoding,
            errors=stream.errors,
            line_buffering=stream.line_buffering,
            write_through=stream.write_through,
        )
        setattr(sys, name, guarded)
