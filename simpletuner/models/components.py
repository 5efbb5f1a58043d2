"""Loading what every family has besides its trainable network: the folder check, the VAE and
the text encoders with their tokenizers, all frozen. The family files load only their network
and schedulers, so a loading fix lands in every family at once."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch
from simpletuner.models.layout import ModelFolderError


def load_component(load, folder: Path, subfolder: str):
    """``load(folder, subfolder=...)``, its failure reported as a ModelFolderError naming the
    subfolder."""
    try:
        return load(folder, subfolder=subfolder)
    except (OSError, ValueError, KeyError) as error:
        raise ModelFolderError(f"cannot load {subfolder}/ from {folder}: {error}") from error


def checked_folder(adapter_class, folder: Path) -> Path:
    """``folder`` as a Path, after the layout check against ``adapter_class``'s family."""
    folder = Path(folder)
    adapter_class.check_folder(folder)
    return folder


def load_frozen_components(adapter_class, folder: Path, *, device: torch.device,
                           weight_dtype: torch.dtype, vae_dtype: torch.dtype) -> dict:
    """{"vae", "text_encoders", "tokenizers"} of ``adapter_class``'s family (its ``vae_class``
    and ``text_encoder_specs``), frozen in eval mode on ``device``: the VAE in ``vae_dtype``,
    the text encoders in ``weight_dtype``."""
    # Cast while loading: diffusers keeps any modules it must keep in float32.
    vae = load_component(partial(adapter_class.vae_class.from_pretrained, torch_dtype=vae_dtype),
                         folder, "vae")
    text_encoders, tokenizers = [], []
    for encoder_folder, tokenizer_folder, encoder_class, tokenizer_class in (
            adapter_class.text_encoder_specs):
        text_encoders.append(load_component(encoder_class.from_pretrained, folder,
                                            encoder_folder))
        tokenizers.append(load_component(tokenizer_class.from_pretrained, folder,
                                         tokenizer_folder))
    vae.to(device).requires_grad_(False).eval()
    for encoder in text_encoders:
        encoder.to(device, dtype=weight_dtype).requires_grad_(False).eval()
    return {"vae": vae, "text_encoders": text_encoders, "tokenizers": tokenizers}
