"""config/config.json: the flat training options. One field per option; see fields.option."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from simpletuner.configuration.families import MODEL_FAMILIES
from simpletuner.configuration.fields import option

ModelFamily = Literal[MODEL_FAMILIES]
LrScheduler = Literal[
    "linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup"
]

# Frozen weights of the adapted network or of a text encoder: SimpleTuner's names.
Precision = Literal["no_change", "int8-torchao", "int8-quanto", "int4-quanto", "fp8-torchao",
                    "nf4-bnb"]
OptimizerName = Literal["adamw", "adamw_bf16", "ao-adamw8bit", "bnb-adamw8bit", "prodigy",
                        "adafactor", "lion"]

# What an epoch does with a bucket's occurrences that fill no whole effective batch
# (helpers/metadata/epoch_counts.py). Carry loses nothing; README says why it is the default.
BucketTail = Literal["carry", "trim"]
DEFAULT_BUCKET_TAIL: BucketTail = "carry"
BUCKET_TAIL_HELP = (
    "what an epoch does with a bucket's occurrences that fill no whole effective batch "
    "(train_batch_size x processes x gradient_accumulation_steps): carry (train them first in "
    "the next epoch, so every occurrence of every pass is trained exactly once) or trim (drop "
    "them, reported); evaluation datasets evaluate every sample, whatever this says")

StopSignal = Literal["SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]


@dataclass
class TrainingConfig:
    # Model
    model_family: ModelFamily = option(required=True, help=", ".join(MODEL_FAMILIES))
    pretrained_model_name_or_path: str = option(
        required=True, help="a local diffusers folder, or builtin:tiny-<family>")
    model_flavour: str | None = option(
        None, help="SimpleTuner's flavour name; the folder decides the model, and a flavour "
        "that contradicts it is refused (flux: kontext; qwen_image: edit-v1, edit-v2, trained on "
        "edit pairs; flux2: dev, klein-4b, klein-9b; wan: "
        "t2v-480p-1.3b-2.1, t2v-480p-14b-2.1, i2v-480p-14b-2.1, i2v-720p-14b-2.1, "
        "t2v-14b-2.2-high, t2v-14b-2.2-low, ti2v-5b-2.2; a two-expert Wan 2.2 folder needs "
        "t2v-14b-2.2-high or t2v-14b-2.2-low, the expert to train); other families ignore it")
    model_type: Literal["full", "lora"] = option("full", help="lora: train a peft adapter only")
    controlnet: bool = option(
        False, help="train a ControlNet beside the frozen base network (sdxl, flux; model_type "
        "full): each training dataset's conditioning_data names one conditioning_type "
        "'controlnet' dataset of control images, matched to its targets by stem; the export is "
        "the family's ControlNet pipeline with the trained ControlNet in its controlnet/ folder")
    controlnet_model_name_or_path: str | None = option(
        None, help="with controlnet: a diffusers ControlNet folder to start from; none = "
        "initialised from the base network, as diffusers' ControlNetModel.from_unet and "
        "FluxControlNetModel.from_transformer do")
    lora_rank: int = option(16, minimum=1, help="rank of each LoRA update")
    lora_alpha: float | None = option(None, minimum=0.0001,
                                      help="LoRA scale numerator (update * alpha / rank); "
                                      "none = lora_rank")
    lora_dropout: float = option(0.0, minimum=0.0, maximum=0.99)
    lora_target_modules: list[str] | None = option(
        None, help="module name suffixes to adapt, e.g. ['to_q', 'to_v']; none = the family's "
        "attention projections")
    lora_type: Literal["standard", "lycoris"] = option(
        "standard", help="standard: peft LoRA; lycoris: the LyCORIS adapter lycoris_config "
        "describes (lokr, loha, locon, lora, full), exported as a LyCORIS file")
    lycoris_config: str | None = option(
        None, help="with lora_type lycoris: a JSON file with algo, multiplier, linear_dim, "
        "linear_alpha, factor, conv_dim, conv_alpha... and apply_preset (target_module, "
        "target_name, module_algo_map, name_algo_map), as SimpleTuner's lycoris_config")
    lora_format: Literal["diffusers", "comfyui"] = option(
        "diffusers", help="the exported LoRA file's key layout: diffusers (peft keys) or "
        "comfyui (kohya lora_unet_ for SD 1.x/2.x/XL, the transformer./diffusion_model. layout "
        "ComfyUI reads for the DiT families, alpha beside each module); lora_type lycoris writes "
        "LyCORIS's own file, and refuses comfyui")
    init_lora: str | None = option(
        None, help="a LoRA file the adapter starts from (any layout diffusers' "
        "load_lora_weights reads: diffusers, comfyui, kohya; a LyCORIS file for lora_type "
        "lycoris); its rank and modules must be the run's; a resumed run ignores it")
    assistant_lora_path: str | None = option(
        None, help="a frozen LoRA applied with the trained one (model_type lora, lora_type "
        "standard), as SimpleTuner's assistant adapters for distilled models (Z-Image Turbo's "
        "training adapter): a .safetensors file, or a folder with assistant_lora_weight_name "
        "(any layout diffusers' load_lora_weights reads); loaded again on resume, never part of "
        "a checkpoint or the export")
    assistant_lora_weight_name: str | None = option(
        None, help="the file in the assistant_lora_path folder; none = the folder's one "
        ".safetensors file")
    assistant_lora_strength: float = option(
        1.0, minimum=0.0, help="the assistant's scale while training (and evaluating); 0 = off")
    assistant_lora_inference_strength: float = option(
        0.0, minimum=0.0, help="the assistant's scale in validation; 0 = off (SimpleTuner's "
        "default: validation shows the trained LoRA alone)")
    disable_assistant_lora: bool = option(False, help="true: assistant_lora_path is not loaded")
    base_model_precision: Precision = option(
        "no_change", help="quantize the frozen network under a LoRA (torchao, optimum-quanto or "
        "bitsandbytes); no_change = mixed_precision's dtype for LoRA, float32 for full")
    text_encoder_1_precision: Precision = option("no_change", help="quantize text encoder 1")
    text_encoder_2_precision: Precision = option("no_change", help="quantize text encoder 2")
    text_encoder_3_precision: Precision = option("no_change", help="quantize text encoder 3")
    text_encoder_4_precision: Precision = option("no_change", help="quantize text encoder 4 "
                                                 "(HiDream's Llama)")
    frozen_components_after_caching: Literal["keep", "offload", "free"] = option(
        "offload", help="once the latent and text caches are complete, the VAE and text "
        "encoders: keep (on the device), offload (to the CPU) or free (reloaded from the model "
        "folder for validation); validation brings them back while it runs")
    output_dir: str = option(required=True, help="a folder of its own: not /, the home "
                             "folder, a dataset folder, inside one or holding one")
    data_backend_config: str = option(required=True, help="path to multidatabackend.json")

    # Data
    train_batch_size: int = option(1, minimum=1)
    gradient_accumulation_steps: int = option(1, minimum=1)
    seed: int | None = option(None, minimum=0, help="shared shuffle seed; none = broadcast")
    data_backend_sampling: Literal["auto-weighting", "uniform"] = option(
        "auto-weighting", help="how each optimizer step's dataset is drawn among the groups an "
        "epoch still holds, as SimpleTuner: auto-weighting: odds probability x its groups left "
        "(datasets mix in proportion to their size); uniform: odds probability among the "
        "datasets with groups left, whatever their size (a small one comes early and runs out "
        "first); either way every sample is trained once per pass")
    resolution: float = option(1024, minimum=0.0001)
    resolution_type: Literal["pixel", "area", "pixel_area"] = option(
        "pixel", help="pixel: short edge in pixels; area: megapixels; pixel_area: resolution in "
        "pixels, trained at that area (resolution**2 pixels)")
    aspect_bucket_alignment: int = option(64, minimum=8)
    minimum_image_size: float | None = option(
        None, minimum=0.0, help="the datasets' default (each may set its own); in their "
        "resolution units")
    maximum_image_size: float | None = option(
        None, minimum=0.0, help="the datasets' default (each may set its own)")
    target_downsample_size: float | None = option(
        None, minimum=0.0, help="the datasets' default (each may set its own)")
    vae_batch_size: int = option(8, minimum=1, help="images per VAE call while caching latents "
                                 "(SimpleTuner's default is 4)")
    allow_dataset_oversubscription: bool = option(False)
    bucket_tail: BucketTail = option(DEFAULT_BUCKET_TAIL, help=BUCKET_TAIL_HELP + "; datasets "
                                     "may override it")
    num_processes: int = option(1, minimum=1, help="processes train.sh launches")
    context_parallel_size: int = option(
        1, minimum=1, help="C: the processes form num_processes / C data-parallel groups of C "
        "consecutive ranks (rank r in group r // C); the C ranks of a group train the same "
        "micro-batch, each holding 1/C of its sequence; the split is over the groups")

    # Length
    max_train_steps: int | None = option(None, minimum=1)
    num_train_epochs: int | None = option(None, minimum=1)

    # Optimisation
    optimizer: OptimizerName = option(
        "adamw", help="adamw (fp32 states), adamw_bf16 (bf16 weights and states, Kahan "
        "summation; needs mixed_precision bf16), ao-adamw8bit, bnb-adamw8bit (CUDA), prodigy, "
        "adafactor, lion")
    optimizer_config: str | None = option(
        None, help="extra optimizer keyword arguments, 'name=value,name=value' (values are "
        "JSON: 0.01, true, [0.9,0.99]); checked against the optimizer's signature")
    learning_rate: float = option(1e-5, minimum=0.0)
    adam_beta1: float = option(0.9, minimum=0.0, maximum=1.0)
    adam_beta2: float = option(0.999, minimum=0.0, maximum=1.0)
    adam_weight_decay: float = option(1e-2, minimum=0.0)
    adam_epsilon: float = option(1e-8, minimum=0.0)
    lr_scheduler: LrScheduler = option("constant")
    lr_warmup_steps: int = option(0, minimum=0)
    max_grad_norm: float = option(1.0, minimum=0.0, help="0 = no clipping")
    grad_clip_method: Literal["norm", "value"] = option(
        "norm", help="norm: scale all gradients so their total norm is at most max_grad_norm; "
        "value: clamp each gradient element to [-max_grad_norm, max_grad_norm]")
    mixed_precision: Literal["no", "bf16", "fp16"] = option("no")
    gradient_checkpointing: bool = option(False)
    gradient_checkpointing_interval: int = option(
        1, minimum=1, help="with gradient_checkpointing: checkpoint the blocks whose index in "
        "their block list is a multiple of n (0, n, 2n...), the others keep their activations "
        "(fewer recomputed, more memory); 1 = every block; transformer families only")
    dynamo_backend: Literal["no", "inductor"] = option(
        "no", help="inductor: compile each repeated block of the trained network with "
        "torch.compile (regional compilation; the first steps include the compile time, shown "
        "as such); no: eager; not with musubi_blocks_to_swap or fsdp_enable")
    tread_config: dict | None = option(
        None, help="TREAD token routing while training (SimpleTuner's format): {\"routes\": "
        "[{\"selection_ratio\": 0.5, \"start_layer_idx\": 2, \"end_layer_idx\": -2}]}: that share "
        "of the image tokens skips blocks start to end (inclusive; negative: from the end of the "
        "block list, Flux's double- then single-stream blocks) and rejoins after them; "
        "validation and evaluation see every block; flux and wan; not with dynamo_backend")
    use_ema: bool = option(False)
    ema_decay: float = option(0.999, minimum=0.0, maximum=1.0)
    ema_update_interval: int | None = option(
        None, minimum=1, help="update the EMA only after optimizer steps that are multiples of "
        "this (as SimpleTuner: step % interval == 0, each update with the step's decay); none = "
        "every step")
    ema_warmup_steps: int = option(
        0, minimum=0, help="the EMA copies the weights at updates before this optimizer step, "
        "then decays with ema_decay (as SimpleTuner); 0 = ema_decay from the first step")
    max_nonfinite_steps: int = option(
        3, minimum=1, help="stop with exit status 3 after this many optimizer steps in a row whose "
        "loss or gradient norm was NaN/inf (each one is skipped on every rank)")
    snr_gamma: float | None = option(None, minimum=0.0)
    loss_type: Literal["l2", "huber", "smooth_l1"] = option(
        "l2", help="l2 (mean squared error); huber: 2c(sqrt(d^2 + c^2) - c), smooth_l1: "
        "2(sqrt(d^2 + c^2) - c), d = prediction - target, c = huber_c as scheduled")
    huber_schedule: Literal["snr", "exponential", "constant"] = option(
        "snr", help="huber_c per sample: constant; exponential: huber_c ** (t / T); snr: "
        "(1 - huber_c) / (1 + sigma)^2 + huber_c with sigma = sqrt((1 - alphabar_t) / "
        "alphabar_t) (flow families: sqrt((1 - s) / (s + 1e-4)), s = sigma), as SimpleTuner")
    huber_c: float = option(0.1, minimum=0.0001, maximum=1.0,
                            help="the pseudo-Huber threshold (see huber_schedule)")
    noise_offset: float = option(0.0, minimum=0.0)
    # Flow matching (sd3, flux): noise level sigma in (0, 1) per sample, then the shift
    flow_timestep_sampling: Literal["uniform", "logit_normal"] = option(
        "logit_normal", help="uniform, or logit_normal: sigmoid(N(flow_logit_mean, "
        "flow_logit_std)), median sigmoid(flow_logit_mean), the SD3 paper's choice")
    flow_logit_mean: float = option(0.0, help="logit_normal centre; > 0 favours more noise")
    flow_logit_std: float = option(1.0, minimum=0.0001, help="logit_normal spread")
    flow_shift: float | None = option(
        None, minimum=0.0, help="sigma -> shift*sigma / (1 + (shift-1)*sigma); > 1 moves "
        "samples toward noise; 1 or 0 = off (0: SimpleTuner's 'no static shift'); none = the "
        "model scheduler's shift (SD3: 3.0, Flux: its resolution-dependent shift); "
        "flow_schedule_auto_shift overrides it")
    flow_schedule_auto_shift: bool = option(
        False, help="shift each sample's noise levels by its resolution, as SimpleTuner: "
        "exp(mu), mu linear in the latent tokens frames x (h/2) x (w/2) from (base_image_seq_len, "
        "base_shift) to (max_image_seq_len, max_shift) of the model scheduler (diffusers' "
        "defaults 256, 0.5, 4096, 1.15 where it has none); wins over flow_shift")
    flux_guidance_value: float = option(
        1.0, minimum=0.0, help="guidance input while training guidance-distilled Flux models")

    # Sharded training (FSDP2, training/sharding.py): SimpleTuner's option names
    fsdp_enable: bool = option(False, help="shard parameters, gradients and optimizer state "
                               "across processes (FSDP2) instead of replicating them (DDP)")
    fsdp_version: int = option(2, help="2 (torch's fully_shard); FSDP1 is not supported")
    fsdp_reshard_after_forward: bool = option(
        True, help="free gathered parameters after each block's forward (less memory, one more "
        "all-gather in backward)")
    fsdp_state_dict_type: Literal["SHARDED_STATE_DICT", "FULL_STATE_DICT"] = option(
        "SHARDED_STATE_DICT", help="checkpoints: each rank writes its shard, or the main rank "
        "writes the gathered whole")
    fsdp_transformer_layer_cls_to_wrap: list[str] | None = option(
        None, help="class names sharded as units; none = the network's repeated blocks")
    fsdp_sharding: Literal["full", "hybrid"] = option(
        "full", help="hybrid: shard within each node, replicate across nodes (needs > 1 node)")

    # Block swap (training/memory/block_swap.py): SimpleTuner's option names
    musubi_blocks_to_swap: int = option(
        0, minimum=0, help="keep the last N transformer blocks (weights, gradients, optimizer "
        "state) on musubi_block_swap_device and copy each to the training device for its "
        "forward and backward, the next one prefetched; needs gradient_checkpointing, one "
        "process, a transformer family; 0 = off")
    musubi_block_swap_device: Literal["cpu"] = option(
        "cpu", help="where block swap's blocks live between their uses")

    # Group offload (models/group_offload.py): SimpleTuner's option names
    enable_group_offload: bool = option(
        False, help="the VAE and text encoders stay on the host and diffusers' "
        "group-offloading hooks bring each group of their layers to the device for its "
        "forward, while caching and validating; the trained network stays on the device "
        "(musubi_blocks_to_swap puts its blocks on the host)")
    group_offload_type: Literal["block_level", "leaf_level"] = option(
        "block_level", help="block_level: the VAE in groups of group_offload_blocks_per_group "
        "blocks, each text encoder as one group; leaf_level: every layer on its own (least "
        "device memory, most copies)")
    group_offload_blocks_per_group: int = option(
        1, minimum=1, help="block_level: the VAE's blocks per group (more: fewer copies, more "
        "device memory)")
    group_offload_use_stream: bool = option(
        False, help="copy the next group on a CUDA side stream while the current one runs; "
        "ignored on other devices")
    group_offload_to_disk_path: str | None = option(
        None, help="a folder for the text encoders' offloaded weights instead of host memory "
        "(a fast local disk; unquantized encoders); each rank writes its own subfolder, "
        "rewritten at each start; none = host memory")

    # Logging, checkpoints, validation
    report_to: Literal["none", "tensorboard", "wandb", "all"] = option(
        "none", help="all = tensorboard and wandb; wandb runs offline into output_dir/wandb "
        "unless WANDB_API_KEY or WANDB_MODE is set")
    tracker_project_name: str = option("simpletuner", help="the trackers' project")
    tracker_run_name: str | None = option(None, help="this run's name in the trackers")
    log_level: LogLevel | None = option(
        None, help="the trainer's log lines at this level and above (other libraries': at it "
        "or INFO, whichever is higher); DEBUG adds the traceback of every error that stopped a "
        "step, expected ones too; none = the SIMPLETUNER_LOG_LEVEL environment variable "
        "(SimpleTuner's setting), else INFO")
    trace_samples: bool = option(False)
    preemption_signals: list[StopSignal] = option(
        ["SIGTERM", "SIGINT", "SIGUSR1"], help="signals that end the run with a checkpoint at "
        "the next optimizer step and exit status 75; [] = the signals' default action")
    checkpointing_steps: int = option(0, minimum=0)
    checkpoints_total_limit: int | None = option(None, minimum=1)
    resume_from_checkpoint: str | None = option(None, help="'latest' or a checkpoint path")
    validation_prompt: str | list[str] | None = option(None)
    validation_steps: int = option(0, minimum=0)
    validation_num_inference_steps: int = option(20, minimum=1)
    validation_resolution: int | str | None = option(
        None, minimum=8, help="validation image size: a side (square), 'WxH', or several "
        "separated by commas ('1024x1024,1280x768': each prompt at each size); none = the "
        "training resolution (area types: the side of a square of that area), rounded to "
        "aspect_bucket_alignment")
    validation_guidance_scale: float = option(7.5, minimum=0.0)
    validation_seed: int = option(0, minimum=0)
    num_validation_images: int = option(
        1, minimum=1, help="images (or clips) per validation prompt and size, as SimpleTuner; "
        "the k-th with seed validation_seed + k (an edit model edits each reference once)")

    # SimpleTuner options (issue 15)
    caption_dropout_probability: float = option(
        0.0, minimum=0.0, maximum=1.0, help="fraction of training samples that train with the "
        "empty caption, chosen per (seed, epoch, sample); datasets may override it")
    lr_end: float = option(1e-7, minimum=0.0, help="polynomial: the learning rate at the end "
                           "(SimpleTuner's default is 4e-7)")
    lr_power: float = option(1.0, minimum=0.0, help="polynomial: the decay's power (1 = linear)")
    lr_num_cycles: int = option(1, minimum=1, help="cosine_with_restarts: number of cycles")
    validation_negative_prompt: str | None = option(
        None, help="negative prompt of every validation image (families with classifier-free "
        "guidance); none = no negative prompt")
    validation_on_startup: bool = option(False, help="also validate before the first step")
    validation_disable: bool = option(False, help="true: no validation images, whatever the "
                                      "prompts")
    user_prompt_library: str | None = option(
        None, help="a JSON file of named prompts ({\"name\": \"prompt\"}, or {\"name\": "
        "{\"prompt\": ...}}), validated after validation_prompt's")
    validation_guidance_rescale: float = option(
        0.0, minimum=0.0, maximum=1.0, help="guidance rescale of the validation pipeline "
        "(sd1x, sd2x, sdxl: reduces over-exposure at high guidance); 0 = off")
    validation_disable_unconditional: bool = option(
        False, help="validate without the unconditional pass: classifier-free guidance off "
        "(families with it: sd1x, sd2x, sdxl, sd3, chroma, qwen_image, z_image); Flux's "
        "guidance input is unaffected")
    validation_guidance_skip_layers: list[int] | None = option(
        None, help="sd3: skip-layer guidance over these transformer blocks while validating "
        "(e.g. [7, 8, 9]); none = off")
    validation_guidance_skip_layers_start: float = option(
        0.01, minimum=0.0, maximum=1.0, help="sd3: fraction of the steps where skip-layer "
        "guidance starts")
    validation_guidance_skip_layers_stop: float = option(
        0.2, minimum=0.0, maximum=1.0, help="sd3: fraction of the steps where it stops")
    validation_guidance_skip_scale: float = option(
        2.8, minimum=0.0, help="sd3: the skip-layer guidance scale")
    validation_num_video_frames: int | None = option(
        None, minimum=1, help="video families (wan, ltxvideo, ltxvideo2): frames of each "
        "validation clip, a count the VAE encodes (Wan 4n+1, LTX 8n+1); none = the pipeline's "
        "default (Wan: 81, LTX-Video: 161, LTX-2: 121)")
    validation_using_datasets: bool = option(
        False, help="image-to-video models (Wan I2V) need it to validate: each validation "
        "prompt animates the first frame of a training sample (the first training dataset's, "
        "in sorted order, one per prompt); other models refuse it")
    validation_framerate: int | None = option(
        None, minimum=1, help="video families: frames per second of the validation clips' "
        "animated WebP; none = the family's rate (Wan: 16)")
    eval_dataset_id: str | None = option(
        None, help="edit models (flux kontext, qwen_image edit-v1/v2): the dataset with "
        "conditioning_data whose pairs "
        "validation edits: each of its first num_eval_images targets' reference, with that "
        "target's caption as the prompt (instead of validation_prompt); none = text-to-image "
        "validation")
    num_eval_images: int = option(4, minimum=1, help="with eval_dataset_id: how many of its "
                                  "pairs (in sample order) validation edits")
    eval_steps_interval: int = option(
        0, minimum=0, help="every this many steps, log the loss on the 'eval' datasets "
        "(eval/loss, an eval line in output_dir/events.jsonl); 0 = never")
