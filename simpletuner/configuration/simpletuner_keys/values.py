"""SimpleTuner's names and values for options that exist here: aliases of the same meaning,
values that mean "not set", values not supported, and options whose meaning differs."""

from __future__ import annotations

from simpletuner.configuration.families import FAMILY_ALIASES, MODEL_FAMILIES

_SUPPORTED_OPTIMIZERS = "use one of adamw, adamw_bf16, ao-adamw8bit, bnb-adamw8bit, prodigy, " \
                        "adafactor, lion"
_OTHER_PRECISIONS = ("int2-quanto int8dq-torchao int8dq-int4-torchao int4-torchao fp8-quanto "
                     "fp8uz-quanto fp8-native fp8wo-torchao fp8-int4-torchao "
                     "fp8-transformerengine int8-sdnq uint8-sdnq int16-sdnq uint16-sdnq "
                     "fp16-sdnq fp8-sdnq int6-sdnq int5-sdnq uint5-sdnq uint4-sdnq uint3-sdnq "
                     "uint2-sdnq")
_OTHER_FAMILIES = ("ace_step anima auraflow boogu_image chroma cosmos cosmos2image cosmos3 "
                   "deepfloyd ernie flux2 flux3_image heartmula hidream hunyuanvideo ideogram "
                   "infinitetalk kandinsky5_image kandinsky5_video kolors krea2 longcat_image "
                   "longcat_video ltxvideo ltxvideo2 lumina2 mageflow minimaxh3 minimaxmusic "
                   "moss_image omnigen pixart pixart_sigma qwen_image sana sanavideo smoldit "
                   "stable_cascade wan wan_s2v z_image z_image_omni zlab_i1")
_OTHER_FAMILIES = " ".join(f for f in _OTHER_FAMILIES.split()
                           if f not in MODEL_FAMILIES and f not in FAMILY_ALIASES)
_OTHER_OPTIMIZERS = ("torch-adam torch-sgd torch-radam torch-nadam torch-rmsprop torch-adagrad "
                     "torch-adadelta torch-adamax torch-asgd torch-sparseadam ao-adamw4bit "
                     "adamw_schedulefree adamw_schedulefree+aggressive adamw_schedulefree+no_kahan "
                     "optimi-radam optimi-ranger optimi-adan optimi-adam optimi-sgd soap muon "
                     "ademamix came bnb-adagrad bnb-adagrad8bit bnb-adam bnb-adam8bit bnb-adamw "
                     "bnb-adamw-paged bnb-adamw8bit-paged bnb-lion bnb-lion8bit bnb-lion-paged "
                     "bnb-lion8bit-paged bnb-ademamix bnb-ademamix8bit bnb-ademamix-paged "
                     "bnb-ademamix8bit-paged sdnq-adamw sdnq-adamw+no_quant sdnq-adafactor "
                     "sdnq-came sdnq-lion sdnq-muon sdnq-muon+quantized_matmul")


def _each(names: str, advice: str) -> dict[str, str]:
    return {name: advice for name in names.split()}


_PRECISION_ADVICE = ("use no_change, int8-torchao, int8-quanto, int4-quanto, fp8-torchao or "
                     "nf4-bnb")

CONFIG_VALUES: dict[str, dict[str, str]] = {
    "model_family": {
        "legacy": "use 'sd1x' or 'sd2x' (SimpleTuner's older name for both)",
        **_each(_OTHER_FAMILIES, "this family is not supported here (supported: "
                                 + ", ".join(MODEL_FAMILIES) + ")"),
    },
    "optimizer": {
        **_each(_OTHER_OPTIMIZERS, _SUPPORTED_OPTIMIZERS),
        "adamw8bit": "use 'ao-adamw8bit' (or 'bnb-adamw8bit' on CUDA)",
        "optimi-adamw": "use 'adamw_bf16' (torch-optimi's AdamW with Kahan summation)",
        "optimi-stableadamw": "use 'adamw_bf16' (torch-optimi's AdamW with Kahan summation)",
    },
    "lr_scheduler": {"sine": "use 'cosine' or 'cosine_with_restarts'",
                     "inverse_sqrt": "use 'polynomial' or 'cosine'",
                     "constant_with_restarts": "use 'cosine_with_restarts' or 'constant'"},
    "dynamo_backend": _each("eager aot_eager aot_ts_nvfuser nvprims_nvfuser cudagraphs ofi "
                            "fx2trt onnxrt tensorrt ipex tvm hpu_backend",
                            "use 'inductor' (each repeated block compiled) or 'no' (eager)"),
    "mixed_precision": {"fp8": "use 'bf16'; fp8 training is not supported here"},
    "report_to": _each("comet_ml aim clearml mlflow swanlab simpletuner custom-tracker",
                       "use 'tensorboard', 'wandb', 'all' or 'none'"),
    **{key: _each(_OTHER_PRECISIONS, _PRECISION_ADVICE)
       for key in ("base_model_precision", *(f"text_encoder_{number}_precision"
                                             for number in range(1, 5)))},
}

# SimpleTuner's name -> the name of the same option here.
CONFIG_ALIASES: dict[str, str] = {
    "validation_guidance": "validation_guidance_scale",
    "checkpoint_step_interval": "checkpointing_steps",   # checkpointing_steps: its legacy alias
    "validation_step_interval": "validation_steps",      # validation_steps: its legacy alias
    "flow_schedule_shift": "flow_shift",
    "peft_lora_target_modules": "lora_target_modules",
    "fused_qkv_projections": "fuse_qkv_projections",
    "use_gradient_checkpointing": "gradient_checkpointing",  # its quickstart guides' name
    "optimizer_beta1": "adam_beta1",  # both are passed to any optimizer that takes betas
    "optimizer_beta2": "adam_beta2",
    "framerate": "validation_framerate",  # the frame rate of video validation's clips
}

# SimpleTuner's values with the same meaning as one of this option's values.
CONFIG_VALUE_ALIASES: dict[str, dict[object, object]] = {
    "optimizer": {"torch-adamw": "adamw", "torch-adafactor": "adafactor", "optimi-lion": "lion"},
    "model_family": FAMILY_ALIASES,
}

# Values SimpleTuner takes for "not set": the option keeps its default here.
CONFIG_NOT_SET: dict[str, tuple] = {
    "num_train_epochs": (0,), "max_train_steps": (0,), "eval_steps_interval": (None,),
    "checkpointing_steps": (None,), "validation_steps": (None,), "validation_seed": (None,),
    "adam_beta1": (None,), "adam_beta2": (None,), "gradient_checkpointing_interval": (None, 0),
    "dynamo_backend": (None,),
}

# Options that exist here under SimpleTuner's name but do not mean the same thing.
CONFIG_DIFFERENT: dict[str, str] = {
    "mixed_precision": "here it is accelerate's autocast over float32 weights, and left out it "
                       "is 'no'; SimpleTuner also keeps the base weights in that precision, and "
                       "its default is 'bf16'",
    "noise_offset": "SimpleTuner applies it only with offset_noise true, to "
                    "noise_offset_probability of the samples; here it applies to every sample "
                    "whenever it is above 0",
    "validation_seed": "SimpleTuner's null draws a random seed; here null keeps the default 0",
    "ema_warmup_steps": "its 0 (the default) means SimpleTuner's decay ramp, min(ema_decay, "
                        "(1 + s) / (10 + s)) at update s; here 0 is ema_decay from the first "
                        "update (a warm-up above 0 is SimpleTuner's: the weights copied until it)",
    "gradient_checkpointing_interval": "every n-th block of each block list is checkpointed "
                                       "(SimpleTuner's older meaning, still Sana's); its Flux, "
                                       "Wan and some others now checkpoint contiguous groups "
                                       "of n blocks",
    "grad_clip_method": "left out it is 'norm' here (this trainer's clipping before the option "
                        "existed); SimpleTuner's default is 'value'",
}
