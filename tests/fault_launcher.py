"""Test-side launcher, started by torchrun on every rank: optionally patches one named function
to raise on one rank (for faults no real file can aim at a single rank), runs a real entry point,
and records this rank's exit status, which torchrun would otherwise merge into one.

    python tests/fault_launcher.py STATUS_DIR [--fault MODULE:ATTRIBUTE --on-rank K
                                   [--config-problem | --broken-self]] {train,audit} ARGS...

The injected message is ``injected fault on rank K``; ``--config-problem`` raises it as a
ConfigError (a problem only that node sees), otherwise as a RuntimeError. ``--broken-self``
injects no message: the method runs with None for ``self``, so its own code raises the
AttributeError a bug would, with the method's frame in the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path


def injected_message(rank: int) -> str:
    return f"injected fault on rank {rank}"


def patch_to_fail(target: str, rank: int, config_problem: bool, broken_self: bool) -> None:
    """Replace MODULE:ATTRIBUTE (dotted inside the module, e.g. Class.method) by a wrapper that
    raises on ``rank`` and calls the original on every other rank."""
    from simpletuner.configuration import ConfigError

    module_name, _, attribute_path = target.partition(":")
    owner = importlib.import_module(module_name)
    *parents, name = attribute_path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    original = getattr(owner, name)

    def failing(*args, **kwargs):
        if int(os.environ["RANK"]) != rank:
            return original(*args, **kwargs)
        if broken_self:
            return original(None, *args[1:], **kwargs)
        message = injected_message(rank)
        raise ConfigError([message]) if config_problem else RuntimeError(message)

    setattr(owner, name, failing)


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
    parser.add_argument("entry", choices=("train", "audit"))
    parser.add_argument("entry_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.fault:
        patch_to_fail(args.fault, args.on_rank, args.config_problem, args.broken_self)
    status = 1  # an exception escaping the entry point
    try:
        status = entry_point(args.entry)(args.entry_args)
    finally:
        (args.status_dir / f"rank-{os.environ['RANK']}.status").write_text(str(status))
    sys.exit(status)


if __name__ == "__main__":
    main()
