"""Stopping a run cleanly on SIGTERM or Ctrl-C: finish the step, save, exit.

A cluster preempts a job with SIGTERM; a person stops one with Ctrl-C (SIGINT). Either way the
step in flight should finish and a checkpoint be written before the process ends, so that nothing
is lost but the time. :class:`StopOnSignal` records the signal; the training loop checks
``received`` after every step (with :func:`companion.training.distributed.any_process`, so that
all processes stop after the same step) and raises :class:`Stopped` once it has saved.
"""

from __future__ import annotations

import os
import signal
import threading

from companion.utils import progress_write

__all__ = ["StopOnSignal", "Stopped"]


class Stopped(Exception):
    """Raised from the step callback once every process has agreed to stop after a signal."""


class StopOnSignal:
    """SIGTERM or SIGINT asks the run to stop after the current step (saving first); the same
    signal again stops at once. Only the main thread can install signal handlers; elsewhere
    (a test's thread) the context does nothing."""

    def __init__(self, verbose: bool) -> None:
        self.verbose, self.received, self._old = verbose, None, {}

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame) -> None:
        if self.received == signum:  # the second time: stop now
            signal.signal(signum, self._old[signum])
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            os.kill(os.getpid(), signum)
            return
        if self.received is None and self.verbose:
            name = signal.Signals(signum).name
            progress_write(f"{name} received: saving a checkpoint after this step, then stopping "
                           "(send it again to stop at once)")
        self.received = self.received or signum

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
