"""The model as a run trains it: loaded, cast and quantized on the CPU, the frozen parts under
group offload's hooks when asked, placed on the device (block swap's host blocks and
group-offloaded parts left behind), the adapter added with the run's seed, init_lora, the
assistant LoRA."""

from __future__ import annotations

import torch

from simpletuner.common.together import failing_together
from simpletuner.helpers.metadata.permutation import stable_seed
from simpletuner.models.base import LossSettings
from simpletuner.training.adapters.assistant import add_assistant, wants_assistant
from simpletuner.models.controlnet import adapter_class_for
from simpletuner.training.adapters.by_type import add_adapter
from simpletuner.training.adapters.lora_init import init_adapter
from simpletuner.training.compilation import compile_repeated_blocks
from simpletuner.training.memory.block_swap import place_network
from simpletuner.training.memory.group_offload import offload_frozen_components
from simpletuner.training.memory.quantization import quantize_frozen_weights


def load_trained_model(training, settings, *, model_folder, resume_from, seed: int, device,
                       weight_dtype, rank: int):
    """(adapter, block swap) on every rank; ``settings`` is the run's RunSettings. The device
    never holds an fp32 copy, and a rank that cannot load the model stops every rank before
    the caches' collectives."""
    with failing_together("loading the model"):
        adapter = adapter_class_for(training).load(
            model_folder, device=torch.device("cpu"), weight_dtype=weight_dtype,
            loss_settings=LossSettings.from_config(training))
        if training.controlnet:  # its new layers' random start from the run's seed too
            with torch.random.fork_rng():
                torch.manual_seed(stable_seed("controlnet init", seed) & (2**63 - 1))
                adapter.add_controlnet(training.controlnet_model_name_or_path)
        quantize_frozen_weights(adapter, settings.precision, weight_dtype)
        offload_frozen_components(adapter, settings.group_offload, device, rank)
        block_swap = place_network(adapter, settings.block_swap, device)
        if training.model_type == "lora":  # checkpoints hold the adapter only
            # A's random start comes from the run's seed: the same adapter under DDP and FSDP2.
            with torch.random.fork_rng():  # manual_seed seeds CUDA too; both restored after
                torch.manual_seed(stable_seed("lora init", seed) & (2**63 - 1))
                add_adapter(adapter.trainable, type(adapter), training)
        if training.init_lora is not None and resume_from is None:
            init_adapter(adapter, training.init_lora)
        if training.model_type == "lora" and wants_assistant(training):
            add_assistant(adapter, training)  # after init_lora, which activates its own alone
        adapter.set_gradient_checkpointing(training.gradient_checkpointing,
                                         training.gradient_checkpointing_interval)
        compile_repeated_blocks(adapter, training.dynamo_backend)
        if training.tread_config is not None:
            adapter.route_tokens(training.tread_config)
    return adapter, block_swap
