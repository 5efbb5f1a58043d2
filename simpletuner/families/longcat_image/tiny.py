"""The tiny LongCat-Image: LongCatImagePipeline's own classes at toy widths (one joint and one
single-stream block), Qwen-Image's tiny Qwen2.5-VL with its locally written Qwen2 tokenizer and
the torchvision-free Qwen2VLProcessor around it, and the tiny Flux VAE; the tiny LongCat-Image-Edit
is the same network in LongCatImageEditPipeline."""

from __future__ import annotations

from pathlib import Path

from simpletuner.families.qwen_image.tiny import TEXT_WIDTH, tiny_qwen25_vl
from simpletuner.models.tiny.parts import flow_vae, tiny_kl_vae


def build_longcat_image(staging: Path):
    from diffusers import LongCatImagePipeline

    return _longcat_parts(staging, LongCatImagePipeline, flow_vae(0.3611, 0.1159))


def build_longcat_image_edit(staging: Path):
    """The same network saved as LongCatImageEditPipeline, whose text encoder sees each
    reference at most 112 x 112 (64 patches of 14): a few dozen image tokens."""
    from diffusers import LongCatImageEditPipeline

    # It edits at about 1 MP whatever it is asked: a VAE without the mid-block attention
    # (16384 latent pixels attending to each other) keeps that to seconds on a CPU.
    vae = tiny_kl_vae(0.3611, latent_channels=16, shift_factor=0.1159, use_quant_conv=False,
                      use_post_quant_conv=False, mid_block_add_attention=False)
    return _longcat_parts(staging, LongCatImageEditPipeline, vae,
                          size={"shortest_edge": 56 * 56, "longest_edge": 112 * 112})


def _longcat_parts(staging: Path, pipeline_class: type, vae, **processor_settings):
    from diffusers import FlowMatchEulerDiscreteScheduler, LongCatImageTransformer2DModel

    from simpletuner.families.qwen_image.processor import PIPELINE_ENTRY, build_processor

    tokenizer, text_encoder = tiny_qwen25_vl(staging)
    # Heads of 16 = the rope axes (modality, row, column); 2x2 packing of 16 channels = 64.
    transformer = LongCatImageTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=TEXT_WIDTH, pooled_projection_dim=TEXT_WIDTH,
        axes_dims_rope=[4, 6, 6])
    # The pipeline shifts by resolution (mu from the scheduler's Flux-like settings).
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
        base_image_seq_len=256, max_image_seq_len=4096)
    pipeline = pipeline_class(
        scheduler=scheduler, vae=vae, text_encoder=text_encoder,
        tokenizer=tokenizer, text_processor=build_processor(tokenizer, **processor_settings),
        transformer=transformer)
    pipeline.register_to_config(text_processor=PIPELINE_ENTRY)  # what its folder holds
    return pipeline
