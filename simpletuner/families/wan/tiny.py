"""The tiny Wan 2.1 text-to-video model (its image-to-video sibling below): a one-block
WanTransformer3DModel, a narrow causal 3D VAE with Wan 2.1's 8x spatial and 4x temporal
downsampling (and its latents_mean/latents_std), a tiny UMT5 encoder with a locally written T5
tokenizer, and Wan 2.1's scheduler (UniPC with flow sigmas, flow_shift 3.0)."""

from __future__ import annotations

from pathlib import Path

from simpletuner.models.tiny.parts import T5_TOKEN_LENGTH
from simpletuner.models.tiny.tokenizers import write_tiny_t5_tokenizer


def tiny_umt5(staging: Path, subfolder: str, width: int):
    """A T5Tokenizer written to ``staging/subfolder`` and a tiny UMT5EncoderModel."""
    from transformers import T5Tokenizer, UMT5Config, UMT5EncoderModel

    ids = write_tiny_t5_tokenizer(staging / subfolder, T5_TOKEN_LENGTH)
    config = UMT5Config(d_model=width, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                        relative_attention_num_buckets=8, dropout_rate=0.0,
                        feed_forward_proj="gated-gelu", **ids)
    return T5Tokenizer.from_pretrained(staging / subfolder), UMT5EncoderModel(config)


def tiny_wan_transformer(text_dim: int, channels: int = 16):
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
        in_channels=channels, out_channels=channels, text_dim=text_dim, freq_dim=32, ffn_dim=32,
        num_layers=1, rope_max_seq_len=32)


def build_wan(staging: Path):
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline

    tokenizer, text_encoder = tiny_umt5(staging, "tokenizer", 32)
    transformer = tiny_wan_transformer(text_encoder.config.d_model)
    vae = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1,
                           temperal_downsample=[False, True, True])
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                        num_train_timesteps=1000, flow_shift=3.0)
    return WanPipeline(transformer=transformer, vae=vae, text_encoder=text_encoder,
                       tokenizer=tokenizer, scheduler=scheduler)


def tiny_clip_vision():
    """A tiny CLIPVisionModel (what WanImageToVideoPipeline and Wan2.1-I2V-*-Diffusers hold;
    32x32 input, 16 patches) and the CLIP image processor fitted to it: the PIL one, which
    needs no torchvision."""
    from transformers import CLIPVisionConfig, CLIPVisionModel
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    config = CLIPVisionConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                              num_attention_heads=2, image_size=32, patch_size=8)
    processor = CLIPImageProcessorPil(size={"shortest_edge": 32},
                                      crop_size={"height": 32, "width": 32})
    return processor, CLIPVisionModel(config)


def build_wan_i2v(staging: Path):
    """Wan 2.1 image-to-video: the T2V parts, a transformer that also takes the 16 condition
    channels and the 4 mask channels (36 in all) and the CLIP image embedding (image_dim, the
    image tokens' own key/value projections), and the CLIP image encoder."""
    from diffusers import WanImageToVideoPipeline, WanTransformer3DModel

    parts = build_wan(staging).components
    image_processor, image_encoder = tiny_clip_vision()
    heads, head_dim = 2, 12
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=heads, attention_head_dim=head_dim,
        in_channels=36, out_channels=16, text_dim=parts["text_encoder"].config.d_model,
        freq_dim=32, ffn_dim=32, num_layers=1, rope_max_seq_len=32,
        image_dim=image_encoder.config.hidden_size, added_kv_proj_dim=heads * head_dim)
    return WanImageToVideoPipeline(
        transformer=transformer, vae=parts["vae"], text_encoder=parts["text_encoder"],
        tokenizer=parts["tokenizer"], scheduler=parts["scheduler"],
        image_encoder=image_encoder, image_processor=image_processor)
