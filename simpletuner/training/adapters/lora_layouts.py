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
- FLUX.2: ``diffusion_model.`` with BFL's names (double_blocks.0.img_attn.qkv, single_blocks.0.
  linear1), where q, k and v are one projection: their LoRAs become one of rank 3r (down
  stacked, up block-diagonal; _convert_non_diffusers_flux2_lora_to_diffusers splits it back
  exactly), alpha folded in (that converter takes no alpha)."""

from __future__ import annotations

import re
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


_WAN_NAMES = ((r"\.attn1\.", ".self_attn."), (r"\.attn2\.", ".cross_attn."),
              (r"\.to_q$", ".q"), (r"\.to_k$", ".k"), (r"\.to_v$", ".v"), (r"\.to_out\.0$", ".o"),
              (r"\.ffn\.net\.0\.proj$", ".ffn.0"), (r"\.ffn\.net\.2$", ".ffn.2"))


def _wan_original(path: str) -> str:
    for pattern, replacement in _WAN_NAMES:
        path = re.sub(pattern, replacement, path)
    return "diffusion_model." + path


# FLUX.2: diffusers' names -> BFL's (_convert_non_diffusers_flux2_lora_to_diffusers, inverted).
_FLUX2_QKV = {"to_q": ("img_attn.qkv", 0), "to_k": ("img_attn.qkv", 1),
              "to_v": ("img_attn.qkv", 2), "add_q_proj": ("txt_attn.qkv", 0),
              "add_k_proj": ("txt_attn.qkv", 1), "add_v_proj": ("txt_attn.qkv", 2)}
_FLUX2_DOUBLE = {"attn.to_out.0": "img_attn.proj", "attn.to_add_out": "txt_attn.proj",
                 "ff.linear_in": "img_mlp.0", "ff.linear_out": "img_mlp.2",
                 "ff_context.linear_in": "txt_mlp.0", "ff_context.linear_out": "txt_mlp.2"}
_FLUX2_SINGLE = {"attn.to_qkv_mlp_proj": "linear1", "attn.to_out": "linear2"}
_FLUX2_TOP = {"x_embedder": "img_in", "context_embedder": "txt_in",
              "time_guidance_embed.timestep_embedder.linear_1": "time_in.in_layer",
              "time_guidance_embed.timestep_embedder.linear_2": "time_in.out_layer",
              "time_guidance_embed.guidance_embedder.linear_1": "guidance_in.in_layer",
              "time_guidance_embed.guidance_embedder.linear_2": "guidance_in.out_layer",
              "proj_out": "final_layer.linear", "norm_out.linear": "final_layer.adaLN_modulation.1",
              "single_stream_modulation.linear": "single_stream_modulation.lin",
              "double_stream_modulation_img.linear": "double_stream_modulation_img.lin",
              "double_stream_modulation_txt.linear": "double_stream_modulation_txt.lin"}
_BLOCK = re.compile(r"^(transformer_blocks|single_transformer_blocks)\.(\d+)\.(.+)$")


def _flux2_original(path: str) -> str:
    block = _BLOCK.match(path)
    if block is None:
        name = _FLUX2_TOP.get(path)
    elif block.group(1) == "single_transformer_blocks":
        name = _FLUX2_SINGLE.get(block.group(3))
        name = name and f"single_blocks.{block.group(2)}.{name}"
    else:
        inner = block.group(3)
        fused = _FLUX2_QKV.get(inner.removeprefix("attn."))
        name = fused[0] if fused and inner.startswith("attn.") else _FLUX2_DOUBLE.get(inner)
        name = name and f"double_blocks.{block.group(2)}.{name}"
    if name is None:
        raise LayoutError(f"LoRA module '{path}' has no name in FLUX.2's original layout; use "
                          "lora_format 'diffusers', or lora_target_modules without it")
    return "diffusion_model." + name


def _flux2_slot(path: str) -> int | None:
    block = _BLOCK.match(path)
    if block is None or block.group(1) != "transformer_blocks":
        return None
    fused = _FLUX2_QKV.get(block.group(3).removeprefix("attn."))
    return fused[1] if fused and block.group(3).startswith("attn.") else None


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
    "flux2": Layout("diffusion_model. (BFL's names, q/k/v fused)", _flux2_original,
                    ".lora_A.weight", ".lora_B.weight", False, _flux2_slot),
}
