"""The tiny Sana model: SanaPipeline's own classes (SanaTransformer2DModel, AutoencoderDC, a
Gemma2 text encoder) at toy widths, with Lumina 2's locally written Gemma tokenizer. The
autoencoder downsamples 8x here (the real one 32x), so 64 px images keep a few tokens."""

from __future__ import annotations

from pathlib import Path

from simpletuner.families.lumina2.tiny import write_tiny_gemma_tokenizer

LATENT_CHANNELS = 8
TEXT_WIDTH = 32
# The pipeline prepends its instruction (~1000 characters, one token each here) to 300 tokens.
TEXT_POSITIONS = 2048


def tiny_dc_autoencoder():
    """Four stages (8x), the last with the multi-scale linear attention of the real one."""
    from diffusers import AutoencoderDC

    blocks = ("ResBlock", "ResBlock", "ResBlock", "EfficientViTBlock")
    scales = ((), (), (), (5,))
    return AutoencoderDC(
        in_channels=3, latent_channels=LATENT_CHANNELS, attention_head_dim=8,
        encoder_block_types=blocks, decoder_block_types=blocks,
        encoder_block_out_channels=(8, 8, 16, 16), decoder_block_out_channels=(8, 8, 16, 16),
        encoder_layers_per_block=(1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1),
        encoder_qkv_multiscales=scales, decoder_qkv_multiscales=scales,
        downsample_block_type="conv", upsample_block_type="interpolate",
        decoder_norm_types="rms_norm", decoder_act_fns="silu", scaling_factor=0.41407)


def build_sana(staging: Path):
    from diffusers import DPMSolverMultistepScheduler, SanaPipeline, SanaTransformer2DModel
    from transformers import AutoTokenizer, Gemma2Config, Gemma2Model

    ids = write_tiny_gemma_tokenizer(staging / "tokenizer")
    text_encoder = Gemma2Model(Gemma2Config(
        hidden_size=TEXT_WIDTH, intermediate_size=37, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        max_position_embeddings=TEXT_POSITIONS, sliding_window=TEXT_POSITIONS, **ids))
    # sample_size 16 is one of the sizes the pipeline's resolution binning knows (512 px).
    transformer = SanaTransformer2DModel(
        in_channels=LATENT_CHANNELS, out_channels=LATENT_CHANNELS, num_attention_heads=2,
        attention_head_dim=16, num_layers=2, num_cross_attention_heads=2,
        cross_attention_head_dim=16, cross_attention_dim=32, caption_channels=TEXT_WIDTH,
        mlp_ratio=2.5, sample_size=16, patch_size=1)
    # Sana's diffusers folders' scheduler: DPM-Solver++ on flow sigmas shifted by 3.
    scheduler = DPMSolverMultistepScheduler(prediction_type="flow_prediction",
                                            use_flow_sigmas=True, flow_shift=3.0)
    tokenizer = AutoTokenizer.from_pretrained(staging / "tokenizer",
                                              model_max_length=TEXT_POSITIONS)
    return SanaPipeline(tokenizer=tokenizer,
                        text_encoder=text_encoder, vae=tiny_dc_autoencoder(),
                        transformer=transformer, scheduler=scheduler)
