"""Test-side launcher, started by torchrun on every rank (or by plain python: one process, rank
0): optionally patches one named function to fail on one rank (for faults no real file can aim
at a single rank or moment), runs a real entry point, and records this rank's exit status, which
torchrun would otherwise merge into one.

    python tests/fault_launcher.py STATUS_DIR [--fault MODULE:ATTRIBUTE --on-rank K
                                   [--config-problem | --broken-self | --killed-after N |
                                    --signalled-after N | --frozen-after N]]
                                   {train,audit} ARGS...

The injected message is ``injected fault on rank K``; ``--config-problem`` raises it as a
ConfigError (a problem only that node sees), otherwise as a RuntimeError. ``--broken-self``
injects no message: the method runs with None for ``self``, so its own code raises the
AttributeError a bug would, with the method's frame in the traceback. ``--killed-after N``: the
process is SIGKILLed as the function's Nth call returns, a crash at a chosen moment.
``--signalled-after N``: the process sends itself a real SIGTERM as the Nth call returns, a
stop signal that reaches one rank only. ``--frozen-after N``: the process sends itself SIGSTOP
as the Nth call returns, a rank that hangs at a chosen moment.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import os
import signal
import sys
from pathlib import Path


def injected_message(rank: int) -> str:
    return f"injected fault on rank {rank}"


def this_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def fault_for(args: argparse.Namespace, original):
    """What the patched function does on the faulty rank."""
    from simpletuner.configuration import ConfigError

    if args.broken_self:
        return lambda *a, **k: original(None, *a[1:], **k)
    after_calls = {signal.SIGKILL: args.killed_after, signal.SIGTERM: args.signalled_after,
                   signal.SIGSTOP: args.frozen_after}
    sent, after = next(((sent, after) for sent, after in after_calls.items() if after),
                       (None, None))
    if sent is not None:
        calls = itertools.count(1)

        def signalled(*a, **k):
            result = original(*a, **k)
            if next(calls) == after:
                os.kill(os.getpid(), sent)
            return result
        return signalled

    def raising(*a, **k):
        message = injected_message(args.on_rank)
        raise ConfigError([message]) if args.config_problem else RuntimeError(message)
    return raising


def patch_to_fail(args: argparse.Namespace) -> None:
    """Replace MODULE:ATTRIBUTE (dotted inside the module, e.g. Class.method) by a wrapper that
    fails on ``--on-rank`` and calls the original on every other rank."""
    module_name, _, attribute_path = args.fault.partition(":")
    owner = importlib.import_module(module_name)
    *parents, name = attribute_path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    original = getattr(owner, name)
    fault = fault_for(args, original)

    def patched(*a, **k):
        return (fault if this_rank() == args.on_rank else original)(*a, **k)

    setattr(owner, name, patched)


def entry_point(name: str):
    if name == "train":
        from simpletuner.train import main
    else:
        from simpletuner.audit import main
    return main


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("status_dir", type=Path)
    parser.add_argument("--fault")
    parser.add_argument("--on-rank", type=int, default=0)
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--config-problem", action="store_true")
    kind.add_argument("--broken-self", action="store_true")
    kind.add_argument("--killed-after", type=int, metavar="N")
    kind.add_argument("--signalled-after", type=int, metavar="N")
    kind.add_argument("--frozen-after", type=int, metavar="N")
    parser.add_argument("entry", choices=("train", "audit"))
    parser.add_argument("entry_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.fault:
        patch_to_fail(args)
    status = 1  # an exception escaping the entry point
    try:
        status = entry_point(args.entry)(args.entry_args)
    finally:
        (args.status_dir / f"rank-{this_rank()}.status").write_text(str(status))
    sys.exit(status)


if __name__ == "__main__":
    main()
