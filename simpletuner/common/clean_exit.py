"""Leaving a process that ran gloo collectives without tripping over its worker threads."""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


def exit_process(status: int) -> NoReturn:
    """Exit without the interpreter's finalization, once everything is written and the process
    group ended. gloo's worker threads outlive destroy_process_group; one still releasing the
    tensors of the last collective (DCP's save ends with a broadcast) needs the GIL, and a
    finalizing interpreter stops such a thread inside take_gil with pthread_exit, whose unwind
    through a noexcept destructor ends in std::terminate: 'terminate called without an active
    exception', SIGABRT, now and then (how often: docs/DESIGN.md; seen in gdb: pt_gloo_runloop
    in ~AsyncWork while the main thread is in Py_FinalizeEx). A barrier before ending narrows the
    window but does not close it. Nothing the run keeps is left to finalization: files are
    closed and renamed by then, trackers finished by end_training; logs and stdio are flushed
    here."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
