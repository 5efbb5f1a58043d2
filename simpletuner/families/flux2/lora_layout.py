"""lora_format 'comfyui' for FLUX.2: ``diffusion_model.`` with BFL's names (double_blocks.0.
img_attn.qkv, single_blocks.0.linear1), where q, k and v are one projection: their LoRAs become
one of rank 3r (down stacked, up block-diagonal; diffusers'
_convert_non_diffusers_flux2_lora_to_diffusers splits it back exactly), alpha folded in (that
converter takes no alpha)."""

from __future__ import annotations

import re

from simpletuner.training.adapters.lora_layouts import Layout, LayoutError

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


COMFYUI_LAYOUT = Layout("diffusion_model. (BFL's names, q/k/v fused)", _flux2_original,
                        ".lora_A.weight", ".lora_B.weight", False, _flux2_slot)
