"""The tiny Kandinsky 5.0 Image: Kandinsky5T2IPipeline's own classes at toy widths (one text and
two visual blocks), Qwen-Image's tiny Qwen2.5-VL with its locally written Qwen2 tokenizer, a
tiny CLIP, and the tiny Flux VAE (8x, as the pipeline's fixed vae_scale_factor_spatial)."""

from __future__ import annotations

from pathlib import Path

from simpletuner.families.qwen_image.tiny import TEXT_WIDTH, tiny_qwen25_vl
from simpletuner.models.tiny.parts import clip_tokenizer_and_config, flow_vae


def tiny_transformer(**overrides):
    """The modulations start at zero (adaLN-zero: every block an identity, so a LoRA on the
    attention gets no gradient); here they are drawn (seeded), as a trained model's are."""
    import torch
    from diffusers import Kandinsky5Transformer3DModel

    # Heads of 16 (= the rope axes 4 + 6 + 6), two of them.
    settings = dict(in_visual_dim=16, out_visual_dim=16, in_text_dim=TEXT_WIDTH,
                    in_text_dim2=32, time_dim=16, patch_size=(1, 2, 2), model_dim=32,
                    ff_dim=64, num_text_blocks=1, num_visual_blocks=2, axes_dims=(4, 6, 6),
                    visual_cond=False, attention_type="regular") | overrides
    transformer = Kandinsky5Transformer3DModel(**settings)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in transformer.named_parameters():
            if "modulation.out_layer" in name:
                parameter.copy_(0.2 * torch.randn(parameter.shape, generator=generator))
    return transformer


def build_kandinsky5_image(staging: Path):
    from diffusers import FlowMatchEulerDiscreteScheduler, Kandinsky5T2IPipeline
    from transformers import CLIPTextModel

    tokenizer, text_encoder = tiny_qwen25_vl(staging)
    tokenizer_2, clip_config = clip_tokenizer_and_config(staging, "tokenizer_2")
    return Kandinsky5T2IPipeline(
        transformer=tiny_transformer(), vae=flow_vae(0.3611, 0.1159),
        text_encoder=text_encoder, tokenizer=tokenizer,
        text_encoder_2=CLIPTextModel(clip_config), tokenizer_2=tokenizer_2,
        # a fixed shift, as SimpleTuner's example trains with (flow_schedule_shift 3)
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0))


def build_kandinsky5_image_i2i(staging: Path):
    """Image-to-image: the transformer reads the reference's channels too (visual_cond), its
    text encoder the reference through a Qwen2VLProcessor, which sees it at most 112 x 112."""
    from diffusers import FlowMatchEulerDiscreteScheduler, Kandinsky5I2IPipeline
    from transformers import CLIPTextModel

    from simpletuner.families.qwen_image.processor import PIPELINE_ENTRY, build_processor

    tokenizer, text_encoder = tiny_qwen25_vl(staging)
    tokenizer_2, clip_config = clip_tokenizer_and_config(staging, "tokenizer_2")
    processor = build_processor(tokenizer,
                                size={"shortest_edge": 56 * 56, "longest_edge": 112 * 112})
    pipeline = Kandinsky5I2IPipeline(
        transformer=tiny_transformer(visual_cond=True), vae=flow_vae(0.3611, 0.1159),
        text_encoder=text_encoder, tokenizer=processor,
        text_encoder_2=CLIPTextModel(clip_config), tokenizer_2=tokenizer_2,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0))
    pipeline.register_to_config(tokenizer=PIPELINE_ENTRY)  # what its folder holds
    return pipeline
