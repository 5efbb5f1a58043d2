"""LTX-2's sound, end to end in one in-process run on clips: each clip's audio stream is decoded
over exactly the frames it trains on (the span its latent entry records from the source's
timestamps), resampled to the audio VAE's rate, encoded and cached beside the video latents; a
clip without audio trains video-only, named in the log; validation writes an MP4 whose audio
track lasts as long as its frames (probed with PyAV)."""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
import unittest
from fractions import Fraction
from pathlib import Path

import av
import torch

from simpletuner.helpers.caching.storage import load_entry
from simpletuner.helpers.multiaspect.clip_audio import AudioRequest, ClipSpan, decode_audio
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.registry import get_adapter_class
from simpletuner.families.ltxvideo2.audio import audio_latents
from simpletuner.models.base import LossSettings
from training_fixtures import run_in_process, write_config
from video_fixtures import write_clip, write_clip_with_sound

FRAMES, FPS = 9, 24  # each clip trains at its first 9 frames: 0.375 s at 24 fps


class LTX2SoundRunTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = Path(tempfile.mkdtemp(prefix="st-ltx2-sound-"))
        cls.addClassCleanup(shutil.rmtree, cls.root, ignore_errors=True)
        clips = cls.root / "clips"
        for index in range(2):  # 17 frames and 0.71 s of sound each; 9 frames train
            write_clip_with_sound(clips / f"tone{index}.mp4", 64, 64, 17, FPS, seed=index,
                                  sample_rate=44100)
        write_clip(clips / "silent.mp4", 64, 64, 17, FPS, caption="moving shapes, no sound")
        datasets = [{"id": "clips", "dataset_type": "video", "instance_data_dir": str(clips),
                     "caption_strategy": "textfile", "video": {"num_frames": FRAMES}}]
        config = write_config(
            cls.root, clips, "sound", datasets=datasets, model_family="ltxvideo2",
            pretrained_model_name_or_path="builtin:tiny-ltxvideo2", resolution=64,
            aspect_bucket_alignment=32, train_batch_size=1, max_train_steps=3,
            validation_prompt="a tone", validation_num_inference_steps=1,
            validation_num_video_frames=FRAMES)
        with cls().assertLogs("simpletuner.helpers.caching.latents", logging.WARNING) as logs:
            cls.result = run_in_process(config)
        cls.logged = "\n".join(logs.output)
        cls.out = cls.root / "sound-out"
        cls.entries = {}
        for path in (cls.out / "cache" / "vae" / "clips").rglob("*.safetensors"):
            entry = load_entry(path, path.name)
            cls.entries[int(entry["has_audio"].item())] = cls.entries.get(
                int(entry["has_audio"].item()), []) + [entry]

    def test_the_clips_with_and_without_sound_train(self):
        self.assertEqual(self.result.steps, 3)
        self.assertTrue(math.isfinite(self.result.final_loss))

    def test_each_cached_audio_latent_covers_its_frames_time_span(self):
        self.assertEqual(len(self.entries[1]), 2)
        adapter = get_adapter_class("ltxvideo2").load(
            ensure_builtin_model("tiny-ltxvideo2"), device=torch.device("cpu"),
            weight_dtype=torch.float32, loss_settings=LossSettings())
        clips = sorted((self.root / "clips").glob("tone*.mp4"))
        expected = []
        for clip in clips:  # the span read from the container: first frame's time, 9 frames
            with av.open(str(clip)) as container:
                first = next(container.decode(video=0))
                start = float(first.pts * first.time_base)
            sound = decode_audio(clip, ClipSpan(start, FRAMES / FPS), AudioRequest(16000, 2))
            self.assertEqual(sound.shape, (2, 6000))  # 0.375 s at the audio VAE's 16 kHz
            expected.append((start, audio_latents(adapter.audio_vae, sound[None], 9)[0]))
        for entry in self.entries[1]:
            start, duration = entry["audio_span"].tolist()
            self.assertEqual(duration, float(Fraction(FRAMES, FPS)))
            # 0.375 s of audio latents: round(0.375 * 16000 / 160 / 4) = 9, as LTX2Pipeline
            # sizes them for 9 frames at 24 fps
            self.assertEqual(tuple(entry["audio_latents"].shape), (9, 4))
            self.assertTrue(any(start == s and torch.allclose(entry["audio_latents"], latents,
                                                              atol=1e-5)
                                for s, latents in expected))

    def test_a_clip_without_audio_trains_video_only_and_is_named(self):
        silent = self.entries[0]
        self.assertEqual(len(silent), 1)
        self.assertEqual(silent[0]["audio_latents"].abs().max().item(), 0.0)
        self.assertIn("1 clips have no audio stream and train video-only (silent.mp4)",
                      self.logged)

    def test_the_validation_mp4_has_an_audio_track_as_long_as_its_frames(self):
        clip = self.out / "validation" / "step-3" / "clip-00.mp4"
        with av.open(str(clip)) as container:
            video, audio = container.streams.video[0], container.streams.audio[0]
            frames = sum(1 for _ in container.decode(video))
        with av.open(str(clip)) as container:
            samples = sum(frame.samples for frame in container.decode(audio=0))
        self.assertEqual(frames, FRAMES)
        self.assertEqual(audio.sample_rate, 16000)  # the vocoder's rate
        # AAC's encoder adds up to one frame (1024 samples) of padding at the end
        self.assertGreaterEqual(samples, 6000)
        self.assertLess(samples, 6000 + 2 * 1024)


if __name__ == "__main__":
    unittest.main()
