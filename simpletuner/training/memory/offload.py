"""The frozen components (VAE, text encoders) leave the training device once the latent and
text-embedding caches hold everything they compute; validation brings them back only while it
runs (ModelAdapter.frozen_components_on_device).

"offload" moves them to the CPU and back. "free" drops their weights (the modules stay, on the
meta device) and reloads them from the model folder for each validation, quantized again as
configured: the choice when even host memory is short, and the only one that frees anything
when the training device is the CPU."""

from __future__ import annotations

import logging
from contextlib import contextmanager

import torch

from simpletuner.models.components import load_frozen_components
from simpletuner.models.group_offload import is_group_offloaded
from simpletuner.training.memory.quantization import quantize_text_encoder
from simpletuner.training.settings import OffloadSettings

logger = logging.getLogger(__name__)

META = torch.device("meta")
CPU = torch.device("cpu")


class FrozenComponentsAway:
    """Where an adapter's VAE and text encoders are while training runs, and how to get them
    back onto the device."""

    def __init__(self, adapter, mode: str, text_encoder_precisions: list[str],
                 text_encoder_dtype: torch.dtype):
        self.adapter = adapter
        self.mode = mode
        self.text_encoder_precisions = text_encoder_precisions
        self.text_encoder_dtype = text_encoder_dtype
        self.vae_dtype = adapter.vae.dtype

    def modules(self) -> list[torch.nn.Module]:
        """The parts that move: group-offloaded ones are on the host already, and between
        their forwards their hooks keep them there."""
        return [module for module in (self.adapter.vae, *self.adapter.text_encoders)
                if not is_group_offloaded(module)]

    def leave_device(self) -> None:
        away = META if self.mode == "free" else CPU
        for module in self.modules():
            module.to(away)

    def _reload(self) -> None:
        adapter = self.adapter
        frozen = load_frozen_components(type(adapter), adapter.folder,
                                        device=adapter.device,
                                        weight_dtype=self.text_encoder_dtype,
                                        vae_dtype=self.vae_dtype)
        for encoder, precision in zip(frozen["text_encoders"], self.text_encoder_precisions):
            quantize_text_encoder(encoder, precision, self.text_encoder_dtype)
        adapter.vae, adapter.text_encoders = frozen["vae"], frozen["text_encoders"]

    @contextmanager
    def on_device(self):
        if self.mode == "free":
            self._reload()
        else:
            for module in self.modules():
                module.to(self.adapter.device)
        try:
            yield
        finally:
            self.leave_device()


def release_frozen_components(adapter, settings: OffloadSettings,
                              text_encoder_dtype: torch.dtype) -> None:
    """Called once the caches are complete: move (or free) the VAE and text encoders as
    ``frozen_components_after_caching`` says; "keep" leaves them where they are, and so does
    group offload."""
    mode = settings.frozen_components_after_caching
    if mode == "keep" or all(map(is_group_offloaded, (adapter.vae, *adapter.text_encoders))):
        return
    precisions = [settings.text_encoder_precision(n)
                  for n in range(1, len(adapter.text_encoders) + 1)]
    adapter.frozen_away = FrozenComponentsAway(adapter, mode, precisions, text_encoder_dtype)
    adapter.frozen_away.leave_device()
    logger.info("caches complete: VAE and %d text encoder(s) %s until validation needs them",
                len(adapter.text_encoders), "freed" if mode == "free" else "moved to the CPU")
