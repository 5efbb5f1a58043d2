"""The key layout of lora_format 'comfyui' per family: what ComfyUI (and kohya, Forge,
musubi-tuner) read, where diffusers' own loaders convert it back.

Per family, from what diffusers' own loaders convert (diffusers/loaders/lora_conversion_utils):
- SD 1.x/2.x/XL: kohya's ``lora_unet_<module path, dots as underscores>`` with
  ``.lora_down.weight``, ``.lora_up.weight`` and ``.alpha``;
- Flux and Chroma: ``transformer.<module path>`` with ``.lora_A``/``.lora_B`` and ``.alpha``;
- Qwen-Image and Z-Image: ``diffusion_model.<module path>`` with lora_down/lora_up/alpha;
- Wan: ``diffusion_model.`` with Wan's original names (``blocks.0.self_attn.q``);
- SD3: ``transformer.<module path>`` without alpha keys (diffusers' SD3 loader refuses them;
  ComfyUI then applies scale 1), so alpha / rank is folded into lora_up.
FLUX.2's original layout fuses q, k and v into one projection; it is refused for now.
Torch-free: the launch checks read it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

@dataclass(frozen=True)
class Layout:
    name: str                         # what the metadata and errors call it
    module_key: Callable[[str], str]  # a diffusers module path -> the file's module key
    down: str                         # suffix of the down (A) matrix
    up: str                           # suffix of the up (B) matrix
    alpha_keys: bool                  # alpha as a tensor per module, else folded into up


def _kohya_unet(path: str) -> str:
    return "lora_unet_" + path.replace(".", "_")


_WAN_NAMES = ((r"\.attn1\.", ".self_attn."), (r"\.attn2\.", ".cross_attn."),
              (r"\.to_q$", ".q"), (r"\.to_k$", ".k"), (r"\.to_v$", ".v"), (r"\.to_out\.0$", ".o"),
              (r"\.ffn\.net\.0\.proj$", ".ffn.0"), (r"\.ffn\.net\.2$", ".ffn.2"))


def _wan_original(path: str) -> str:
    for pattern, replacement in _WAN_NAMES:
        path = re.sub(pattern, replacement, path)
    return "diffusion_model." + path


_KOHYA = Layout("kohya lora_unet_", _kohya_unet, ".lora_down.weight", ".lora_up.weight", True)
_TRANSFORMER = Layout("transformer. with alpha", lambda p: "transformer." + p,
                      ".lora_A.weight", ".lora_B.weight", True)
_DIFFUSION_MODEL = Layout("diffusion_model.", lambda p: "diffusion_model." + p,
                          ".lora_down.weight", ".lora_up.weight", True)
COMFYUI_LAYOUTS = {
    "sd1x": _KOHYA, "sd2x": _KOHYA, "sdxl": _KOHYA,
    "flux": _TRANSFORMER, "chroma": _TRANSFORMER,
    "qwen_image": _DIFFUSION_MODEL, "z_image": _DIFFUSION_MODEL,
    "wan": Layout("diffusion_model. (Wan's names)", _wan_original, ".lora_down.weight",
                  ".lora_up.weight", True),
    "sd3": Layout("transformer. (alpha folded in)", lambda p: "transformer." + p,
                  ".lora_A.weight", ".lora_B.weight", False),
}


def comfyui_refusal(family: str) -> str | None:
    """Why lora_format 'comfyui' cannot be written for ``family``, or None."""
    if family in COMFYUI_LAYOUTS:
        return None
    return (f"lora_format 'comfyui' is not available for model_family '{family}' (its original "
            "layout fuses projections this trainer adapts separately); use 'diffusers'")
