"""What each training component reads from config.json, built in one place (RunSettings).

A component receives its own small settings, never the whole TrainingConfig: what it depends on
is visible in its signature, and a test builds the real settings from a real TrainingConfig
(``OptimizerSettings.from_config(TrainingConfig(...))``), so a renamed option breaks it. The
fields keep the options' names (SimpleTuner's vocabulary), like models.base.LossSettings.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TypeVar

from simpletuner.configuration.validation_options import library_prompts, validation_sizes
from simpletuner.families import family_spec

Settings = TypeVar("Settings")


class _FromConfig:
    @classmethod
    def from_config(cls: type[Settings], training) -> Settings:
        """The fields of this class read from a TrainingConfig (same names)."""
        return cls(**{field.name: getattr(training, field.name) for field in fields(cls)})


@dataclass(frozen=True)
class OptimizerSettings(_FromConfig):
    optimizer: str
    optimizer_config: str | None
    learning_rate: float
    adam_beta1: float
    adam_beta2: float
    adam_weight_decay: float
    adam_epsilon: float
    mixed_precision: str        # adamw_bf16 keeps bf16 weights: it needs bf16


@dataclass(frozen=True)
class ScheduleSettings(_FromConfig):
    lr_scheduler: str
    lr_warmup_steps: int
    lr_end: float
    lr_power: float
    lr_num_cycles: int


@dataclass(frozen=True)
class _TextEncoderPrecisions(_FromConfig):
    text_encoder_1_precision: str
    text_encoder_2_precision: str
    text_encoder_3_precision: str
    text_encoder_4_precision: str

    def text_encoder_precision(self, number: int) -> str:
        return getattr(self, f"text_encoder_{number}_precision")


@dataclass(frozen=True)
class PrecisionSettings(_TextEncoderPrecisions):
    """Frozen-weight precisions: the network under a LoRA and each text encoder."""

    model_family: str
    model_type: str
    mixed_precision: str
    base_model_precision: str


@dataclass(frozen=True)
class OffloadSettings(_TextEncoderPrecisions):
    """Where the frozen parts go after caching; a freed text encoder comes back quantized."""

    frozen_components_after_caching: str


@dataclass(frozen=True)
class BlockSwapSettings(_FromConfig):
    musubi_blocks_to_swap: int     # 0: every block on the training device
    musubi_block_swap_device: str  # where the swapped blocks live


@dataclass(frozen=True)
class GroupOffloadSettings(_FromConfig):
    """The VAE and text encoders under diffusers' group-offloading hooks (SimpleTuner's keys)."""

    enable_group_offload: bool
    group_offload_type: str             # block_level or leaf_level
    group_offload_blocks_per_group: int
    group_offload_use_stream: bool      # CUDA only
    group_offload_to_disk_path: str | None
    output_dir: str                     # names the run's folder under the disk path


@dataclass(frozen=True)
class ShardingSettings(_FromConfig):
    fsdp_enable: bool
    fsdp_reshard_after_forward: bool
    fsdp_sharding: str
    fsdp_transformer_layer_cls_to_wrap: list[str] | None
    fsdp_state_dict_type: str
    mixed_precision: str
    optimizer: str              # the trainable parameters take its dtype before sharding


@dataclass(frozen=True)
class ValidationSettings(_FromConfig):
    model_family: str
    validation_prompt: str | list[str] | None
    user_prompt_library: str | None
    validation_steps: int
    validation_num_inference_steps: int
    validation_resolution: int | str | None
    validation_guidance_scale: float
    validation_guidance_rescale: float
    validation_disable_unconditional: bool
    validation_guidance_skip_layers: list[int] | None
    validation_guidance_skip_layers_start: float
    validation_guidance_skip_layers_stop: float
    validation_guidance_skip_scale: float
    validation_num_video_frames: int | None
    validation_framerate: int | None
    validation_using_datasets: bool
    validation_seed: int
    num_validation_images: int
    validation_negative_prompt: str | None
    validation_on_startup: bool
    validation_disable: bool
    eval_dataset_id: str | None   # edit models: the pairs whose references validation edits
    num_eval_images: int
    output_dir: str
    library: tuple[str, ...] = ()   # user_prompt_library's prompts, read once

    @classmethod
    def from_config(cls, training) -> "ValidationSettings":
        values = {f.name: getattr(training, f.name) for f in fields(cls) if f.name != "library"}
        path = training.user_prompt_library
        return cls(**values, library=tuple(library_prompts(path)) if path else ())

    @property
    def prompts(self) -> list[str]:
        if self.validation_disable:
            return []
        prompt = self.validation_prompt
        given = [] if prompt is None else [prompt] if isinstance(prompt, str) else list(prompt)
        return given + list(self.library)

    @property
    def enabled(self) -> bool:
        """Whether there is anything to validate: prompts, or edit pairs (eval_dataset_id)."""
        return not self.validation_disable and bool(self.prompts or self.eval_dataset_id)

    @property
    def sizes(self) -> list[tuple[int, int]]:
        """(width, height) of each validation size; the loader filled in the default."""
        return validation_sizes(self.validation_resolution)

    def pipeline_arguments(self) -> dict:
        """Keyword arguments of the family's pipeline call besides prompt, size and steps."""
        # the scale that turns classifier-free guidance off; None: the pipeline has none
        off = family_spec(self.model_family).guidance_scale_without_cfg
        cfg_off = self.validation_disable_unconditional and off is not None
        arguments = {"guidance_scale": off if cfg_off else self.validation_guidance_scale}
        if self.validation_negative_prompt is not None:
            arguments["negative_prompt"] = self.validation_negative_prompt
        if self.validation_guidance_rescale:
            arguments["guidance_rescale"] = self.validation_guidance_rescale
        if self.validation_guidance_skip_layers:
            arguments.update(skip_guidance_layers=list(self.validation_guidance_skip_layers),
                             skip_layer_guidance_scale=self.validation_guidance_skip_scale,
                             skip_layer_guidance_start=self.validation_guidance_skip_layers_start,
                             skip_layer_guidance_stop=self.validation_guidance_skip_layers_stop)
        return arguments


@dataclass(frozen=True)
class EvaluationSettings(_FromConfig):
    eval_steps_interval: int


@dataclass(frozen=True)
class RunSettings:
    optimizer: OptimizerSettings
    schedule: ScheduleSettings
    precision: PrecisionSettings
    offload: OffloadSettings
    block_swap: BlockSwapSettings
    group_offload: GroupOffloadSettings
    sharding: ShardingSettings
    validation: ValidationSettings
    evaluation: EvaluationSettings

    @classmethod
    def from_config(cls, training) -> "RunSettings":
        return cls(optimizer=OptimizerSettings.from_config(training),
                   schedule=ScheduleSettings.from_config(training),
                   precision=PrecisionSettings.from_config(training),
                   offload=OffloadSettings.from_config(training),
                   block_swap=BlockSwapSettings.from_config(training),
                   group_offload=GroupOffloadSettings.from_config(training),
                   sharding=ShardingSettings.from_config(training),
                   validation=ValidationSettings.from_config(training),
                   evaluation=EvaluationSettings.from_config(training))
