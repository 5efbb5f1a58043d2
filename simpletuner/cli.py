"""`python -m simpletuner <command>`: plan a dataset split or build a built-in tiny model."""

from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m simpletuner")
    commands = parser.add_subparsers(dest="command", required=True)

    plan = commands.add_parser("plan", help="validate the config, discover datasets, show buckets")
    plan.add_argument("--config", default="config/config.json")
    plan.add_argument("--json", action="store_true", help="print only JSON on stdout")
    plan.add_argument("--num-processes", type=int, default=None,
                      help="also size the split for this many hypothetical ranks")
    plan.add_argument("--memory", action="store_true",
                      help="print the model's bytes per rank under DDP and FSDP2 instead")

    builtin = commands.add_parser("builtin", help="build a built-in tiny model, print its folder")
    builtin.add_argument("name")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # Imported lazily so `plan` never pays for importing diffusers, and the reverse.
    if args.command == "plan" and args.memory:
        from simpletuner.memory_plan import run_memory_plan

        return run_memory_plan(args.config, args.num_processes)
    if args.command == "plan":
        from simpletuner.planning import run_plan

        return run_plan(args.config, as_json=args.json, num_processes=args.num_processes)
    if args.command == "builtin":
        from simpletuner.models.builtin import run_builtin_command

        return run_builtin_command(args.name)
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
