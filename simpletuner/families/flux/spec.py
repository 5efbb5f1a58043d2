"""FLUX.1: CLIP and T5, a guidance-distilled flow transformer; model_flavour 'kontext' trains a
FluxKontextPipeline folder on edit pairs (kontext.py); controlnet trains a FluxControlNetModel
(controlnet.py)."""

from simpletuner.families.spec import FLOW, FamilySpec
from simpletuner.training.adapters.lora_layouts import TRANSFORMER

# SimpleTuner's flux_lora_target sets, in FluxTransformer2DModel's module names (the fused
# to_qkv / add_qkv_proj it also lists exist only in fused models, so they are left out).
_ATTENTION = ("to_q", "to_k", "to_v", "to_out.0")
_CONTEXT = ("add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")
_FEED_FORWARD = ("ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2",
                 "proj_mlp", "proj_out")
LORA_TARGET_PRESETS = {
    "mmdit": _ATTENTION,   # SimpleTuner's DEFAULT_LORA_TARGET for a name it has no set for
    "all": _ATTENTION + _CONTEXT,
    "context": _CONTEXT,
    "context+ffs": _CONTEXT + ("ff_context.net.0.proj", "ff_context.net.2"),
    "all+ffs": _ATTENTION + _CONTEXT + _FEED_FORWARD,
    "all+ffs+embedder": ("x_embedder",) + _ATTENTION + _CONTEXT + _FEED_FORWARD,
    "ai-toolkit": _ATTENTION + _CONTEXT + _FEED_FORWARD + (
        "norm.linear", "norm1.linear", "norm1_context.linear"),
    "tiny": ("single_transformer_blocks.7.proj_out", "single_transformer_blocks.20.proj_out"),
    "nano": ("single_transformer_blocks.7.proj_out",),
}

SPEC = FamilySpec(
    name="flux", objective=FLOW, adapter="simpletuner.families.flux.adapter.FluxAdapter",
    pipeline_prefixes=(("Flux", "flux"),), comfyui_layout=TRANSFORMER,
    tiny_models={"tiny-flux": "simpletuner.families.flux.tiny.build_flux",
                 "tiny-flux-kontext": "simpletuner.families.flux.tiny.build_flux_kontext"},
    variant_adapters={
        "FluxKontextPipeline": "simpletuner.families.flux.kontext.FluxKontextAdapter"},
    reference_flavours={"kontext": None},
    guidance_input=True,
    lora_target_presets=LORA_TARGET_PRESETS,
    # SimpleTuner's training adapter of the distilled schnell (assistant_lora_path)
    default_assistants={"schnell": "ostris/FLUX.1-schnell-training-adapter"},
    controlnet_adapter="simpletuner.families.flux.controlnet.FluxControlNetAdapter",
    # the double-stream blocks, then the single-stream ones
    swappable_block_keys=("num_layers", "num_single_layers"),
    attention_heads_key="num_attention_heads",  # context_parallel_size
    token_routing=True,  # tread_config: adapter.py's token_layout
    # Flux's guidance is an input of the network, not an unconditional pass
    guidance_scale_without_cfg=None)
