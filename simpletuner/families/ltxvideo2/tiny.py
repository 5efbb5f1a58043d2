"""The tiny LTX-2 model, after diffusers' LTX2Pipeline tests' dummy components: a two-block
LTX2VideoTransformer3DModel with its audio stream, the text connectors, the video VAE (8x space
and time, three levels), the audio VAE (mel spectrograms at 16 kHz) and its vocoder, a tiny Gemma
3 text encoder (with its vision tower, as Gemma3ForConditionalGeneration has one) and a locally
written Gemma tokenizer, and FlowMatchEulerDiscreteScheduler with LTX-2's dynamic shift."""

from __future__ import annotations

from pathlib import Path

from simpletuner.families.lumina2.tiny import write_tiny_gemma_tokenizer

TEXT_WIDTH = 32
TEXT_LAYERS = 2
LATENT_CHANNELS = 8
AUDIO_LATENT_CHANNELS = 2
# LTX-2's scheduler_config.json: the shift grows with the clip's token count.
SCHEDULER = dict(use_dynamic_shifting=True, base_image_seq_len=1024, max_image_seq_len=4096,
                 base_shift=0.95, max_shift=2.05)


def tiny_gemma3(folder: Path):
    from transformers import (Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig,
                              SiglipVisionConfig)

    ids = write_tiny_gemma_tokenizer(folder)
    text = Gemma3TextConfig(hidden_size=TEXT_WIDTH, intermediate_size=37,
                            num_hidden_layers=TEXT_LAYERS, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=8, max_position_embeddings=1024,
                            sliding_window=64, **ids)
    vision = SiglipVisionConfig(hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                                num_attention_heads=2, image_size=28, patch_size=14)
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                          boi_token_index=ids["bos_token_id"], eoi_token_index=ids["eos_token_id"],
                          image_token_index=ids["pad_token_id"])
    return Gemma3ForConditionalGeneration(config).eval()


def tiny_connectors():
    from diffusers.pipelines.ltx2 import LTX2TextConnectors

    return LTX2TextConnectors(
        caption_channels=TEXT_WIDTH, text_proj_in_factor=TEXT_LAYERS + 1,
        video_connector_num_attention_heads=4, video_connector_attention_head_dim=8,
        video_connector_num_layers=1, video_connector_num_learnable_registers=None,
        audio_connector_num_attention_heads=4, audio_connector_attention_head_dim=8,
        audio_connector_num_layers=1, audio_connector_num_learnable_registers=None,
        connector_rope_base_seq_len=32, rope_theta=10000.0, rope_double_precision=False,
        causal_temporal_positioning=False, rope_type="split")


def tiny_video_vae():
    from diffusers import AutoencoderKLLTX2Video

    levels = 3
    return AutoencoderKLLTX2Video(
        in_channels=3, out_channels=3, latent_channels=LATENT_CHANNELS,
        block_out_channels=(8,) * levels, decoder_block_out_channels=(8,) * levels,
        layers_per_block=(1,) * (levels + 1), decoder_layers_per_block=(1,) * (levels + 1),
        spatio_temporal_scaling=(True,) * levels, decoder_spatio_temporal_scaling=(True,) * levels,
        decoder_inject_noise=(False,) * (levels + 1), downsample_type=("spatiotemporal",) * levels,
        upsample_residual=(False,) * levels, upsample_factor=(1,) * levels,
        timestep_conditioning=False, patch_size=1, patch_size_t=1, encoder_causal=True,
        decoder_causal=False)


def tiny_audio_vae_and_vocoder():
    from diffusers import AutoencoderKLLTX2Audio
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=4, output_channels=2, ch_mult=(1, 1, 1), num_res_blocks=1,
        attn_resolutions=None, in_channels=2, resolution=32,
        latent_channels=AUDIO_LATENT_CHANNELS, norm_type="pixel", causality_axis="height",
        dropout=0.0, mid_block_add_attention=False, sample_rate=16000, mel_hop_length=160,
        is_causal=True, mel_bins=8)
    vocoder = LTX2Vocoder(
        in_channels=audio_vae.config.output_channels * audio_vae.config.mel_bins,
        # 10 * 4 * 4 samples a mel frame: the audio VAE's hop length, as the published one
        hidden_channels=32, out_channels=2, upsample_kernel_sizes=[20, 8, 8],
        upsample_factors=[10, 4, 4], resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]],
        leaky_relu_negative_slope=0.1, output_sampling_rate=16000)
    return audio_vae, vocoder


def build_ltxvideo2(staging: Path):
    from diffusers import FlowMatchEulerDiscreteScheduler, LTX2Pipeline, LTX2VideoTransformer3DModel
    from transformers import AutoTokenizer

    text_encoder = tiny_gemma3(staging / "tokenizer")
    audio_vae, vocoder = tiny_audio_vae_and_vocoder()
    transformer = LTX2VideoTransformer3DModel(
        in_channels=LATENT_CHANNELS, out_channels=LATENT_CHANNELS, patch_size=1, patch_size_t=1,
        num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
        audio_in_channels=AUDIO_LATENT_CHANNELS * audio_vae.config.mel_bins // 4,
        audio_out_channels=AUDIO_LATENT_CHANNELS * audio_vae.config.mel_bins // 4,
        audio_num_attention_heads=2, audio_attention_head_dim=4, audio_cross_attention_dim=8,
        num_layers=2, qk_norm="rms_norm_across_heads", caption_channels=TEXT_WIDTH,
        rope_double_precision=False, rope_type="split")
    return LTX2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER), vae=tiny_video_vae(),
        audio_vae=audio_vae, text_encoder=text_encoder,
        tokenizer=AutoTokenizer.from_pretrained(staging / "tokenizer"),
        connectors=tiny_connectors(), transformer=transformer, vocoder=vocoder)
