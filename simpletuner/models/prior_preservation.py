"""Prior preservation, SimpleTuner's ``is_regularisation_data``: a regularisation sample's
target is the base model's own prediction (the LoRA adapter turned off) for the same noisy
input, so training on it pulls the adapter towards changing nothing there.

As in SimpleTuner the loss is otherwise unchanged: the family's objective (loss_type, its
weights) between the adapted prediction and that target, each sample weighted like any other.
SimpleTuner has no prior-loss weight (its ``prior_loss_weight`` went with DreamBooth's
class-image loss in 2023); a micro-batch comes from one dataset, so it is all regularisation
or none."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, ContextManager, Iterator

import torch

BaseModel = Callable[[], ContextManager]  # a context in which the network predicts as the base


def _set_adapters_enabled(network: torch.nn.Module, enabled: bool) -> None:
    """Each peft layer of ``network`` on or off, as diffusers' disable_adapters does it, also
    for a network without diffusers' peft methods (PixArt's)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for module in network.modules():
        if isinstance(module, BaseTunerLayer):
            module.enable_adapters(enabled)


@contextmanager
def adapter_turned_off(network: torch.nn.Module) -> Iterator[None]:
    """``network`` (holding peft adapters) as the base model for the block. peft's
    enable_adapters marks every active adapter trainable: what required grad before (not a
    frozen assistant LoRA) is restored."""
    trainable = [p.requires_grad for p in network.parameters()]
    _set_adapters_enabled(network, False)
    try:
        yield
    finally:
        _set_adapters_enabled(network, True)
        for parameter, flag in zip(network.parameters(), trainable):
            parameter.requires_grad_(flag)


def base_model_target(base_model: BaseModel, predict: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``predict()`` as the base model, without gradients: the regularisation target."""
    with torch.no_grad(), base_model():
        return predict().detach()
