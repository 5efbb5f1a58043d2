"""A clip's sound over a time span (multiaspect/clip_audio.py), on real clips written with
PyAV: the samples of a span are the same samples as the whole stream's at that offset,
resampled to the asked rate and layout; sound missing at the end is silence; a clip without an
audio stream has none; prepare_clip's span is its trained frames' (re-timed ones' too); the
latent cache gives each clip's sound to the model and records its span, and trains a clip
without sound video-only or skips it (video.missing_audio)."""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

import torch
import torch.nn.functional as F

from simpletuner.helpers.caching.latents import LatentSettings, cache_latents
from simpletuner.helpers.caching.prepare import latent_components, text_components
from simpletuner.helpers.caching.storage import load_entry, model_identity
from simpletuner.helpers.data_backend.local import LocalStorage
from simpletuner.helpers.metadata.index import ClipPlan, DatasetIndex
from simpletuner.helpers.multiaspect.clip import prepare_clip
from simpletuner.helpers.multiaspect.clip_audio import AudioRequest, ClipSpan, decode_audio
from video_fixtures import write_clip, write_clip_with_sound

STEREO_16K = AudioRequest(16000, 2)


class ClipAudioTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(cls.enterClassContext(tempfile.TemporaryDirectory()))
        cls.clip = write_clip_with_sound(cls.tmp / "tone.mp4", 32, 32, 24, 24, sample_rate=44100)

    def test_a_span_is_the_whole_streams_samples_at_its_offset(self):
        whole = decode_audio(self.clip, ClipSpan(0.0, 1.0), STEREO_16K)
        part = decode_audio(self.clip, ClipSpan(0.125, 0.25), STEREO_16K)
        self.assertEqual(tuple(part.shape), (2, 4000))
        self.assertTrue(torch.equal(part, whole[:, 2000:6000]))
        self.assertGreater(part.abs().max().item(), 0.05)  # the tone, not silence
        mono = decode_audio(self.clip, ClipSpan(0.125, 0.25), AudioRequest(8000, 1))
        self.assertEqual(tuple(mono.shape), (1, 2000))

    def test_sound_missing_at_the_end_is_silence(self):
        tail = decode_audio(self.clip, ClipSpan(0.9, 0.5), STEREO_16K)  # the sound ends at 1 s
        self.assertEqual(tuple(tail.shape), (2, 8000))
        self.assertGreater(tail[:, :1000].abs().max().item(), 0.05)
        self.assertEqual(tail[:, 2000:].abs().max().item(), 0.0)

    def test_a_clip_without_an_audio_stream_has_no_sound(self):
        silent = write_clip(self.tmp / "silent.mp4", 32, 32, 9, 24)
        self.assertIsNone(decode_audio(silent, ClipSpan(0.0, 0.25), STEREO_16K))
        self.assertIsNone(prepare_clip(silent.read_bytes(), (32, 32), 9, crop=False,
                                       audio=STEREO_16K).audio)

    def test_prepared_clips_carry_their_frames_span_and_its_sound(self):
        clip = prepare_clip(self.clip.read_bytes(), (32, 32), 9, crop=False, audio=STEREO_16K)
        self.assertEqual((clip.span.start, clip.span.duration), (0.0, 9 / 24))
        self.assertEqual(tuple(clip.audio.shape), (2, 6000))
        retimed = prepare_clip(self.clip.read_bytes(), (32, 32), 9, crop=False, fps=12,
                               audio=STEREO_16K)  # 9 frames at 12 fps are shown 0.75 s
        self.assertEqual(retimed.span.duration, 0.75)
        whole = decode_audio(self.clip, ClipSpan(0.0, 1.0), STEREO_16K)
        self.assertTrue(torch.equal(retimed.audio, whole[:, :12000]))
        self.assertIsNone(prepare_clip(self.clip.read_bytes(), (32, 32), 9, crop=False).audio)


def encode_with_sound(pixels: torch.Tensor, audio: list) -> dict[str, torch.Tensor]:
    """A stand-in model: pooled pixels, and how many samples of sound each clip came with."""
    counts = [0 if sound is None else sound.shape[1] for sound in audio]
    return {"latent": F.avg_pool3d(pixels, (1, 8, 8)), "samples": torch.tensor(counts)}


class SoundCachingTest(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(self.enterContext(tempfile.TemporaryDirectory()))
        write_clip_with_sound(self.tmp / "clips" / "tone.mp4", 32, 32, 12, 24)
        write_clip(self.tmp / "clips" / "silent.mp4", 32, 32, 12, 24)

    def cache(self, skip_silent: bool):
        tmp = self.tmp
        names = ["silent.mp4", "tone.mp4"]
        index = DatasetIndex("c", {"32x32@9": names}, {n: (32, 32) for n in names},
                             clips={n: ClipPlan(9, "24/1", 12, "frames") for n in names})
        settings = LatentSettings("c", LocalStorage(tmp / "clips"), tmp / "vae", "m",
                                  audio=STEREO_16K, skip_silent=skip_silent)
        result = cache_latents(index, settings, encode_with_sound, progress=False)
        return result, {n: load_entry(p, n) for n, p in result.cache.paths.items()
                        if p.exists()}

    def test_clips_sound_is_encoded_and_its_span_recorded_a_silent_one_trains_video_only(self):
        with self.assertLogs("simpletuner.helpers.caching.latents", "WARNING") as logs:
            result, entries = self.cache(skip_silent=False)
        self.assertEqual(result.failures, {})
        self.assertEqual(result.silent, ["silent.mp4"])
        self.assertIn("1 clips have no audio stream and train video-only (silent.mp4)",
                      logs.output[0])
        self.assertEqual(entries["tone.mp4"]["samples"].item(), 6000)  # 9 / 24 s at 16 kHz
        self.assertEqual(entries["silent.mp4"]["samples"].item(), 0)
        self.assertEqual(entries["tone.mp4"]["audio_span"].tolist(), [0.0, 0.375])

    def test_missing_audio_skip_leaves_a_silent_clip_out_even_after_a_video_only_run(self):
        with self.assertLogs("simpletuner.helpers.caching.latents", "WARNING"):
            self.cache(skip_silent=False)  # its entries stay in the same cache folder
        result, entries = self.cache(skip_silent=True)
        self.assertEqual(set(entries), {"tone.mp4"})
        self.assertIn("missing_audio", result.failures["silent.mp4"])


class SoundModelIdentityTest(unittest.TestCase):
    def test_a_changed_audio_vae_or_text_connector_is_a_new_cache(self):
        folder = Path(self.enterContext(tempfile.TemporaryDirectory()))
        for part in ("vae", "audio_vae", "text_encoder", "tokenizer", "connectors"):
            (folder / part).mkdir()
            (folder / part / "config.json").write_text("{}")

        def identities():
            return (model_identity(folder, latent_components(folder), "f"),
                    model_identity(folder, text_components(folder), "f"))

        latent, text = identities()
        (folder / "audio_vae" / "config.json").write_text('{"mel_bins": 64}')
        self.assertEqual(identities()[1], text)
        self.assertNotEqual(identities()[0], latent)
        latent = identities()[0]
        (folder / "connectors" / "config.json").write_text('{"layers": 2}')
        self.assertEqual(identities()[0], latent)
        self.assertNotEqual(identities()[1], text)


if __name__ == "__main__":
    unittest.main()
