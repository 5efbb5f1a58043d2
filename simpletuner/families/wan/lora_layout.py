"""lora_format 'comfyui' for Wan: ``diffusion_model.`` with Wan's original module names
(``blocks.0.self_attn.q``), which ComfyUI reads and diffusers' Wan loader converts back."""

from __future__ import annotations

import re

from simpletuner.training.adapters.lora_layouts import Layout

_WAN_NAMES = ((r"\.attn1\.", ".self_attn."), (r"\.attn2\.", ".cross_attn."),
              (r"\.to_q$", ".q"), (r"\.to_k$", ".k"), (r"\.to_v$", ".v"), (r"\.to_out\.0$", ".o"),
              (r"\.ffn\.net\.0\.proj$", ".ffn.0"), (r"\.ffn\.net\.2$", ".ffn.2"))


def _wan_original(path: str) -> str:
    for pattern, replacement in _WAN_NAMES:
        path = re.sub(pattern, replacement, path)
    return "diffusion_model." + path


COMFYUI_LAYOUT = Layout("diffusion_model. (Wan's names)", _wan_original, ".lora_down.weight",
                        ".lora_up.weight", True)
