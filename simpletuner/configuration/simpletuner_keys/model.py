"""SimpleTuner's config.json options about the model, LoRA, precision, memory and launching."""

from __future__ import annotations

from simpletuner.configuration.simpletuner_keys.entries import ignored, refused

SINGLE_MODEL_FOLDER = ("remove it; every component comes from the diffusers folder in "
                       "pretrained_model_name_or_path (assemble one folder with the parts you "
                       "want); the same path as pretrained_model_name_or_path is accepted")
# SimpleTuner's paths of single components: the model's own path asks for nothing (its
# examples name the model folder again for its T5).
COMPONENT_PATHS = ("pretrained_vae_model_name_or_path", "pretrained_transformer_model_name_or_path",
                   "pretrained_unet_model_name_or_path", "pretrained_t5_model_name_or_path",
                   "pretrained_gemma_model_name_or_path", "qwen_text_encoder_model_name_or_path")


def without_the_model_folder(raw: dict) -> dict:
    """``raw`` (config.json's options) less the component paths that name
    pretrained_model_name_or_path itself: the component comes from that folder anyway."""
    model = {key.removeprefix("--"): value for key, value in raw.items()}.get(
        "pretrained_model_name_or_path")
    return {key: value for key, value in raw.items()
            if not (key.removeprefix("--") in COMPONENT_PATHS and model is not None
                    and value == model)}
STANDARD_LORA = ("remove it; LoRA here is peft LoRA (model_type 'lora', lora_rank, ...) or "
                 "LyCORIS (lora_type 'lycoris')")
NO_TEXT_ENCODER_TRAINING = "remove it; text encoders are frozen and their embeddings cached"
MEMORY_ONLY = ("accepted; memory placement here is frozen_components_after_caching, "
               "gradient_checkpointing and fsdp_*; the trained result is the same")
KERNELS = ("accepted; attention uses PyTorch's scaled_dot_product_attention; the trained "
           "result does not depend on the kernel")
COMPILE = ("accepted; dynamo_backend 'inductor' compiles each repeated block with "
           "torch.compile's defaults (regional compilation), for training and validation alike")
LAUNCHER = ("remove it; ./train.sh launches num_processes processes; pass launcher options in "
            "ACCELERATE_EXTRA_ARGS (multi-node: --num_machines, --machine_rank, "
            "--main_process_ip, --main_process_port) or ACCELERATE_CONFIG_FILE")
NO_CONTROL = ("remove it; control training here is ControlNet training (controlnet: true), "
              "or the base network (model_type 'full' or 'lora')")

MODEL_KEYS = {
    **refused("control", NO_CONTROL),
    **refused("controlnet_custom_config", "remove it; the ControlNet is initialised from the "
              "base network, or from controlnet_model_name_or_path"),
    **refused("prediction_type", "remove it; the prediction type comes from the model's "
              "scheduler config"),
    **refused(" ".join(COMPONENT_PATHS) + " revision variant", SINGLE_MODEL_FOLDER),
    **refused("pretrained_transformer_subfolder", SINGLE_MODEL_FOLDER, (None, "transformer")),
    **refused("pretrained_unet_subfolder", SINGLE_MODEL_FOLDER, (None, "unet")),
    **ignored("vae_dtype", "accepted; the VAE runs in float32 while latents are cached"),
    **ignored("base_model_default_dtype", "accepted; frozen weights take mixed_precision's "
              "dtype under a LoRA and float32 for full training (base_model_precision "
              "quantizes them)"),
    **refused("quantize_via", "remove it; quantization happens on the CPU before the weights "
              "move to the device ('cpu' and 'accelerator' are accepted: same weights)",
              (None, "cpu", "accelerator")),
    **refused("quantization_config quantize_activations", "remove it; quantization is chosen per "
              "component with base_model_precision and text_encoder_<n>_precision"),
    **ignored("sdnq_weights_dtype sdnq_quantized_matmul_dtype sdnq_group_size "
              "sdnq_use_quantized_matmul sdnq_compile_mode sdnq_use_static_quantization "
              "sdnq_use_stochastic_rounding sdnq_dequantize_fp32 sdnq_use_svd sdnq_use_hadamard "
              "sdnq_svd_rank sdnq_svd_steps sdnq_hadamard_group_size sdnq_modules_to_not_convert "
              "sdnq_modules_to_not_use_matmul sdnq_modules_dtype_dict sdnq_modules_quant_config",
              "used only with SDNQ precisions, which base_model_precision refuses here"),
    **refused("diffusion_blocks_config", "remove it; every block of the network is trained"),
    **refused("gradient_checkpointing_segment_stride", "remove it; "
              "gradient_checkpointing_interval n checkpoints every n-th block, with no stride",
              (None, 0, 1)),
    **refused("gradient_checkpointing_backend", "remove it; gradient_checkpointing uses torch's "
              "checkpointing", (None, "torch")),
    **ignored("gradient_checkpointing_offload_attention gradient_checkpointing_offload_prefetch "
              "gradient_checkpointing_offload_pin_memory_max_buckets offload_during_startup "
              "offload_during_save delete_model_after_load unet_attention_slice keep_vae_loaded "
              "vae_enable_slicing vae_enable_tiling vae_enable_patch_conv "
              "vae_enable_temporal_roll fully_unload_text_encoder "
              "optimizer_offload_gradients fuse_optimizer optimizer_release_gradients "
              "enable_chunked_feed_forward feed_forward_chunk_size set_grads_to_none "
              "fsdp_cpu_ram_efficient_loading fsdp_limit_all_gathers find_unused_parameters "
              "accelerator_cache_clear_interval enable_model_cpu_offload", MEMORY_ONLY),
    **refused("ramtorch", "remove it; weights are not streamed from RAM here (see "
              "frozen_components_after_caching and fsdp_enable)"),
    **ignored("ramtorch_target_modules ramtorch_text_encoder ramtorch_vae ramtorch_controlnet "
              "ramtorch_transformer_percent ramtorch_text_encoder_percent "
              "ramtorch_disable_sync_hooks ramtorch_disable_extensions",
              "used only with ramtorch, which is refused here"),
    **ignored("trust_remote_code", "accepted; no model here runs code from its folder"),
    **refused("max_grounding_entities", "remove it; grounding is not supported here", (None, 0)),
    **ignored("pretrained_grounding_model_name_or_path", "used only with grounding, which is "
              "refused here"),
    # LoRA
    **refused("init_lokr_norm", "remove it; LoKr starts from LyCORIS's own initialisation "
              "here"),
    **refused("validation_lycoris_strength", "remove it; validation applies the LyCORIS adapter "
              "at its multiplier from lycoris_config", (None, 1, 1.0)),
    **refused("use_dora slider_lora_target", STANDARD_LORA),
    **refused("lora_init_type", STANDARD_LORA, (None, "default")),
    **refused("peft_lora_mode", STANDARD_LORA, (None, "standard")),
    **ignored("singlora_ramp_up_steps", "used only with peft_lora_mode 'singlora', which is "
              "refused here"),
    **refused("init_lora_step", "remove it; a run started from init_lora starts at step 0 "
              "(SimpleTuner's init_lora_step 0)", (None, 0)),
    **refused("init_lora_ema", "remove it; init_lora names the one LoRA file "
              "the adapter starts from"),
    **refused("train_text_encoder", NO_TEXT_ENCODER_TRAINING),
    **ignored("text_encoder_lr freeze_encoder freeze_encoder_before freeze_encoder_after "
              "freeze_encoder_strategy "
              "save_text_encoder text_encoder_limit", "used only with train_text_encoder, "
              "which is refused here"),
    **refused("layer_freeze_strategy", "remove it; every parameter of the trained network (or "
              "its LoRA) is trained", (None, "none")),
    # Kernels, precision and compilation
    **ignored("attention_mechanism sla_config sageattention_usage disable_tf32 allow_tf32 "
              "enable_xformers_memory_efficient_attention", KERNELS),
    **ignored("validation_torch_compile dynamo_mode dynamo_fullgraph dynamo_dynamic "
              "dynamo_use_regional_compilation dynamo_wrapper dynamo_cache_export "
              "dynamo_cache_export_after_first_step dynamo_hub_repo_id", COMPILE),
    # Launching and distribution
    **refused("accelerate_config deepspeed_config offload_param_path", LAUNCHER),
    **refused("accelerate_extra_args", LAUNCHER, (None, "")),
    **refused("num_machines", LAUNCHER, (None, 1)),
    **refused("machine_rank", LAUNCHER, (None, 0)),
    **refused("main_process_ip", LAUNCHER, (None, "127.0.0.1", "localhost")),
    **refused("main_process_port", LAUNCHER, (None, 29500)),
    **ignored("same_network local_rank", "accepted; set by the launcher"),
    **refused("fsdp_auto_wrap_policy", "remove it; fsdp_transformer_layer_cls_to_wrap names the "
              "sharded blocks", (None, "TRANSFORMER_BASED_WRAP")),
    **refused("fsdp_cpu_offload", "remove it; FSDP2 here keeps parameters on the device"),
    **refused("fsdp_activation_checkpointing", "use gradient_checkpointing"),
    **ignored("context_parallel_comm_strategy", "accepted; context_parallel_size's groups "
              "exchange attention heads with one all-to-all (Ulysses)"),
    **refused("optimizer_cpu_offload_method", "remove it; optimizer state stays on the device",
              (None, "none")),
    **refused("distillation_method", "remove it; distillation is not supported here"),
    **ignored("distillation_config", "used only with distillation_method, which is refused here"),
    **refused("refiner_training", "remove it; SDXL refiner training is not supported here"),
    **ignored("refiner_training_invert_schedule refiner_training_strength",
              "used only with refiner_training, which is refused here"),
}
