"""PixArt Sigma (PixArt-alpha): a T5 text encoder and a DiT that predicts DDPM noise (and its
variance, which is not trained)."""

from simpletuner.families.spec import NOISE, FamilySpec
from simpletuner.training.adapters.lora_layouts import TRANSFORMER

SPEC = FamilySpec(
    name="pixart_sigma", objective=NOISE,
    adapter="simpletuner.families.pixart_sigma.adapter.PixArtSigmaAdapter",
    pipeline_prefixes=(("PixArtSigma", "pixart_sigma"),),
    comfyui_layout=TRANSFORMER,
    tiny_models={"tiny-pixart_sigma": "simpletuner.families.pixart_sigma.tiny.build_pixart_sigma"},
    guidance_rescale=False,
    simpletuner_names=("pixart",),  # SimpleTuner 4.10's name (earlier releases': pixart_sigma)
    simpletuner_keys={key: "remove it; validation runs PixArtSigmaPipeline on the trained "
                           "model alone, in one stage" for key in (
        "pixart_validation_pipeline_mode", "pixart_validation_stage1_model",
        "pixart_validation_stage2_model")})
