"""ControlNet training (controlnet: true), shared by the families whose spec names a
``controlnet_adapter``: mixed into the family's adapter ahead of it, it trains a ControlNet
(from controlnet_model_name_or_path, else initialised from the frozen base network as diffusers
does) while the base network stays frozen, and builds the family's ControlNet pipeline, whose
``controlnet/`` folder is the exported ControlNet. Each sample's control image comes with its
batch (TrainingBatch.control), kept as ``encode_control`` gives it."""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path

import torch

from simpletuner.families import family_spec, load_object


class ControlNetTraining:
    """Mixed into a family's adapter (``class X(ControlNetTraining, FamilyAdapter)``)."""

    trainable_component = "controlnet"
    base_network: str   # the attribute (and folder) of the frozen network: unet, transformer
    controlnet: torch.nn.Module

    @classmethod
    def required_subfolders(cls) -> tuple[str, ...]:
        """The base model's folders: its network's, not a controlnet/ one."""
        return (cls.base_network,) + tuple(
            name for name in super().required_subfolders() if name != "controlnet")

    def add_controlnet(self, source: str | Path | None) -> None:
        """The ControlNet to train, in float32 on the base network's device; the base frozen."""
        base = getattr(self, self.base_network)
        base.requires_grad_(False).eval()
        controlnet = self.load_controlnet(Path(source)) if source else self.controlnet_from(base)
        self.controlnet = controlnet.to(base.device, torch.float32).requires_grad_(True).train()

    @abstractmethod
    def load_controlnet(self, folder: Path) -> torch.nn.Module:
        """The family's ControlNet class from a diffusers ControlNet folder."""

    @abstractmethod
    def controlnet_from(self, base: torch.nn.Module) -> torch.nn.Module:
        """A new ControlNet initialised from the base network, as diffusers does."""

    @abstractmethod
    def encode_control(self, pixels: torch.Tensor) -> torch.Tensor:
        """Fitted control images [B, 3, H, W] in [-1, 1] -> what the cache keeps of them and
        the ControlNet takes (TrainingBatch.control)."""

    @property
    def trainable(self) -> torch.nn.Module:
        return self.controlnet

    def move_to(self, device: torch.device, except_modules=()) -> None:
        super().move_to(device, except_modules)
        getattr(self, self.base_network).to(device)

    def _pipeline_networks(self, trainable: torch.nn.Module | None) -> dict:
        return {self.base_network: getattr(self, self.base_network),
                "controlnet": trainable if trainable is not None else self.controlnet}


def adapter_class_for(training):
    """The adapter class a run of ``training`` (a TrainingConfig) loads: the family's, or its
    ControlNet adapter under controlnet (configuration checks that the family has one)."""
    spec = family_spec(training.model_family)
    return load_object(spec.controlnet_adapter if training.controlnet else spec.adapter)
