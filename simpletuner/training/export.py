"""The end of a run: the trained weights (EMA when enabled) as a diffusers pipeline, or for
LoRA as the adapter file `load_lora_weights` reads; then training_summary.json (always valid
JSON) and the model card. Every rank calls it: under FSDP2 the weights are gathered first, and
the main rank's writes fail together."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from simpletuner.common.atomic import atomic_write_text
from simpletuner.common.together import failing_together
from simpletuner.models.group_offload import saved_weights_in_place
from simpletuner.models.pipelines import export_pipeline
from simpletuner.training.adapters.by_type import export_adapter
from simpletuner.training.reporting.model_card import write_model_card
from simpletuner.training.memory.sharding import network_on_main

logger = logging.getLogger(__name__)


def export_run(configuration, accelerator, adapter, network, prepared_network, ema, *,
               step: int, seed: int, final_loss: float | None) -> Path | None:
    """Returns the pipeline folder (None for LoRA, and on ranks other than the main one)."""
    training = configuration.training
    output_dir, lora = Path(training.output_dir), training.model_type == "lora"
    if ema is not None:
        ema.copy_to(network)
    unwrapped = network_on_main(accelerator, prepared_network)  # gathered under FSDP2
    pipeline_dir = None
    with failing_together("the export"):  # main rank only; the barrier on the way out
        if accelerator.is_main_process:
            if lora:
                exported = export_adapter(type(adapter), unwrapped, output_dir, training)
            else:
                frozen = [adapter.vae, *adapter.text_encoders]
                with saved_weights_in_place(frozen):  # group offload to disk: placeholders
                    exported = pipeline_dir = export_pipeline(adapter.build_pipeline(unwrapped),
                                                              output_dir)
            # allow_nan=False: NaN is not JSON; final_loss is finite or None by construction.
            summary = {"steps": step, "seed": seed, "final_loss": final_loss,
                       "processes": accelerator.num_processes,
                       "lora" if lora else "pipeline": str(exported)}
            atomic_write_text(output_dir / "training_summary.json",
                              json.dumps(summary, indent=1, sort_keys=True, allow_nan=False) + "\n")
            write_model_card(pipeline_dir or Path(exported).parent, training, summary,
                             [d.id for d in configuration.datasets], adapter.folder)
            logger.info("done: %d steps, final loss %s, seed %d; exported the trained %s to %s",
                        step, "n/a" if final_loss is None else f"{final_loss:.4f}", seed,
                        "LoRA" if lora else "pipeline", exported)
    return pipeline_dir
