"""What a model family is, as plain data: `simpletuner/families/<name>/spec.py` holds one
FamilySpec. Torch-free, so configuration checks, `check`, `plan` and `options` read it without
loading a model; adapters and tiny recipes are named by dotted path and imported only when a
run (or a build) asks for them, so a family's flavour is picked before anything is imported."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from simpletuner.families.frame_rule import FrameRule
from simpletuner.models.model_index import pipeline_class_name
from simpletuner.training.adapters.lora_layouts import Layout

NOISE, FLOW = "noise", "flow"  # the objectives: DDPM noise prediction (the UNets), flow matching


@dataclass(frozen=True)
class FamilySpec:
    name: str                   # the model_family value, and the folder's name
    objective: str              # NOISE or FLOW
    adapter: str                # "module.Class" of the ModelAdapter for the family's usual folder
    # model_index.json _class_name prefixes that mark this family's folders, each with what a
    # folder with one is called when it is not the configured family ("sd1x or sd2x").
    pipeline_prefixes: tuple[tuple[str, str], ...]
    comfyui_layout: Layout      # lora_format 'comfyui''s key layout (lora_layouts.py)
    # builtin:<name> -> "module.function" building it into a staging folder (its pipeline)
    tiny_models: Mapping[str, str] = field(default_factory=dict)
    # Other layouts of the family: folder_variant(folder) -> "module.Class" of their adapter.
    variant_adapters: Mapping[str, str] = field(default_factory=dict)
    folder_variant: Callable[[Path], str | None] = pipeline_class_name
    # Why a local folder is a variant of the family that is not supported; None: it is.
    folder_problem: Callable[[str], str | None] | None = None
    frame_rule: FrameRule | None = None  # a video family: the frame counts its VAE encodes
    trains_sound: bool = False  # a video family that trains each clip's audio too (LTX-2)
    # model_flavour -> the reference images per sample it trains on at most (None: any), for
    # the flavours that train on edit pairs (conditioning_data).
    reference_flavours: Mapping[str, int | None] = field(default_factory=dict)
    # "module.Class" of the adapter that trains a ControlNet beside the frozen network
    # (controlnet: true); None: the family has no ControlNet training.
    controlnet_adapter: str | None = None
    # Its edit flavours' pipelines edit a reference and cannot generate from a prompt alone.
    edits_need_references: bool = False
    guidance_input: bool = False         # a guidance-distilled input (flux_guidance_value)
    guidance_rescale: bool = False       # validation_guidance_rescale
    skip_layer_guidance: bool = False    # validation_guidance_skip_layers
    # validation_disable_unconditional: the guidance_scale that turns classifier-free guidance
    # off; None where the pipeline has no unconditional pass to turn off.
    guidance_scale_without_cfg: float | None = 1.0
    # config.json keys the family's pipeline has no use for -> why, as the refusal says it.
    refused_options: Mapping[str, str] = field(default_factory=dict)
    # What is wrong with flux_lora_target 'all' for this family, if anything.
    lora_target_all_problem: str | None = None
    # SimpleTuner's flux_lora_target names -> the module name suffixes each adapts (the
    # lora_target_modules they stand for); empty: only 'all', the family's default, is read.
    lora_target_presets: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # model_flavour -> the assistant LoRA SimpleTuner loads for it when assistant_lora_path is
    # unset (a Hub id and file: nothing is downloaded here, so check warns and names it).
    default_assistants: Mapping[str, str] = field(default_factory=dict)
    # SimpleTuner's other model_family names for this family, read as its name.
    simpletuner_names: tuple[str, ...] = ()
    # SimpleTuner's config.json options of this family alone that have no field here -> what
    # to do instead; refused unless their value asks for nothing (simpletuner_keys/).
    simpletuner_keys: Mapping[str, str] = field(default_factory=dict)
    # The trained network's config.json keys that add up to its adapter's swappable_blocks
    # (a key twice where two block lists have its length), so check refuses a
    # musubi_blocks_to_swap beyond them before loading; empty: the run's own check decides.
    swappable_block_keys: tuple[str, ...] = ()
    # The trained network's config.json key of its attention heads, for a transformer whose
    # diffusers class has a context-parallel plan (_cp_plan): context_parallel_size shards its
    # sequence (training/parallel/sequence.py), and check refuses one that does not divide the
    # heads; None: context_parallel_size is refused for the family.
    attention_heads_key: str | None = None
    # tread_config: its adapter routes image tokens around blocks (its token_layout).
    token_routing: bool = False

    @property
    def trains_unet(self) -> bool:
        """The noise-prediction families here are the UNet ones: no transformer blocks."""
        return self.objective == NOISE

    def adapter_for(self, folder: Path) -> str:
        """The "module.Class" of the adapter for ``folder``'s layout."""
        return self.variant_adapters.get(self.folder_variant(Path(folder)), self.adapter)
