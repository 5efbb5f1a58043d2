"""Checks that need no model and no data pass: run on every rank before any heavy work, so a
mistake is reported at once, every problem together, and identically on every rank. The
cheapest of them (launch_checks.py) also run before launch, in ``python -m simpletuner check``."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate.utils import broadcast_object_list, gather_object

from simpletuner.configuration import ConfigError, Configuration
from simpletuner.configuration.errors import Location, Problem
from simpletuner.common.peer_watch import in_collective
from simpletuner.common.together import failing_together
from simpletuner.dataset_kinds import kind_of
from simpletuner.helpers.metadata.mesh import mesh_problem
from simpletuner.models.layout import ModelFolderError
from simpletuner.models.builtin import resolve_model_path
from simpletuner.models.model_path import model_path_problem
from simpletuner.models.registry import get_adapter_class
from simpletuner.training.checkpointing.checkpointer import read_run_state
from simpletuner.training.checkpointing.folders import resolve_resume
from simpletuner.training.memory.meta_network import adapter_ram_problem
from simpletuner.training.run.launch_checks import launch_warnings, static_problems
from simpletuner.training.optimization.optimizers import optimizer_problems
from simpletuner.training.reporting.validation_inputs import validation_input_problems
from simpletuner.training.memory.quantization import precision_problems
from simpletuner.training.settings import OptimizerSettings, PrecisionSettings

logger = logging.getLogger(__name__)


@dataclass
class Preflight:
    model_folder: Path
    resume_from: Path | None
    seed: int | None   # the configured seed, or the resumed run's recorded seed
    resume_step: int | None  # the step resume_from was saved at


def _check_output_dir(output_dir: Path) -> str | None:
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=output_dir, prefix=".write-test-"):
            pass
    except OSError as exc:
        return (f"output_dir {output_dir} is not writable ({exc.strerror or exc}); "
                "choose a folder you can write to")
    return None


def _memory_option_problems(training) -> list[str]:
    """Precisions and optimizer this machine, install and config can run (model_family is
    already checked against the registry by the configuration)."""
    text_encoders = len(get_adapter_class(training.model_family).text_encoder_specs)
    return (precision_problems(PrecisionSettings.from_config(training), text_encoders)
            + optimizer_problems(OptimizerSettings.from_config(training),
                                 torch.cuda.is_available()))


def run_preflight(configuration: Configuration, main_result: Preflight | None = None
                  ) -> Preflight:
    """Raise ConfigError listing every problem found; return what start-up needs otherwise.
    ``main_result``: the main process's result; the checkpoint it chose (verified, SHA-256 of
    every file) and the seed are taken from it rather than hashed again by every rank."""
    training = configuration.training
    where = Location(str(configuration.config_path))
    problems: list[Problem | str] = [*static_problems(configuration)]
    if training.mixed_precision == "fp16" and not torch.cuda.is_available():
        problems.append(where.problem(
            "mixed_precision", "key 'mixed_precision' is 'fp16', which needs a CUDA device; use "
            "'bf16' or 'no' on this machine"))
    problems += [where.problem("", problem) for problem in _memory_option_problems(training)]
    output_problem = _check_output_dir(Path(training.output_dir))
    if output_problem:
        problems.append(where.problem("output_dir", f"key 'output_dir': {output_problem}"))

    model_folder = _model_folder(configuration, where, problems)
    if model_folder is not None and not problems:  # the adapter's options are sound
        problems += _adapter_ram_problems(model_folder, training, where)

    if main_result is not None:
        if problems:
            raise ConfigError(problems)
        return Preflight(model_folder, main_result.resume_from, main_result.seed,
                         main_result.resume_step)
    resume_from, seed, resume_step = None, training.seed, None
    try:
        resume_from = resolve_resume(training.resume_from_checkpoint, Path(training.output_dir))
    except ValueError as exc:
        problems.append(where.problem(
            "resume_from_checkpoint", f"key 'resume_from_checkpoint': {exc}"))
    if resume_from is not None:
        saved = read_run_state(resume_from)
        resume_step = saved.step
        if saved.model_type != training.model_type:
            problems.append(where.problem(
                "resume_from_checkpoint", f"key 'resume_from_checkpoint': {resume_from} was "
                f"saved by a model_type '{saved.model_type}' run; this run is "
                f"'{training.model_type}'. Resume with the same model_type or start fresh"))
        if seed is None:
            # No configured seed: continue with the one the run drew, or nothing would match.
            seed = saved.seed
    if problems:
        raise ConfigError(problems)
    assert model_folder is not None
    return Preflight(model_folder, resume_from, seed, resume_step)


def _model_folder(configuration: Configuration, where: Location,
                  problems: list[Problem | str]) -> Path | None:
    """The model's folder, checked for the family, its flavour and what validation and a
    video.is_i2v dataset need of it (problems appended); None when there is none to check."""
    training = configuration.training
    if model_path_problem(training.pretrained_model_name_or_path) is not None:
        return None  # named by static_problems
    try:
        adapter_class = get_adapter_class(training.model_family)
        model_folder = resolve_model_path(training.pretrained_model_name_or_path)
        adapter_class.check_folder(model_folder)
    except (ModelFolderError, ValueError) as exc:
        problems.append(where.problem(
            "pretrained_model_name_or_path", f"key 'pretrained_model_name_or_path': {exc}"))
        return None
    try:
        flavour_problem = adapter_class.flavour_problem(model_folder, training.model_flavour)
        if flavour_problem:
            problems.append(where.problem(
                "model_flavour", f"key 'model_flavour': {flavour_problem}"))
        problems += validation_input_problems(adapter_class.for_folder(model_folder),
                                              training, str(where))
        problems += _is_i2v_problems(adapter_class.for_folder(model_folder), model_folder,
                                     configuration)
    except (ModelFolderError, ValueError) as exc:
        problems.append(where.problem(
            "pretrained_model_name_or_path", f"key 'pretrained_model_name_or_path': {exc}"))
    return model_folder


def _adapter_ram_problems(model_folder: Path, training, where: Location) -> list[Problem]:
    """A LoRA run's adapter larger than the host's RAM, counted on the meta network."""
    if training.model_type != "lora":
        return []
    adapter_class = get_adapter_class(training.model_family).for_folder(model_folder)
    problem = adapter_ram_problem(adapter_class, model_folder, training)
    if problem is None:
        return []
    key = "lycoris_config" if training.lora_type == "lycoris" else "lora_rank"
    return [where.problem(key, f"key '{key}': {problem}")]


def _is_i2v_problems(adapter_class, model_folder: Path,
                     configuration: Configuration) -> list[str]:
    """A ``video.is_i2v`` dataset for a model that would train it as text-to-video."""
    if adapter_class.trains_image_to_video:
        return []
    return [f"{configuration.training.data_backend_config}: dataset '{ds.id}': key 'video': "
            f"'is_i2v' is true, but {model_folder} trains text-to-video only; use an "
            "image-to-video model (Wan 2.1 I2V, or Wan 2.2 TI2V-5B: model_flavour ti2v-5b-2.2) "
            "or remove is_i2v" for ds in configuration.datasets
            if kind_of(ds).has_clips and (ds.video or {}).get("is_i2v")]


def _checked(configuration: Configuration, main_result: Preflight | None = None
             ) -> tuple[Preflight | None, list[str]]:
    """This rank's checks: what start-up needs, or the configuration problems found."""
    try:
        return run_preflight(configuration, main_result), []
    except ConfigError as exc:
        return None, exc.problems


def merge_rank_problems(per_rank: Sequence[Sequence[str]]) -> list[str]:
    """Pure: one list for every rank. Each problem is listed once, in order of first report,
    prefixed with the ranks that saw it unless every rank did."""
    seen_by: dict[str, list[int]] = {}
    for rank, problems in enumerate(per_rank):
        for problem in problems:
            seen_by.setdefault(problem, []).append(rank)
    everyone = list(range(len(per_rank)))
    return [problem if ranks == everyone else
            f"on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {problem}"
            for problem, ranks in seen_by.items()]


def run_preflight_on_all_ranks(configuration: Configuration, accelerator) -> Preflight:
    """The main process checks first: it may build a built-in model, and transformers writes
    weights only from rank 0 once a process group exists. The others check once it passed (a
    node may see what the main one does not: an unwritable output_dir, a missing model folder).
    Configuration problems found on any rank are a ConfigError on every rank; any other error
    a RankFailure on every rank; either way no rank goes on alone into start-up."""
    mesh = mesh_problem(accelerator.num_processes, configuration.training.context_parallel_size)
    if mesh:  # the processes the launcher started: every rank alike, before any collective
        raise ConfigError([mesh])
    result, problems = None, []
    with failing_together("start-up checks on the main process"):
        if accelerator.is_main_process:
            result, problems = _checked(configuration)
    with in_collective("the main process's start-up check results"):
        problems, main_result = broadcast_object_list([problems, result])
    if problems:
        raise ConfigError(problems)
    with failing_together("start-up checks"):
        if not accelerator.is_main_process:
            result, problems = _checked(configuration, main_result)
    with in_collective("the start-up check results' gather"):
        problems = merge_rank_problems(gather_object([problems]))
    if problems:
        raise ConfigError(problems)
    assert result is not None
    if accelerator.is_main_process:  # what check printed, again for the run's own log
        for warning in launch_warnings(configuration):
            logger.warning(warning)
    return result


def weight_dtype(mixed_precision: str) -> torch.dtype:
    """dtype of the frozen components (VAE, text encoders); the trained network stays float32."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mixed_precision, torch.float32)

