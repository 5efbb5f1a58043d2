"""LTX-2's audio latents: a clip's waveform as the log-mel spectrogram its audio VAE encodes
(LTX-2's: magnitude STFT with a Hann window of n_fft, hop mel_hop_length, Slaney mel filters
over 0 to half the sample rate, log of at least 1e-5), encoded, packed [L, C*M] and normalised
as LTX2Pipeline denormalises them, and fitted to the length the pipeline gives the clip's
frames."""

from __future__ import annotations

import torch
from diffusers import LTX2Pipeline
from transformers.audio_utils import mel_filter_bank

N_FFT = 1024  # LTX-2's audio processor


def log_mel(waveforms: torch.Tensor, sample_rate: int, mel_bins: int, hop: int) -> torch.Tensor:
    """[B, channels, samples] -> [B, channels, frames, mel_bins]."""
    batch, channels, samples = waveforms.shape
    spectrum = torch.stft(waveforms.reshape(batch * channels, samples).float(), N_FFT,
                          hop_length=hop, win_length=N_FFT,
                          window=torch.hann_window(N_FFT, device=waveforms.device),
                          center=True, pad_mode="reflect", return_complex=True).abs()
    filters = torch.from_numpy(mel_filter_bank(
        num_frequency_bins=N_FFT // 2 + 1, num_mel_filters=mel_bins, min_frequency=0.0,
        max_frequency=sample_rate / 2, sampling_rate=sample_rate, norm="slaney",
        mel_scale="slaney")).float().to(waveforms.device)
    mel = torch.log(torch.clamp(filters.T @ spectrum, min=1e-5))  # [B*ch, mels, frames]
    return mel.reshape(batch, channels, mel_bins, -1).transpose(2, 3)


@torch.no_grad()
def audio_latents(audio_vae, waveforms: torch.Tensor, length: int) -> torch.Tensor:
    """[B, channels, samples] -> [B, length, C*M]: encoded (the posterior's mode), packed,
    normalised, then cut or padded with zeros (silence) to ``length`` latents."""
    config = audio_vae.config
    mel = log_mel(waveforms, config.sample_rate, config.mel_bins, config.mel_hop_length)
    latents = audio_vae.encode(mel.to(audio_vae.dtype)).latent_dist.mode()
    packed = LTX2Pipeline._normalize_audio_latents(LTX2Pipeline._pack_audio_latents(latents),
                                                   audio_vae.latents_mean, audio_vae.latents_std)
    fitted = packed.new_zeros(packed.shape[0], length, packed.shape[2])
    kept = min(length, packed.shape[1])
    fitted[:, :kept] = packed[:, :kept]
    return fitted
