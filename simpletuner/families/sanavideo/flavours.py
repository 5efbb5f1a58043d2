"""Which SANA-Video folders are supported, decided without torch: those whose VAE is Wan 2.1's
(AutoencoderKLWan, SANA-Video_2B_480p_diffusers); the 720p model's DC-AE-V and LTX-2 VAE
folders are refused by name. ``model_flavour``: SimpleTuner's one name, 2b-480p."""

from __future__ import annotations

import json
from pathlib import Path

FLAVOURS = ("2b-480p",)
SUPPORTED_VAE = "AutoencoderKLWan"


def vae_class_name(folder: Path) -> str | None:
    try:
        config = json.loads((folder / "vae" / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # the subfolder checks say what is missing
    return config.get("_class_name") if isinstance(config, dict) else None


def unsupported_folder(name_or_path: str) -> str | None:
    """Why the local folder ``name_or_path`` is a SANA-Video model not supported here."""
    name = vae_class_name(Path(name_or_path).expanduser())
    if name is None or name == SUPPORTED_VAE:
        return None
    return (f"{name_or_path} is not a supported SANA-Video folder: its VAE is {name}; "
            f"supported here: SANA-Video with Wan 2.1's VAE ({SUPPORTED_VAE}, "
            "Efficient-Large-Model/SANA-Video_2B_480p_diffusers)")


def flavour_mismatch(flavour: str | None) -> str | None:
    if flavour is None or flavour in FLAVOURS:
        return None
    return (f"{flavour!r} is not a SANA-Video flavour; use {' or '.join(FLAVOURS)}, or remove "
            "it (the folder decides)")
