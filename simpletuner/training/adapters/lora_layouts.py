"""The key layouts of lora_format 'comfyui': what ComfyUI (and kohya, Forge, musubi-tuner)
read, where diffusers' own loaders convert it back. Each family's spec names its layout; the
shared ones are here, a family's own names (Wan's, FLUX.2's) in its folder.

Per family, from what diffusers' own loaders convert (diffusers/loaders/lora_conversion_utils):
- SD 1.x/2.x/XL: kohya's ``lora_unet_<module path, dots as underscores>`` with
  ``.lora_down.weight``, ``.lora_up.weight`` and ``.alpha``;
- Flux and Chroma: ``transformer.<module path>`` with ``.lora_A``/``.lora_B`` and ``.alpha``;
- Qwen-Image and Z-Image: ``diffusion_model.<module path>`` with lora_down/lora_up/alpha;
- Wan: ``diffusion_model.`` with Wan's original names (``blocks.0.self_attn.q``);
- SD3: ``transformer.<module path>`` without alpha keys (diffusers' SD3 loader refuses them;
  ComfyUI then applies scale 1), so alpha / rank is folded into lora_up.
- FLUX.2: ``diffusion_model.`` with BFL's names (double_blocks.0.img_attn.qkv, single_blocks.0.
  linear1), where q, k and v are one projection: their LoRAs become one of rank 3r (down
  stacked, up block-diagonal; _convert_non_diffusers_flux2_lora_to_diffusers splits it back
  exactly), alpha folded in (that converter takes no alpha)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


class LayoutError(ValueError):
    """A LoRA module the layout has no name for."""


@dataclass(frozen=True)
class Layout:
    name: str                         # what the metadata and errors call it
    module_key: Callable[[str], str]  # a diffusers module path -> the file's module key
    down: str                         # suffix of the down (A) matrix
    up: str                           # suffix of the up (B) matrix
    alpha_keys: bool                  # alpha as a tensor per module, else folded into up
    # A diffusers path's place (0, 1, 2) in a fused q/k/v projection of the file, or None.
    fused_slot: Callable[[str], int | None] = lambda path: None


def _kohya_unet(path: str) -> str:
    return "lora_unet_" + path.replace(".", "_")


KOHYA = Layout("kohya lora_unet_", _kohya_unet, ".lora_down.weight", ".lora_up.weight", True)
TRANSFORMER = Layout("transformer. with alpha", lambda p: "transformer." + p,
                     ".lora_A.weight", ".lora_B.weight", True)
DIFFUSION_MODEL = Layout("diffusion_model.", lambda p: "diffusion_model." + p,
                         ".lora_down.weight", ".lora_up.weight", True)
# SD3: diffusers' SD3 loader refuses alpha keys (ComfyUI then applies scale 1), so alpha / rank
# is folded into lora_up.
TRANSFORMER_ALPHA_FOLDED = Layout("transformer. (alpha folded in)", lambda p: "transformer." + p,
                                  ".lora_A.weight", ".lora_B.weight", False)
