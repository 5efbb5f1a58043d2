"""assistant_lora_path (SimpleTuner's): a frozen LoRA applied with the trained one, as the
training adapters of distilled models are (Z-Image Turbo's keeps its few-step distillation
from collapsing while a LoRA trains on it).

Its file is put on the network by the family pipeline's own load_lora_weights, as a second
peft adapter ("assistant") beside the run's ("default"), both active: assistant_lora_strength
scales it while training, assistant_lora_inference_strength in validation (0, SimpleTuner's
default: off). Its weights never require grad, so the optimizer, the EMA, checkpoints and the
export, which take the "default" adapter's weights, never hold them; a resumed run loads it
again from its file."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

from simpletuner.training.adapters.lora import LoraTargetError

ASSISTANT = "assistant"   # its peft adapter name, as SimpleTuner's
TRAINED = "default"


class AssistantLoraError(LoraTargetError):
    """assistant_lora_path's file cannot be put on the network."""


def wants_assistant(training) -> bool:
    return training.assistant_lora_path is not None and not training.disable_assistant_lora


def add_assistant(adapter, training) -> None:
    """Load the assistant onto ``adapter.trainable`` (which holds the run's LoRA already) and
    activate both at the training strengths."""
    network, path = adapter.trainable, Path(training.assistant_lora_path)
    where = {"weight_name": training.assistant_lora_weight_name} if (
        training.assistant_lora_weight_name) else {}
    try:
        adapter.build_pipeline(network).load_lora_weights(str(path), adapter_name=ASSISTANT,
                                                          **where)
    except (ValueError, KeyError, RuntimeError, OSError) as exc:
        raise AssistantLoraError(f"assistant_lora_path {path} is not a LoRA file diffusers can "
                                 f"put on the {adapter.family} network ({exc})") from None
    use_strength(network, training.assistant_lora_strength)


def use_strength(network: torch.nn.Module, strength: float) -> None:
    """The run's adapter at 1 and the assistant at ``strength`` (0: left out); only the run's
    adapter requires grad (peft marks every active adapter trainable)."""
    names, weights = [TRAINED], [1.0]
    if strength:
        names, weights = [TRAINED, ASSISTANT], [1.0, strength]
    network.set_adapters(names, weights)
    for name, parameter in network.named_parameters():
        if f".{ASSISTANT}." in name:
            parameter.requires_grad_(False)


def has_assistant(network: torch.nn.Module) -> bool:
    return ASSISTANT in (getattr(network, "peft_config", None) or {})


@contextmanager
def assistant_in_validation(network: torch.nn.Module, training) -> Iterator[None]:
    """The block (validation) with the assistant at its inference strength, then back."""
    if not has_assistant(network):
        yield
        return
    use_strength(network, training.assistant_lora_inference_strength)
    try:
        yield
    finally:
        use_strength(network, training.assistant_lora_strength)
