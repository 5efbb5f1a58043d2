"""The 4-channel VAE of the built-in tiny SD 1.x/2.x/SDXL models, pretrained briefly at build
time as an autoencoder on generated coloured-shape images, once per cache folder (its parts/
keeps the result for the builds of other processes).

A randomly initialised VAE does not decode what it encodes, so a diffusion model trained on its
latents can only ever show noise. A few hundred AdamW steps on shapes like the demo's make it a
(blurry) autoencoder; its scaling_factor is then measured so latents have unit std, as the
diffusion noise schedule assumes. Everything here is deterministic: private seeds, one thread.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from functools import cache
from importlib.metadata import version
from pathlib import Path

import torch
from PIL import Image, ImageDraw

from simpletuner.common.atomic import atomic_write_with
from simpletuner.models.model_path import cache_root

VAE_SEED = 1
DATA_SEED = 2
SCALE_SEED = 3
TRAIN_IMAGES = 1024
TRAIN_SIZE = 32      # the VAE is convolutional: 32 px teaches it at a quarter of 64 px's cost
SCALE_SIZE = 64      # the demo's resolution, to measure the latent std
STEPS = 300
BATCH_SIZE = 8
LEARNING_RATE = 3e-3
WARMUP_STEPS = 20
KL_WEIGHT = 1e-6     # keeps the latents near unit scale without blurring reconstructions
SHAPES = ("circle", "square", "triangle", "star")


def tiny_sd_vae_config(scaling_factor: float = 1.0) -> dict:
    """AutoencoderKL arguments. Four blocks give the real 8x downsampling; 32 channels at full
    resolution, no extra encoder resnets and one norm group are what let it learn in seconds
    (per-channel norms would erase the absolute colours it must reproduce)."""
    return dict(in_channels=3, out_channels=3, latent_channels=4, layers_per_block=0,
                block_out_channels=(32, 32, 32, 32), norm_num_groups=1, sample_size=64,
                down_block_types=("DownEncoderBlock2D",) * 4,
                up_block_types=("UpDecoderBlock2D",) * 4, scaling_factor=scaling_factor)


def shape_images(count: int, size: int, seed: int) -> torch.Tensor:
    """``count`` images (N, 3, size, size) in [-1, 1]: one shape of a random colour, size and
    position (partly outside the frame too) on a plain background of another random colour."""
    rng = random.Random(seed)
    return torch.stack([_shape_image(rng, size) for _ in range(count)])


def _shape_image(rng: random.Random, size: int) -> torch.Tensor:
    supersample = 2  # smooth edges, like the demo images
    big = size * supersample
    background, fill = (tuple(int(rng.random() * 256) for _ in range(3)) for _ in range(2))
    canvas = Image.new("RGB", (big, big), background)
    draw = ImageDraw.Draw(canvas)
    radius = (0.2 + 0.4 * rng.random()) * big
    cx, cy = rng.random() * big, rng.random() * big
    shape = SHAPES[int(rng.random() * len(SHAPES))]
    if shape == "circle":
        draw.ellipse((cx - radius, cy - radius, cx + radius, cy + radius), fill=fill)
    elif shape == "square":
        half = radius * 0.85
        draw.rectangle((cx - half, cy - half, cx + half, cy + half), fill=fill)
    else:
        corners, inner = (3, None) if shape == "triangle" else (5, 0.5)
        draw.polygon(_star_points(cx, cy, radius, corners, inner), fill=fill)
    small = canvas.resize((size, size), Image.Resampling.BILINEAR)
    pixels = torch.frombuffer(bytearray(small.tobytes()), dtype=torch.uint8)
    return pixels.view(size, size, 3).permute(2, 0, 1).float() / 127.5 - 1


def _star_points(cx: float, cy: float, radius: float, corners: int,
                 inner: float | None) -> list[tuple[float, float]]:
    """An upright regular polygon, or a star when ``inner`` (radius ratio) is set."""
    steps = corners * 2 if inner else corners
    points = []
    for k in range(steps):
        r = radius * inner if inner and k % 2 else radius
        angle = -math.pi / 2 + 2 * math.pi * k / steps
        points.append((cx + r * math.cos(angle), cy + r * math.sin(angle)))
    return points


def _init_for_fast_training(vae: torch.nn.Module) -> None:
    """Each residual branch and attention output starts at zero, so the untrained network is a
    shallow conv stack (quick to train, like zero-gamma ResNet init); the other layers get
    variance-preserving weights (PyTorch's default shrinks each layer's output by sqrt(3))."""
    from diffusers.models.attention_processor import Attention
    from diffusers.models.resnet import ResnetBlock2D

    with torch.no_grad():
        for module in vae.modules():
            if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
                module.weight.mul_(math.sqrt(3))
        for module in vae.modules():
            if isinstance(module, ResnetBlock2D):
                module.conv2.weight.zero_()
                module.conv2.bias.zero_()
            elif isinstance(module, Attention):
                module.to_out[0].weight.zero_()
                module.to_out[0].bias.zero_()


@cache  # deterministic and costly: SD 1.x, 2.x and SDXL builds in one process train it once
def _pretrained_state() -> tuple[dict[str, torch.Tensor], float]:
    """The trained weights and scaling_factor, kept beside the built-in models (their cache
    folder's parts/) so that builds in other processes load them instead of training again;
    the file's name carries everything that decides them."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = _state_file()
    if path.is_file():
        with safe_open(str(path), framework="pt") as handle:
            state = {key: handle.get_tensor(key) for key in handle.keys()}
            return state, float(handle.metadata()["scaling_factor"])
    state, scaling_factor = _trained_state()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_with(path, lambda temporary: save_file(
        state, temporary, metadata={"scaling_factor": repr(scaling_factor)}))
    return state, scaling_factor


def _state_file() -> Path:
    settings = [VAE_SEED, DATA_SEED, SCALE_SEED, TRAIN_IMAGES, TRAIN_SIZE, SCALE_SIZE, STEPS,
                BATCH_SIZE, LEARNING_RATE, WARMUP_STEPS, KL_WEIGHT, SHAPES,
                tiny_sd_vae_config(), [version(name) for name in ("torch", "diffusers")]]
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / "parts" / f"tiny-sd-vae-{digest}.safetensors"


def _trained_state() -> tuple[dict[str, torch.Tensor], float]:
    from diffusers import AutoencoderKL
    from tqdm.auto import tqdm

    threads = torch.get_num_threads()
    # One thread: the same bits on every machine (reduction order depends on the thread
    # count), and tiny convolutions gain nothing from more; busy cores only slow them down.
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(VAE_SEED)
            vae = AutoencoderKL(**tiny_sd_vae_config())
        _init_for_fast_training(vae)
        images = shape_images(TRAIN_IMAGES, TRAIN_SIZE, DATA_SEED)
        generator = torch.Generator().manual_seed(DATA_SEED)
        optimizer = torch.optim.AdamW(vae.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(
            1.0, (step + 1) / WARMUP_STEPS) * 0.5 * (1 + math.cos(math.pi * step / STEPS)))
        vae.train()
        for _ in tqdm(range(STEPS), desc="pretraining the tiny VAE", leave=False):
            batch = images[torch.randint(len(images), (BATCH_SIZE,), generator=generator)]
            posterior = vae.encode(batch).latent_dist
            # Reconstruct from the mode, the latent the trainer caches; the KL term keeps its
            # scale in check.
            reconstruction = vae.decode(posterior.mode()).sample
            loss = (torch.nn.functional.mse_loss(reconstruction, batch)
                    + KL_WEIGHT * posterior.kl().mean())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
        vae.eval()
        with torch.no_grad():
            latents = vae.encode(shape_images(32, SCALE_SIZE, SCALE_SEED)).latent_dist.mode()
        scaling_factor = round(1.0 / latents.std().item(), 5)
    finally:
        torch.set_num_threads(threads)
    return {k: v.detach().clone() for k, v in vae.state_dict().items()}, scaling_factor


def pretrained_tiny_vae():
    """A new AutoencoderKL with the pretrained weights and the measured scaling_factor; the
    caller's RNG state is left alone."""
    from diffusers import AutoencoderKL

    state, scaling_factor = _pretrained_state()
    with torch.random.fork_rng(devices=[]):
        vae = AutoencoderKL(**tiny_sd_vae_config(scaling_factor))
    vae.load_state_dict(state)
    return vae
