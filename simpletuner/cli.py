"""`python -m simpletuner <command>`: plan a dataset split, build a built-in tiny model, list
the options, check a config (what ./train.sh runs before launching), render a run's report
again, print an sbatch script, or serve the web UI."""

from __future__ import annotations

import argparse
import math
import sys

from simpletuner.ui.settings import add_serve_arguments


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m simpletuner")
    commands = parser.add_subparsers(dest="command", required=True)

    plan = commands.add_parser("plan", help="validate the config, discover datasets, show buckets")
    plan.add_argument("--config", default="config/config.json")
    plan.add_argument("--json", action="store_true", help="print only JSON on stdout")
    plan.add_argument("--num-processes", type=int, default=None,
                      help="also size the split for this many hypothetical ranks")
    plan.add_argument("--context-parallel", type=int, default=None, metavar="C",
                      help="context_parallel_size (default: config.json's): the split is over "
                      "num-processes / C data-parallel groups; with --memory, each rank holds 1/C"
                      " of the sequence")
    plan.add_argument("--memory", action="store_true",
                      help="print the model's bytes per rank under DDP and FSDP2 instead, and "
                      "one device's peak with activations and block swap")
    plan.add_argument("--gpu-memory", type=_gibibytes, default=None, metavar="GIB",
                      help="with --memory: whether the run fits in this many GiB, and what "
                      "would make it fit")
    plan.add_argument("--frames", type=int, default=1,
                      help="with --memory: frames per sample of a video family's micro-batch")
    plan.add_argument("--size", type=_one_size, default=None, metavar="WxH",
                      help="with --memory: the micro-batch's size (your largest bucket); "
                      "default: the square of the training resolution's area")

    builtin = commands.add_parser("builtin", help="build a built-in tiny model, print its folder")
    builtin.add_argument("name")

    commands.add_parser("options", help="list every option (Markdown, as in docs/OPTIONS.md)")

    check = commands.add_parser(
        "check", help="validate the config (with --option value overrides) and what it says "
        "about output_dir; print the number of processes to launch", allow_abbrev=False)
    check.add_argument("--config", default="config/config.json")
    check.add_argument("--json", action="store_true",
                       help="print the problems as a JSON list of records (file, path, key, "
                       "message, fix) instead; [] when there are none")

    report = commands.add_parser(
        "report", help="write OUTPUT_DIR/training_report.html again from the run's files "
        "(checkpoints verified by SHA-256)")
    report.add_argument("output_dir")

    slurm = commands.add_parser(
        "slurm-script", help="print an sbatch script that trains CONFIG under SLURM (without "
        "CONFIG: the generic examples/slurm/train.sbatch)")
    slurm.add_argument("config", nargs="?", default=None)
    slurm.add_argument("--nodes", type=int, default=1,
                       help="nodes to spread the config's num_processes over")
    slurm.add_argument("--cpu", action="store_true",
                       help="no --gpus-per-node line (a cluster of CPU nodes)")

    add_serve_arguments(commands.add_parser(
        "serve", help="the web UI: queue, start, watch and stop runs (docs/API.md)"))
    return parser


def _gibibytes(value: str) -> float:
    """A device's memory: a finite number above zero (argparse reports the message)."""
    try:
        gib = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{value}' is not a number of GiB") from None
    if not math.isfinite(gib) or gib <= 0:
        raise argparse.ArgumentTypeError(f"'{value}': a device's memory in GiB, above 0 "
                                         "(e.g. 24 or 79.6)")
    return gib


def _one_size(value: str) -> tuple[int, int]:
    """(width, height) of --size; argparse reports the ValueError's message."""
    from simpletuner.configuration.validation_options import validation_sizes

    try:
        sizes = validation_sizes(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if len(sizes) != 1:
        raise argparse.ArgumentTypeError(f"'{value}': one size, 'WxH'")
    return sizes[0]


def _check(config: str, option_args: list[str], as_json: bool) -> int:
    """train.sh runs this before starting the launcher: a mistake prints only the report. The
    config file first, then what the config and the filesystem alone show (launch_checks.py).
    ``as_json``: the problems as records on stdout, for tools, instead of the process count."""
    import json

    from simpletuner.configuration import ConfigError
    from simpletuner.configuration.command_line import load_with_option_args
    from simpletuner.training.run.launch_checks import launch_problems, launch_warnings

    try:
        configuration = load_with_option_args(config, option_args)
        for warning in launch_warnings(configuration):
            print(f"warning: {warning}", file=sys.stderr)
        problems = launch_problems(configuration)
        if problems:
            raise ConfigError(problems)
    except ConfigError as exc:
        if as_json:
            print(json.dumps([record.as_json() for record in exc.records], indent=2))
        else:
            print(exc, file=sys.stderr)
        return 2
    print("[]" if as_json else configuration.training.num_processes)
    return 0


def main(argv: list[str] | None = None) -> int:
    args, option_args = _parser().parse_known_args(argv)
    if option_args and args.command != "check":
        _parser().error(f"unrecognized arguments: {' '.join(option_args)}")
    # Imported lazily so `plan` never pays for importing diffusers, and the reverse.
    if args.command == "plan" and args.memory:
        from simpletuner.training.memory.plan import run_memory_plan

        return run_memory_plan(args.config, args.num_processes, args.gpu_memory, args.frames,
                               args.size, context_parallel=args.context_parallel)
    if args.command == "plan":
        from simpletuner.planning import run_plan

        return run_plan(args.config, as_json=args.json, num_processes=args.num_processes,
                        context_parallel=args.context_parallel)
    if args.command == "builtin":
        from simpletuner.models.builtin import run_builtin_command

        return run_builtin_command(args.name)
    if args.command == "options":
        from simpletuner.configuration.listing import options_markdown

        sys.stdout.write(options_markdown())
        return 0
    if args.command == "check":
        return _check(args.config, option_args, args.json)
    if args.command == "serve":
        from simpletuner.ui.serve import run_server

        return run_server(args)
    if args.command == "report":
        from simpletuner.training.reporting.report_command import run_report_command

        return run_report_command(args.output_dir)
    if args.command == "slurm-script":
        from simpletuner.slurm_script import run_slurm_script

        return run_slurm_script(args.config, args.nodes, gpus=not args.cpu)
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
