"""The one interface every model family implements; the trainer and caches only see this."""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager

import torch
from diffusers import AutoencoderKL

from simpletuner.families import family_spec, load_object
from simpletuner.models.checkpointing import EveryNthBlock
from simpletuner.models.token_routing import TokenLayout, TokenRouter, resolve_routes
from simpletuner.models.group_offload import is_group_offloaded
from simpletuner.models.layout import check_model_folder
from simpletuner.helpers.multiaspect.clip_audio import AudioRequest
from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.transfer import to_device_except


# A caption of typical length (about 40 tokens): the memory plan's prompts.
PLANNED_CAPTION = ("a photograph of a red fox sitting on a mossy log in a misty pine forest at "
                   "dawn, soft golden light through the trees, shallow depth of field")


@dataclass
class LossSettings:
    """Objective options from config.json that every family honours where they apply."""

    snr_gamma: float | None = None          # DDPM families only
    noise_offset: float = 0.0
    loss_type: str = "l2"                   # l2, huber, smooth_l1: see loss_types.py
    huber_schedule: str = "snr"
    huber_c: float = 0.1
    # Flow-matching families (sd3, flux): where noise levels are drawn, see flow_objective.py.
    flow_timestep_sampling: str = "logit_normal"
    flow_logit_mean: float = 0.0
    flow_logit_std: float = 1.0
    flow_shift: float | None = None         # None: the model scheduler's own shift; 0: none
    flow_schedule_auto_shift: bool = False  # resolution-dependent shift, as SimpleTuner's
    flux_guidance_value: float = 1.0        # guidance input of guidance-distilled Flux models
    model_flavour: str | None = None        # Wan 2.2 A14B: which expert's noise range trains

    @classmethod
    def from_config(cls, training) -> "LossSettings":
        """The fields of this class read from a TrainingConfig (same names)."""
        return cls(**{name: getattr(training, name) for name in cls.__dataclass_fields__})


class ModelAdapter(ABC):
    """A model family: loads its components from a local folder and knows its objective."""

    family: str
    # Subfolders that mark another family (SDXL's text_encoder_2/ for sd1x, unet/ for sd3...).
    forbidden_subfolders: tuple[str, ...] = ()
    pipeline_class: type          # what build_pipeline returns; its save_lora_weights too
    # The trainable network's pipeline component and subfolder: unet, transformer.
    trainable_component: str
    lora_target_modules: tuple[str, ...]  # default LoRA targets (module name suffixes)
    # (text encoder subfolder, tokenizer subfolder, encoder class, tokenizer class), in the
    # pipeline's order; the subfolder names are also the pipeline's component names.
    text_encoder_specs: tuple[tuple[str, str, type, type], ...]
    vae_class: type = AutoencoderKL  # the vae/ subfolder's class
    # Some parameters get no gradient in a step (DDP then needs find_unused_parameters).
    ddp_find_unused_parameters: bool = False
    # A video family: the frames its pipeline makes by default (validation writes clips of
    # validation_num_video_frames, else these); None: an image family (validation images).
    default_validation_frames: int | None = None
    default_validation_framerate: int = 16  # a video family's clips: frames per second
    # An image-to-video model: each validation prompt animates an input image.
    validates_from_image: bool = False
    # Trains a video.is_i2v dataset as image-to-video (elsewhere the key is refused).
    trains_image_to_video: bool = False
    # An edit model whose text encoder reads each prompt with the sample's reference images:
    # encode_prompts(prompts, references), and text entries keyed by both.
    prompts_see_references: bool = False
    # A model that trains sound: the rate and channels its audio encoder takes (each clip's
    # audio is then decoded over its trained frames and given to encode_for_cache); None here.
    audio_input: AudioRequest | None = None
    validation_sample_rate: int | None = None  # its validation clips' sound: samples a second
    # The class whose save_lora_weights writes the LoRA export and whose lora_state_dict and
    # load_lora_into_transformer read one; None: the pipeline class (its load_lora_weights).
    lora_file_class: type | None = None
    # The pipeline call's argument that takes a reference (edit) or control image.
    reference_image_argument: str = "image"
    # A ControlNet adapter's (models/controlnet.py): how control images are cached.
    encode_control: Callable[[torch.Tensor], torch.Tensor] | None = None

    def __init__(self, *, folder: Path, vae, text_encoders: list, tokenizers: list,
                 device: torch.device, loss_settings: LossSettings):
        """The parts every family has; each family adds its network and schedulers."""
        self.folder = folder
        self.vae = vae
        self.text_encoders = text_encoders
        self.tokenizers = tokenizers
        self.device = device
        self.loss_settings = loss_settings
        # Set by training/offload.py once the caches are complete: VAE and text encoders away.
        self.frozen_away = None

    def move_to(self, device: torch.device,
                except_modules: list[torch.nn.Module] | tuple = ()) -> None:
        """Move the network, the VAE and the text encoders to ``device`` (the trainer loads and
        quantizes on the CPU first, so no full-precision copy ever reaches the accelerator);
        ``except_modules`` of the network stay where they are (block swap's host blocks), and
        so do group-offloaded parts: their hooks bring them for each forward."""
        to_device_except(self.trainable, device, list(except_modules))
        for module in (self.vae, *self.text_encoders):
            if not is_group_offloaded(module):
                module.to(device)
        self.device = device

    def frozen_components_on_device(self):
        """A context in which the VAE and text encoders are on the device (validation), even
        after release_frozen_components moved them away; a no-op when they never left."""
        return nullcontext() if self.frozen_away is None else self.frozen_away.on_device()

    @classmethod
    def for_folder(cls, folder: Path) -> type["ModelAdapter"]:
        """The class for ``folder``'s layout, as the family's spec names it: a family with
        several (FLUX.2's dev and klein, told apart by model_index.json) picks one; every other
        family is one class."""
        return load_object(family_spec(cls.family).adapter_for(folder))

    @classmethod
    def flavour_problem(cls, folder: Path, flavour: str | None) -> str | None:
        """What is wrong with model_flavour ``flavour`` for ``folder``, if anything; families
        whose folder alone decides the model ignore the flavour."""
        return None

    @classmethod
    def required_subfolders(cls) -> tuple[str, ...]:
        """Subfolders a diffusers folder of this family must have; preflight checks them (and
        ``forbidden_subfolders``) in check_folder before anything loads."""
        text = tuple(name for spec in cls.text_encoder_specs for name in spec[:2])
        return (cls.trainable_component, "vae", "scheduler") + text

    @classmethod
    def check_folder(cls, folder: Path) -> None:
        """Raise ModelFolderError unless ``folder`` has this family's layout; preflight and
        loading call it before anything loads. Families add checks of their own variants."""
        check_model_folder(folder, cls.family, cls.required_subfolders(),
                           cls.forbidden_subfolders)

    @classmethod
    @abstractmethod
    def load(cls, folder: Path, *, device: torch.device, weight_dtype: torch.dtype,
             loss_settings: LossSettings) -> "ModelAdapter":
        """Load every component with from_pretrained from ``folder``; raise ModelFolderError
        naming the expected layout when the folder is not this family's. The trainable network
        stays float32 (mixed precision comes from autocast); frozen components (VAE, text
        encoders) are cast to ``weight_dtype``. Everything is moved to ``device``."""

    @property
    @abstractmethod
    def trainable(self) -> torch.nn.Module:
        """The network being fine-tuned (UNet or transformer)."""

    @property
    @abstractmethod
    def resolution_alignment(self) -> int:
        """Image sides must be multiples of this many pixels (VAE factor times the network's
        own downsampling); validation resolutions and buckets are checked against it."""

    @property
    def vae_factor(self) -> int:
        """Image pixels per latent pixel along each side."""
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    @classmethod
    def swappable_blocks(cls, network: torch.nn.Module) -> list[torch.nn.Module]:
        """The trained network's repeated blocks in the order its forward runs them, which
        block swap may keep on the host; none where blocks do not run one after another."""
        return []

    # TREAD (tread_config): where the blocks hold the image tokens; None: not supported.
    token_layout: TokenLayout | None = None
    token_router: TokenRouter | None = None

    def route_tokens(self, tread_config: dict) -> None:
        """TREAD's routes over the trained network's blocks (models/token_routing.py)."""
        if self.token_layout is None:
            raise ValueError(f"tread_config: {self.family} does not route tokens")
        blocks = self.swappable_blocks(self.trainable)
        self.token_router = TokenRouter(self.trainable, blocks,
                                        resolve_routes(tread_config, len(blocks)),
                                        self.token_layout)

    def set_gradient_checkpointing(self, enabled: bool, interval: int = 1) -> None:
        """Trade compute for memory in the trainable network's backward pass: every
        ``interval``-th block of each block list checkpointed (models/checkpointing.py)."""
        if enabled:
            self.trainable.enable_gradient_checkpointing(
                gradient_checkpointing_func=EveryNthBlock(self.trainable, interval))
        else:
            self.trainable.disable_gradient_checkpointing()

    @abstractmethod
    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] in [-1, 1] -> latents scaled (and shifted) for the trainable network."""

    def encode_for_cache(self, pixels: torch.Tensor, first_frame_condition: bool = False
                         ) -> torch.Tensor | dict[str, torch.Tensor]:
        """What the latent cache keeps of a sample: its latents; a family that conditions on
        the sample itself returns {"latent": ..., <name>: ...} (TrainingBatch.conditioning).
        ``first_frame_condition``: the dataset is ``video.is_i2v`` (read by TI2V-5B). A family
        with an ``audio_input`` also takes ``audio``: each clip's [channels, samples] or None."""
        return self.encode_images(pixels)

    @abstractmethod
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """Prompts -> named embedding tensors, batch dimension first (one row per prompt)."""

    def _token_ids(self, tokenizer, prompts: list[str], max_length: int | None = None
                   ) -> torch.Tensor:
        """[B, max_length] padded and truncated ids on the device; the tokenizer's own
        model_max_length unless ``max_length`` is given."""
        if max_length is None:
            max_length = tokenizer.model_max_length
        tokens = tokenizer(prompts, padding="max_length", max_length=max_length,
                           truncation=True, return_tensors="pt")
        return tokens.input_ids.to(self.device)

    def planned_prompt_embeds(self, count: int) -> dict[str, torch.Tensor]:
        """Embeddings shaped as the cache holds them for ``count`` typical captions, for the
        memory plan, which runs this on the meta device (where nothing is computed)."""
        return self.encode_prompts([PLANNED_CAPTION] * count)

    @abstractmethod
    def compute_loss(self, batch: TrainingBatch, generator: torch.Generator | None = None, *,
                     network: torch.nn.Module | None = None,
                     base_model: Callable[[], ContextManager] | None = None) -> torch.Tensor:
        """Sample noise and timesteps (from ``generator`` when given, so a fixed generator gives
        a fixed loss), run the network, return the scalar loss. ``network`` is what to call
        instead of ``trainable``, e.g. the module accelerate.prepare returned (DDP wrapper).
        ``base_model``: a context in which ``network`` predicts as the base model; its
        prediction is then the target (prior_preservation.py)."""

    @abstractmethod
    def build_pipeline(self, trainable: torch.nn.Module | None = None):
        """A diffusers pipeline sharing the loaded components, for validation and export;
        ``trainable`` replaces the live network (e.g. an EMA copy)."""

    def validation_arguments(self, arguments: dict) -> dict:
        """The pipeline call's keyword arguments for ValidationSettings.pipeline_arguments()
        (guidance_scale, negative_prompt...); a family whose pipeline names them differently
        translates them here."""
        return arguments

    def validation_pipeline(self, pipeline, arguments: dict):
        """The pipeline validation samples with, given its call's ``arguments``; a family
        whose pipeline holds a setting as a component (HunyuanVideo 1.5's guider, the guidance
        scale) sets it here. Unchanged by default."""
        return pipeline

    def size_arguments(self, size: int | tuple[int, int]) -> dict:
        """Pipeline call arguments a validation size (a side, or (width, height)) needs besides
        height and width; a pipeline that resizes on its own (Kontext's max_area) is told."""
        return {}

    def _pipeline_text_components(self) -> dict:
        """The text encoders and tokenizers under their pipeline component names."""
        components = {}
        for (encoder_folder, tokenizer_folder, *_), encoder, tokenizer in zip(
                self.text_encoder_specs, self.text_encoders, self.tokenizers):
            components[encoder_folder] = encoder
            components[tokenizer_folder] = tokenizer
        return components
