"""The tiny LTX-Video model, after diffusers' LTXPipeline tests' dummy components: a one-block
LTXVideoTransformer3DModel, a narrow causal video VAE compressing 8x in space and time as the
published one does (LTX's own 32x space is four levels; three keep the tiny clips small), a
tiny T5 encoder with a locally written tokenizer and FlowMatchEulerDiscreteScheduler with
LTX-Video's dynamic shift."""

from __future__ import annotations

from pathlib import Path

from simpletuner.models.tiny.parts import tiny_t5

LATENT_CHANNELS = 8
# LTX-Video 0.9.0's scheduler_config.json: the shift grows with the clip's token count (later
# versions add shift_terminal 0.1, whose stretch divides by zero at one sampling step).
SCHEDULER = dict(use_dynamic_shifting=True, base_image_seq_len=1024, max_image_seq_len=4096,
                 base_shift=0.95, max_shift=2.05)


def tiny_ltx_vae():
    from diffusers import AutoencoderKLLTXVideo

    levels = 4
    vae = AutoencoderKLLTXVideo(
        in_channels=3, out_channels=3, latent_channels=LATENT_CHANNELS,
        block_out_channels=(8,) * levels, decoder_block_out_channels=(8,) * levels,
        layers_per_block=(1,) * (levels + 1), decoder_layers_per_block=(1,) * (levels + 1),
        spatio_temporal_scaling=(True, True, True, False),
        decoder_spatio_temporal_scaling=(True, True, True, False),
        decoder_inject_noise=(False,) * (levels + 1), upsample_residual=(False,) * levels,
        upsample_factor=(1,) * levels, timestep_conditioning=False, patch_size=1,
        patch_size_t=1, encoder_causal=True, decoder_causal=False)
    return vae


def build_ltxvideo(staging: Path):
    from diffusers import FlowMatchEulerDiscreteScheduler, LTXPipeline, LTXVideoTransformer3DModel

    tokenizer, text_encoder = tiny_t5(staging, "tokenizer", 32)
    transformer = LTXVideoTransformer3DModel(
        in_channels=LATENT_CHANNELS, out_channels=LATENT_CHANNELS, patch_size=1, patch_size_t=1,
        num_attention_heads=4, attention_head_dim=8, cross_attention_dim=32, num_layers=1,
        caption_channels=text_encoder.config.d_model)
    return LTXPipeline(transformer=transformer, vae=tiny_ltx_vae(), text_encoder=text_encoder,
                       tokenizer=tokenizer, scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER))
