"""LTX-2 through LTX2Pipeline, a joint audio-video model: the LTX-Video adapter's video latents
(its VAE's normalisation, packed tokens, the shift by the clip's token count) beside an audio
stream. Prompts go through the pipeline's own Gemma 3 encoding (every layer's hidden states,
left-padded to 1024 tokens) and its text connectors, whose video and audio embeddings and mask
are cached. Each step noises the clip's video latents and its audio latents (packed [B, L, C*M]
and normalised as the pipeline denormalises them; silence, zeros, for a clip without audio) at
the same sigma; the transformer predicts both velocities, and the loss adds the audio one for
the samples that have audio."""

from __future__ import annotations

import inspect
import json
from functools import partial
from pathlib import Path

import torch
from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, LTX2Pipeline
from diffusers import LTX2VideoTransformer3DModel
from diffusers.pipelines.ltx2 import LTX2TextConnectors, vocoder as vocoders
from transformers import AutoTokenizer, Gemma3ForConditionalGeneration

from simpletuner.families.ltxvideo.adapter import LTXVideoAdapter
from simpletuner.families.ltxvideo2.audio import audio_latents
from simpletuner.helpers.multiaspect.clip_audio import AudioRequest
from simpletuner.models.components import load_component
from simpletuner.models.flow_family import FLOW_TIMESTEPS
from simpletuner.models.flow_objective import flow_noisy_and_target
from simpletuner.models.loss_types import flow_noise_ratio, huber_thresholds, objective_loss
from simpletuner.models.noise_objective import draw_noise
from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.transfer import batch_to_device

AUDIO_PARTS = ("audio_vae", "connectors", "vocoder")


class LTX2Adapter(LTXVideoAdapter):
    family = "ltxvideo2"
    text_encoder_specs = (("text_encoder", "tokenizer", Gemma3ForConditionalGeneration,
                           AutoTokenizer),)
    transformer_class = LTX2VideoTransformer3DModel
    pipeline_class = LTX2Pipeline
    vae_class = AutoencoderKLLTX2Video
    forbidden_subfolders = ("unet", "text_encoder_2")
    max_sequence_length = 1024  # LTX2Pipeline.__call__'s
    frame_rate = 24  # LTX2Pipeline.__call__'s frame_rate (motion_speed 1)
    default_validation_frames = 121  # LTX2Pipeline's fixed default without a duration head
    default_validation_framerate = 24

    def __init__(self, *, audio_vae, connectors, vocoder, **parts):
        super().__init__(**parts)
        self.audio_vae = audio_vae
        self.connectors = connectors
        self.vocoder = vocoder

    @classmethod
    def required_subfolders(cls) -> tuple[str, ...]:
        return super().required_subfolders() + AUDIO_PARTS

    @classmethod
    def load_conditioning_components(cls, folder: Path, *, device: torch.device,
                                     weight_dtype: torch.dtype) -> dict:
        """The audio VAE, the text connectors and the vocoder (its class as model_index.json
        names it: LTX-2.3's has bandwidth extension), frozen."""
        index = json.loads((Path(folder) / "model_index.json").read_text())
        vocoder_class = getattr(vocoders, index["vocoder"][1])
        parts = {"audio_vae": AutoencoderKLLTX2Audio, "connectors": LTX2TextConnectors,
                 "vocoder": vocoder_class}
        loaded = {}
        for name, part_class in parts.items():
            part = load_component(partial(part_class.from_pretrained, torch_dtype=weight_dtype),
                                  folder, name)
            loaded[name] = part.to(device).requires_grad_(False).eval()
        return loaded

    def move_to(self, device: torch.device,
                except_modules: list[torch.nn.Module] | tuple = ()) -> None:
        super().move_to(device, except_modules)
        for part in (self.audio_vae, self.connectors, self.vocoder):
            part.to(device)

    def validation_arguments(self, arguments: dict) -> dict:
        """PIL frames; spatio-temporal guidance at the pipeline's blocks that this transformer
        has (none: that guidance off)."""
        default = inspect.signature(self.pipeline_class.__call__).parameters[
            "spatio_temporal_guidance_blocks"].default
        blocks = [block for block in default if block < self.transformer.config.num_layers]
        guidance = ({"spatio_temporal_guidance_blocks": blocks} if blocks
                    else {"stg_scale": 0.0, "audio_stg_scale": 0.0})
        return {"num_frames": 1, **guidance, **arguments, "output_type": "pil"}

    @property
    def validation_sample_rate(self) -> int:
        """The vocoder's output rate: the pipeline's sound."""
        return self.vocoder.config.output_sampling_rate

    @property
    def audio_input(self) -> AudioRequest:
        """What the audio VAE encodes: its sample rate and channels."""
        config = self.audio_vae.config
        return AudioRequest(config.sample_rate, config.in_channels)

    @torch.no_grad()
    def encode_for_cache(self, pixels: torch.Tensor, first_frame_condition: bool = False,
                         audio: list[torch.Tensor | None] | None = None
                         ) -> torch.Tensor | dict[str, torch.Tensor]:
        """The latents, and for clips (``audio`` given: each one's sound over its frames, or
        None) their audio latents as long as the pipeline makes them for those frames, with
        ``has_audio`` 1 for a clip with sound, 0 for one trained video-only."""
        latents = self.encode_images(pixels)
        if audio is None:
            return latents
        length = self.audio_latent_length(latents.shape[2])
        width = max((len(sound[0]) for sound in audio if sound is not None), default=0)
        waveforms = torch.zeros(len(audio), self.audio_input.channels, max(width, 1))
        for row, sound in enumerate(audio):
            if sound is not None:
                waveforms[row, :, :sound.shape[1]] = sound
        present = torch.tensor([sound is not None for sound in audio], dtype=torch.float32)
        encoded = audio_latents(self.audio_vae, waveforms.to(self.device), length)
        return {"latent": latents, "audio_latents": encoded * present.view(-1, 1, 1).to(encoded),
                "has_audio": present}

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """{"prompt_embeds", "audio_prompt_embeds": [B, 1024, width], "prompt_attention_mask":
        [B, 1024]}: LTX2Pipeline's encode_prompt, then its connectors, as __call__ runs them."""
        pipeline = self.pipeline_class(scheduler=None, vae=None, audio_vae=None,
                                       connectors=None, transformer=None, vocoder=None,
                                       **self._pipeline_text_components())
        embeds, mask, _, _ = pipeline.encode_prompt(
            prompts, do_classifier_free_guidance=False, device=self.device,
            max_sequence_length=self.max_sequence_length)
        video, audio, mask = self.connectors(embeds.to(self.connectors.dtype), mask,
                                             padding_side=pipeline.tokenizer.padding_side)
        return {"prompt_embeds": video, "audio_prompt_embeds": audio,
                "prompt_attention_mask": mask}

    def audio_latent_length(self, latent_frames: int) -> int:
        """Audio latents spanning a clip of ``latent_frames`` video latents, as LTX2Pipeline
        sizes them: its pixel frames' duration at frame_rate, in the audio VAE's latents."""
        frames = (latent_frames - 1) * self.vae.temporal_compression_ratio + 1
        config = self.audio_vae.config
        per_second = (config.sample_rate / config.mel_hop_length
                      / self.audio_vae.temporal_compression_ratio)
        return round(frames / self.frame_rate * per_second)

    def clean_audio(self, batch: TrainingBatch, video: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's packed, normalised audio latents [B, L, C*M] and a [B] weight: 1 for a
        sample with audio, 0 for one trained video-only (silence, zeros, in its place)."""
        cached = batch.conditioning.get("audio_latents")
        if cached is not None:
            return cached.float(), batch.conditioning["has_audio"].float()
        config = self.audio_vae.config
        width = config.latent_channels * config.mel_bins // self.audio_vae.mel_compression_ratio
        length = self.audio_latent_length(video.shape[2])
        zeros = video.new_zeros(video.shape[0], length, width)
        return zeros, video.new_zeros(video.shape[0])

    def _thresholds(self, sigmas: torch.Tensor) -> torch.Tensor | None:
        settings = self.loss_settings
        if settings.loss_type == "l2":
            return None
        return huber_thresholds(settings.huber_schedule, settings.huber_c,
                                timesteps=sigmas * FLOW_TIMESTEPS,
                                num_train_timesteps=FLOW_TIMESTEPS,
                                noise_ratio=flow_noise_ratio(sigmas))

    def compute_loss(self, batch: TrainingBatch, generator: torch.Generator | None = None, *,
                     network: torch.nn.Module | None = None, base_model=None) -> torch.Tensor:
        """The video loss plus the audio loss of the samples with audio, both velocities
        predicted in one pass at the same noise level."""
        settings = self.loss_settings
        batch = batch_to_device(batch, self.device)
        video = batch.latents.to(torch.float32)
        audio, has_audio = self.clean_audio(batch, video)
        noise = draw_noise(video.shape, device=self.device, generator=generator,
                           noise_offset=settings.noise_offset)
        audio_noise = draw_noise(audio.shape, device=self.device, generator=generator)
        sigmas = self.draw_sigmas(video, generator)
        noisy, target = flow_noisy_and_target(video, noise, sigmas)
        noisy_audio, audio_target = flow_noisy_and_target(audio, audio_noise, sigmas)
        network = network if network is not None else self.transformer

        def predict() -> tuple[torch.Tensor, torch.Tensor]:
            return self._predict_both(network, noisy, noisy_audio, sigmas, batch)

        if base_model is not None:  # is_regularisation_data: the base model's prediction
            with torch.no_grad(), base_model():
                target, audio_target = (part.detach() for part in predict())
        prediction, audio_prediction = predict()
        thresholds = self._thresholds(sigmas)
        return (objective_loss(prediction, target, loss_type=settings.loss_type,
                               thresholds=thresholds)
                + objective_loss(audio_prediction, audio_target, loss_type=settings.loss_type,
                                 thresholds=thresholds, weights=has_audio))

    def _predict(self, network, noisy, sigmas, batch, dtype):
        raise NotImplementedError("LTX-2 predicts video and audio together: _predict_both")

    def _predict_both(self, network, noisy: torch.Tensor, noisy_audio: torch.Tensor,
                      sigmas: torch.Tensor, batch: TrainingBatch
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """Both velocities, as LTX2Pipeline calls its transformer (no guidance passes):
        video [B, C, F, h, w] and audio [B, L, C*M]."""
        if noisy.ndim != 5:
            raise ValueError(f"LTX-2 latents are [B, C, F, h, w]; got shape "
                             f"{tuple(noisy.shape)} (rebuild the latent cache with model_family "
                             "ltxvideo2)")
        dtype = self.transformer.dtype
        frames, height, width = noisy.shape[2:]
        timestep = (sigmas * self.scheduler.config.num_train_timesteps).to(dtype)
        embeds = batch.prompt_embeds
        video, audio = network(
            hidden_states=LTX2Pipeline._pack_latents(noisy).to(dtype),
            audio_hidden_states=noisy_audio.to(dtype),
            encoder_hidden_states=embeds["prompt_embeds"].to(dtype),
            audio_encoder_hidden_states=embeds["audio_prompt_embeds"].to(dtype),
            timestep=timestep, sigma=timestep,
            encoder_attention_mask=embeds["prompt_attention_mask"],
            audio_encoder_attention_mask=embeds["prompt_attention_mask"],
            num_frames=frames, height=height, width=width, fps=float(self.frame_rate),
            audio_num_frames=noisy_audio.shape[1], use_cross_timestep=True, return_dict=False)
        return LTX2Pipeline._unpack_latents(video, frames, height, width), audio

    def _pipeline_components(self, trainable: torch.nn.Module | None) -> dict:
        return {**super()._pipeline_components(trainable), "audio_vae": self.audio_vae,
                "connectors": self.connectors, "vocoder": self.vocoder}
