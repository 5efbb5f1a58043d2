"""Built-in tiny models (`builtin:tiny-sd1x` and friends): built locally from configs with a
fixed seed on first use, saved as complete diffusers folders in the cache, then loaded like any
local model. Nothing is ever downloaded."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Callable

import torch

from simpletuner.common.atomic import give_umask_modes, staging_folder
from simpletuner.models.base import ModelFolderError
from simpletuner.models.model_path import (
    BUILTIN_PREFIX, known_builtins, model_path_problem,
)
from simpletuner.models.tiny_tokenizer import write_tiny_t5_tokenizer, write_tiny_tokenizer_files
from simpletuner.models.tiny_vae import pretrained_tiny_vae

BUILD_SEED = 0
# Bumped when a recipe changes what it builds, so older cached builds are replaced, not reused.
# 2: SD 1.x/2.x/SDXL get a pretrained VAE and one-group norms in the UNet.
BUILTIN_VERSION = 2
VERSION_FILE = "simpletuner_builtin.json"
TOKEN_LENGTH = 77
T5_TOKEN_LENGTH = 32  # short T5 context keeps the tiny flow models fast
_BETAS = {"num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012,
          "beta_schedule": "scaled_linear"}


class UnknownBuiltinError(ModelFolderError):
    pass


def cache_root() -> Path:
    """$SIMPLETUNER_CACHE, else the user's cache directory (XDG) / simpletuner."""
    configured = os.environ.get("SIMPLETUNER_CACHE")
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "simpletuner"


def _tokenizer_and_text_config(staging: Path, subfolder: str):
    from transformers import CLIPTextConfig, CLIPTokenizer

    ids = write_tiny_tokenizer_files(staging / subfolder, TOKEN_LENGTH)
    tokenizer = CLIPTokenizer.from_pretrained(staging / subfolder)
    config = CLIPTextConfig(hidden_size=32, intermediate_size=37, num_attention_heads=4,
                            num_hidden_layers=2, max_position_embeddings=TOKEN_LENGTH,
                            projection_dim=32, hidden_act="gelu", layer_norm_eps=1e-5, **ids)
    return tokenizer, config


def _tiny_vae(scaling_factor: float, **overrides):
    """The (untrained) base of the flow models' VAEs."""
    from diffusers import AutoencoderKL

    # Four blocks give the real 8x downsampling, so buckets and latents keep real proportions.
    settings = dict(latent_channels=4, scaling_factor=scaling_factor) | overrides
    return AutoencoderKL(in_channels=3, out_channels=3, layers_per_block=1,
                         block_out_channels=(8, 16, 32, 32), norm_num_groups=8, sample_size=64,
                         down_block_types=("DownEncoderBlock2D",) * 4,
                         up_block_types=("UpDecoderBlock2D",) * 4, **settings)


def _flow_vae(scaling_factor: float, shift_factor: float):
    """Like the SD3 and Flux VAEs: 16 latent channels, shifted and scaled, no quant convs."""
    return _tiny_vae(scaling_factor, latent_channels=16, shift_factor=shift_factor,
                     use_quant_conv=False, use_post_quant_conv=False)


def _tiny_t5(staging: Path, subfolder: str, width: int):
    from transformers import T5Config, T5EncoderModel, T5Tokenizer

    ids = write_tiny_t5_tokenizer(staging / subfolder, T5_TOKEN_LENGTH)
    config = T5Config(d_model=width, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                      relative_attention_num_buckets=8, dropout_rate=0.0, **ids)
    return T5Tokenizer.from_pretrained(staging / subfolder), T5EncoderModel(config)


def _tiny_unet(**overrides):
    from diffusers import UNet2DConditionModel

    # One norm group: with 32 channels the default 32 groups normalise each channel alone,
    # erasing the per-channel offsets (a latent's background colour) it must predict.
    return UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, norm_num_groups=1,
        block_out_channels=(32, 64), down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), **overrides)


def _build_sd(staging: Path, *, v_prediction: bool):
    from diffusers import DDIMScheduler, PNDMScheduler, StableDiffusionPipeline
    from transformers import CLIPTextModel

    tokenizer, text_config = _tokenizer_and_text_config(staging, "tokenizer")
    if v_prediction:  # like stable-diffusion-2-1: DDIM, v-prediction, linear attention projection
        unet = _tiny_unet(cross_attention_dim=32, attention_head_dim=(2, 4),
                          use_linear_projection=True)
        scheduler = DDIMScheduler(**_BETAS, prediction_type="v_prediction", clip_sample=False,
                                  set_alpha_to_one=False, steps_offset=1)
    else:  # like stable-diffusion-v1-5
        unet = _tiny_unet(cross_attention_dim=32)
        scheduler = PNDMScheduler(**_BETAS, skip_prk_steps=True, set_alpha_to_one=False,
                                  steps_offset=1)
    return StableDiffusionPipeline(
        vae=pretrained_tiny_vae(), text_encoder=CLIPTextModel(text_config), tokenizer=tokenizer,
        unet=unet, scheduler=scheduler, safety_checker=None, feature_extractor=None,
        requires_safety_checker=False)


def _build_sdxl(staging: Path):
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    tokenizer, text_config = _tokenizer_and_text_config(staging, "tokenizer")
    tokenizer_2, text_config_2 = _tokenizer_and_text_config(staging, "tokenizer_2")
    time_embed_dim = 8
    unet = _tiny_unet(
        cross_attention_dim=text_config.hidden_size + text_config_2.hidden_size,
        attention_head_dim=(2, 4), use_linear_projection=True,
        addition_embed_type="text_time", addition_time_embed_dim=time_embed_dim,
        # six micro-conditioning numbers, each embedded, plus the pooled text embedding
        projection_class_embeddings_input_dim=6 * time_embed_dim + text_config_2.projection_dim)
    scheduler = EulerDiscreteScheduler(**_BETAS, timestep_spacing="leading", steps_offset=1)
    return StableDiffusionXLPipeline(
        vae=pretrained_tiny_vae(), text_encoder=CLIPTextModel(text_config),
        text_encoder_2=CLIPTextModelWithProjection(text_config_2), tokenizer=tokenizer,
        tokenizer_2=tokenizer_2, unet=unet, scheduler=scheduler, add_watermarker=False)


def _build_sd3(staging: Path):
    from diffusers import (
        FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline)
    from transformers import CLIPTextModelWithProjection

    tokenizer, text_config = _tokenizer_and_text_config(staging, "tokenizer")
    tokenizer_2, text_config_2 = _tokenizer_and_text_config(staging, "tokenizer_2")
    # T5 as wide as both CLIP hidden states side by side, as in SD3 (the pipeline pads to it).
    t5_width = text_config.hidden_size + text_config_2.hidden_size
    tokenizer_3, text_encoder_3 = _tiny_t5(staging, "tokenizer_3", t5_width)
    transformer = SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=16, out_channels=16, num_layers=2,
        attention_head_dim=8, num_attention_heads=4, caption_projection_dim=32,
        joint_attention_dim=t5_width, pos_embed_max_size=32,
        pooled_projection_dim=text_config.projection_dim + text_config_2.projection_dim)
    return StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=_flow_vae(1.5305, 0.0609), text_encoder=CLIPTextModelWithProjection(text_config),
        tokenizer=tokenizer, text_encoder_2=CLIPTextModelWithProjection(text_config_2),
        tokenizer_2=tokenizer_2, text_encoder_3=text_encoder_3, tokenizer_3=tokenizer_3)


def _build_flux(staging: Path):
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel

    tokenizer, text_config = _tokenizer_and_text_config(staging, "tokenizer")
    tokenizer_2, text_encoder_2 = _tiny_t5(staging, "tokenizer_2", 32)
    # Like FLUX.1-dev: guidance-distilled, resolution-dependent shift.
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=text_encoder_2.config.d_model,
        pooled_projection_dim=text_config.hidden_size, guidance_embeds=True,
        axes_dims_rope=(4, 6, 6))
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
        base_image_seq_len=256, max_image_seq_len=4096)
    return FluxPipeline(
        transformer=transformer, scheduler=scheduler, vae=_flow_vae(0.3611, 0.1159),
        text_encoder=CLIPTextModel(text_config), tokenizer=tokenizer,
        text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2)


BUILTIN_RECIPES: dict[str, Callable[[Path], object]] = {
    "tiny-sd1x": lambda staging: _build_sd(staging, v_prediction=False),
    "tiny-sd2x": lambda staging: _build_sd(staging, v_prediction=True),
    "tiny-sdxl": _build_sdxl,
    "tiny-sd3": _build_sd3,
    "tiny-flux": _build_flux,
}


def _unknown(name: str) -> UnknownBuiltinError:
    return UnknownBuiltinError(f"unknown built-in model '{BUILTIN_PREFIX}{name}'; known: "
                               f"{known_builtins()}")


def _is_current(folder: Path) -> bool:
    """A complete build made by this version of the recipes."""
    try:
        marker = json.loads((folder / VERSION_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (folder / "model_index.json").is_file() and marker.get("version") == BUILTIN_VERSION


def _check_weights_written(staging: Path) -> None:
    """Every model component got its weights. transformers writes them only from rank 0 once a
    process group exists, so a build on another rank must never be installed."""
    empty = [p.parent.name for p in staging.glob("*/config.json")
             if not any(p.parent.glob("*.safetensors"))]
    if empty:
        raise ModelFolderError(
            f"building {staging.name} wrote no weights for {', '.join(sorted(empty))}; build "
            "built-in models from the main process (`python -m simpletuner builtin NAME`)")


def _install(staging: Path, final: Path) -> None:
    """Rename the finished build into place. When several processes build at once the first
    rename wins and the others keep the winner; an outdated build found there is moved aside
    (by whichever process gets to it) and replaced."""
    for _ in range(2):
        try:
            os.rename(staging, final)
            return
        except OSError:
            if _is_current(final):
                return
        outdated = final.with_name(f".{final.name}-outdated-{os.getpid()}")
        try:
            os.rename(final, outdated)
        except FileNotFoundError:
            pass  # another process moved it first
        shutil.rmtree(outdated, ignore_errors=True)
    raise ModelFolderError(f"cannot replace {final} with a new built-in model; delete it and retry")


def ensure_builtin_model(name: str) -> Path:
    """The folder of built-in model ``name`` (e.g. "tiny-sd1x"), building it on first use or
    when the cached build is from an older recipe version.

    Built in a private temporary folder next to the target and renamed into place, so readers
    never see a partial model."""
    recipe = BUILTIN_RECIPES.get(name)
    if recipe is None:
        raise _unknown(name)
    root = cache_root() / "builtin"
    final = root / name
    if _is_current(final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    staging = staging_folder(root, f".{name}-")  # others sharing the cache can read it
    try:
        # A private RNG stream: the same weights every time, the caller's RNG state untouched.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(BUILD_SEED)
            pipeline = recipe(staging)
        pipeline.save_pretrained(staging, safe_serialization=True)
        give_umask_modes(staging)
        _check_weights_written(staging)
        (staging / VERSION_FILE).write_text(
            json.dumps({"builtin": name, "version": BUILTIN_VERSION}) + "\n", encoding="utf-8")
        _install(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def resolve_model_path(name_or_path: str) -> Path:
    """Map ``builtin:NAME`` to its built folder, or check that a local folder exists."""
    if name_or_path.startswith(BUILTIN_PREFIX):
        return ensure_builtin_model(name_or_path[len(BUILTIN_PREFIX):])
    problem = model_path_problem(name_or_path)
    if problem:
        raise ModelFolderError(problem)
    return Path(name_or_path).expanduser().resolve()


def run_builtin_command(name: str) -> int:
    """`python -m simpletuner builtin NAME`: build if needed, print the folder last."""
    name = name.removeprefix(BUILTIN_PREFIX)
    if name not in BUILTIN_RECIPES:
        print(_unknown(name), file=sys.stderr)
        return 2
    print(ensure_builtin_model(name))
    return 0
