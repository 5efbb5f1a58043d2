"""What the tiny UNet models share: the UNet and SD 1.x/2.x's pipeline (SD 1.x epsilon, SD 2.x
v-prediction), on the briefly pretrained 4-channel VAE of sd_vae.py; each family's tiny.py
picks its own."""

from __future__ import annotations

from pathlib import Path

from simpletuner.models.tiny.parts import DDPM_BETAS, clip_tokenizer_and_config
from simpletuner.models.tiny.sd_vae import pretrained_tiny_vae


def tiny_unet(**overrides):
    from diffusers import UNet2DConditionModel

    # One norm group: with 32 channels the default 32 groups normalise each channel alone,
    # erasing the per-channel offsets (a latent's background colour) it must predict.
    return UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, norm_num_groups=1,
        block_out_channels=(32, 64), down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), **overrides)


def build_sd(staging: Path, *, v_prediction: bool):
    from diffusers import DDIMScheduler, PNDMScheduler, StableDiffusionPipeline
    from transformers import CLIPTextModel

    tokenizer, text_config = clip_tokenizer_and_config(staging, "tokenizer")
    if v_prediction:  # like stable-diffusion-2-1: DDIM, v-prediction, linear attention projection
        unet = tiny_unet(cross_attention_dim=32, attention_head_dim=(2, 4),
                          use_linear_projection=True)
        scheduler = DDIMScheduler(**DDPM_BETAS, prediction_type="v_prediction", clip_sample=False,
                                  set_alpha_to_one=False, steps_offset=1)
    else:  # like stable-diffusion-v1-5
        unet = tiny_unet(cross_attention_dim=32)
        scheduler = PNDMScheduler(**DDPM_BETAS, skip_prk_steps=True, set_alpha_to_one=False,
                                  steps_offset=1)
    return StableDiffusionPipeline(
        vae=pretrained_tiny_vae(), text_encoder=CLIPTextModel(text_config), tokenizer=tokenizer,
        unet=unet, scheduler=scheduler, safety_checker=None, feature_extractor=None,
        requires_safety_checker=False)
