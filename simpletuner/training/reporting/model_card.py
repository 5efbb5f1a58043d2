"""The exported model's README.md: a Hugging Face model card (YAML metadata, then Markdown) that
says what was trained, from what, how, and how to load it.

The metadata values are written as JSON scalars and lists, which YAML reads unchanged, so no
YAML library is needed to write a card that huggingface_hub.ModelCard.load parses.
"""

from __future__ import annotations

import json
from pathlib import Path

from simpletuner.common.atomic import atomic_write_text
from simpletuner.models.model_path import BUILTIN_PREFIX
from simpletuner.models.registry import get_adapter_class
from simpletuner.training.adapters.lora import LORA_WEIGHTS

CARD_NAME = "README.md"


def _metadata(training) -> dict:
    lora = training.model_type == "lora"
    tags = ["simpletuner", "diffusers", "text-to-image", training.model_family,
            "lora" if lora else "full"]
    return {"library_name": "diffusers", "pipeline_tag": "text-to-image", "tags": tags,
            "base_model": training.pretrained_model_name_or_path}


def _base_model_line(training, base_folder: Path) -> str:
    """Loads what the run trained on: a built-in name means nothing to diffusers, so its
    folder in the cache is named instead."""
    name = training.pretrained_model_name_or_path
    if not name.startswith(BUILTIN_PREFIX):
        return f'pipeline = DiffusionPipeline.from_pretrained({json.dumps(name)})\n'
    return (f"# {name}, built locally by `python -m simpletuner builtin "
            f"{name.removeprefix(BUILTIN_PREFIX)}`\n"
            f'pipeline = DiffusionPipeline.from_pretrained({json.dumps(str(base_folder))})\n')


def _lora_loading(model_family: str, folder_name: str) -> str:
    """The lines that put the exported LoRA on the base pipeline: its load_lora_weights; its
    network's load_lora_adapter where diffusers gives the pipeline no LoRA loader (the adapter
    names a lora_file_class, HunyuanVideo 1.5; LongCat-Image); this trainer's
    load_peft_lora_file for a network without diffusers' peft support (PixArt's)."""
    adapter_class = get_adapter_class(model_family)
    component = adapter_class.trainable_component
    if (adapter_class.lora_file_class is None
            and hasattr(adapter_class.pipeline_class, "load_lora_weights")):
        return f'pipeline.load_lora_weights("{folder_name}")'
    network_class = getattr(adapter_class, "transformer_class", None)
    if adapter_class.lora_file_class is not None or hasattr(network_class, "load_lora_adapter"):
        return (f'pipeline.{component}.load_lora_adapter("{folder_name}", prefix="{component}", '
                f'weight_name="{LORA_WEIGHTS}")')
    return ("from simpletuner.training.adapters.lora import load_peft_lora_file\n"
            f'load_peft_lora_file(pipeline.{component}, "{folder_name}/{LORA_WEIGHTS}", '
            f'"{component}")')


def _usage(training, folder_name: str, base_folder: Path) -> str:
    base = _base_model_line(training, base_folder)
    if training.lora_type == "lycoris":
        return (base + "from lycoris import create_lycoris_from_weights\n"
                'network = pipeline.unet if hasattr(pipeline, "unet") else pipeline.transformer\n'
                f'lycoris, _ = create_lycoris_from_weights(1.0, "{folder_name}/'
                'pytorch_lora_weights.safetensors", network)\nlycoris.merge_to()')
    if training.model_type == "lora":
        return base + _lora_loading(training.model_family, folder_name)
    return f'pipeline = DiffusionPipeline.from_pretrained("{folder_name}")'


def model_card_text(training, summary: dict, datasets: list[str], base_folder: Path) -> str:
    """``training`` is a configuration.TrainingConfig; ``summary`` the run's
    training_summary.json; ``datasets`` the dataset ids trained on; ``base_folder`` the model
    folder the run loaded."""
    lines = ["---"] + [f"{key}: {json.dumps(value)}" for key, value in _metadata(training).items()]
    prompts = training.validation_prompt
    prompts = [prompts] if isinstance(prompts, str) else list(prompts or [])
    folder_name = "lora" if training.model_type == "lora" else "pipeline"
    settings = {
        "model family": training.model_family, "training": training.model_type,
        "steps": summary.get("steps"), "seed": summary.get("seed"),
        "final loss": summary.get("final_loss"), "processes": summary.get("processes"),
        "learning rate": training.learning_rate, "lr scheduler": training.lr_scheduler,
        "batch size per process": training.train_batch_size,
        "gradient accumulation": training.gradient_accumulation_steps,
        "resolution": f"{training.resolution:g} ({training.resolution_type})",
        "mixed precision": training.mixed_precision, "EMA": training.use_ema,
        "datasets": ", ".join(datasets),
    }
    if training.lora_type == "lycoris":
        settings["LyCORIS config"] = training.lycoris_config
    elif training.model_type == "lora":
        alpha = training.lora_alpha or training.lora_rank
        settings["LoRA rank / alpha"] = f"{training.lora_rank} / {alpha:g}"
    lines += ["---", "", f"# {training.model_family} fine-tune of "
              f"`{training.pretrained_model_name_or_path}`", "",
              "Trained with simpletuner (a SimpleTuner-style trainer).", "",
              "| setting | value |", "| --- | --- |"]
    lines += [f"| {name} | {value} |" for name, value in settings.items()]
    if prompts:
        lines += ["", "## Validation prompts", ""] + [f"- {p}" for p in prompts]
    lines += ["", "## Use", "", "```python", "from diffusers import DiffusionPipeline", "",
              _usage(training, folder_name, base_folder), "```", ""]
    return "\n".join(lines)


def write_model_card(folder: Path, training, summary: dict, datasets: list[str],
                     base_folder: Path) -> Path:
    path = Path(folder) / CARD_NAME
    atomic_write_text(path, model_card_text(training, summary, datasets, base_folder))
    return path
