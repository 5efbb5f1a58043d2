"""Clips for training and validation: decoding to a bucket's frames (in order, rotated as
displayed, each frame fitted exactly as the same pixels as an image would be), a clip shorter
than its bucket skipped with its decoded count, Wan's video latents in the cache
([C, F', h, w], incremental, keyed by frames), validation's animated WebP and frame strip, and
the demo clip generator (deterministic, captions that say where the shape moves)."""

from __future__ import annotations

import hashlib
import io
import shutil
import sys
import tempfile
import unittest
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file

from launching import run_bounded
from model_fixtures import TinyModelCase
from settings_fixtures import settings
from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.demo_clips import COLOURS, demo_clips, ensure_demo_clips
from simpletuner.helpers.caching.latents import LatentSettings, cache_latents
from simpletuner.helpers.data_backend.local import LocalStorage
from simpletuner.helpers.metadata.backends.clip_probe import probe_clip
from simpletuner.helpers.metadata.index import ClipPlan, DatasetIndex
from simpletuner.helpers.multiaspect.clip import prepare_clip
from simpletuner.helpers.multiaspect.image import prepare_image
from simpletuner.training.reporting.report_data import read_report_data
from simpletuner.training.reporting.validation import run_validation
from simpletuner.training.settings import ValidationSettings
from training_fixtures import make_shapes, write_config
from video_fixtures import shapes_frame, write_clip


def displayed_frames(path: Path) -> list[np.ndarray]:
    """Every frame as PyAV decodes it, H x W x 3."""
    with av.open(str(path)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


def as_pixels(frame: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(frame.astype(np.float32)).permute(2, 0, 1) / 127.5 - 1


def clip_index(**clips: tuple[str, int, int]) -> DatasetIndex:
    """sample id -> (bucket size key, bucket frames, source frames)."""
    buckets: dict[str, list[str]] = {}
    for sample, (size, frames, _) in clips.items():
        buckets.setdefault(f"{size}@{frames}", []).append(sample)
    return DatasetIndex("clips", buckets, {s: (64, 48) for s in clips},
                        clips={s: ClipPlan(f, "16/1", n, "container")
                               for s, (_, f, n) in clips.items()})


class ClipDecodingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp())
        cls.walk = write_clip(cls.tmp / "walk.mp4", 64, 48, 13)
        cls.phone = write_clip(cls.tmp / "phone.mp4", 64, 48, 5, rotation=90)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_the_first_frames_in_order(self):
        clip = prepare_clip(self.walk, (64, 48), 9, crop=False)
        self.assertEqual(tuple(clip.pixels.shape), (3, 9, 48, 64))
        drawn = [as_pixels(shapes_frame(64, 48, i)) for i in range(13)]
        for index in range(9):  # each frame is nearest the frame drawn at its position
            errors = [(clip.pixels[:, index] - frame).abs().mean().item() for frame in drawn]
            self.assertEqual(int(np.argmin(errors)), index, errors)
            self.assertLess(errors[index], 0.05)

    def test_every_frame_is_fitted_as_an_image_of_its_pixels_with_one_crop(self):
        clip = prepare_clip(self.walk.read_bytes(), (32, 32), 5, crop=True, crop_style="random",
                            seed=3, dataset_id="clips", sample_id="walk.mp4")
        for index, frame in enumerate(displayed_frames(self.walk)[:5]):
            png = io.BytesIO()
            Image.fromarray(frame).save(png, format="PNG")
            image = prepare_image(png.getvalue(), (32, 32), crop=True, crop_style="random",
                                  seed=3, dataset_id="clips", sample_id="walk.mp4")
            self.assertTrue(torch.equal(clip.pixels[:, index], image.pixels), index)
            self.assertEqual(clip.crop_top_left, image.crop_top_left)
        self.assertEqual(clip.original_size, (48, 64))
        self.assertNotEqual(clip.crop_top_left, (0, 0))  # the random crop moved the box

    def test_a_rotated_clip_is_decoded_as_displayed(self):
        clip = prepare_clip(self.phone, (48, 64), 5, crop=False)
        self.assertEqual(tuple(clip.pixels.shape), (3, 5, 64, 48))
        self.assertEqual(clip.original_size, (64, 48))  # (height, width) as displayed
        turned = as_pixels(np.ascontiguousarray(np.rot90(shapes_frame(64, 48, 0))))
        self.assertLess((clip.pixels[:, 0] - turned).abs().mean().item(), 0.05)

    def test_a_clip_shorter_than_its_bucket_is_a_failed_sample_with_its_count(self):
        # the index says 13 frames (a container that overstates its count); 9 are there
        write_clip(self.tmp / "data" / "short.mp4", 64, 48, 9)
        write_clip(self.tmp / "data" / "fine.mp4", 64, 48, 9)
        index = clip_index(**{"short.mp4": ("64x48", 13, 13), "fine.mp4": ("64x48", 9, 9)})
        settings_ = LatentSettings("clips", LocalStorage(self.tmp / "data"), self.tmp / "vae",
                                   "model")
        result = cache_latents(index, settings_, lambda pixels: pixels.mean(1, keepdim=True),
                               progress=False)
        self.assertEqual(list(result.failures), ["short.mp4"])
        self.assertIn("decoded 9 frames, its bucket trains at 13", result.failures["short.mp4"])
        self.assertEqual(result.encoded, 1)


class VideoLatentCacheTest(TinyModelCase):
    def test_wan_latents_of_clips_are_cached_per_bucket_frames_and_reused(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            write_clip(root / "data" / "walk.mp4", 64, 48, 13)
            adapter = self.load("wan")
            storage = LocalStorage(root / "data")
            latent_settings = LatentSettings("clips", storage, root / "vae", "wan")

            def cache(frames: int):
                index = clip_index(**{"walk.mp4": ("64x48", frames, 13)})
                return cache_latents(index, latent_settings, adapter.encode_images,
                                     progress=False)

            first = cache(9)
            entry = load_file(first.cache.paths["walk.mp4"])["latent"]
            self.assertEqual(tuple(entry.shape), (16, 3, 6, 8))  # 9 frames: 1 + 8/4 latent
            pixels = prepare_clip(root / "data" / "walk.mp4", (64, 48), 9, crop=False).pixels
            expected = adapter.encode_images(pixels.unsqueeze(0))[0]
            torch.testing.assert_close(entry, expected, rtol=1e-5, atol=1e-6)
            self.assertEqual(cache(9).encoded, 0)  # a rerun encodes nothing
            longer = cache(13)  # another bucket's frames: another entry
            self.assertEqual(longer.encoded, 1)
            self.assertNotEqual(longer.cache.paths["walk.mp4"], first.cache.paths["walk.mp4"])
            self.assertEqual(load_file(longer.cache.paths["walk.mp4"])["latent"].shape[1], 4)


class ValidationClipsTest(TinyModelCase):
    def test_each_prompt_gets_an_animated_webp_and_a_strip_of_its_frames(self):
        with tempfile.TemporaryDirectory() as tmp:
            validation = settings(ValidationSettings, model_family="wan", output_dir=tmp,
                                  validation_prompt=["a red square", "a blue circle"],
                                  validation_resolution="64x48", validation_framerate=8,
                                  validation_num_video_frames=5,
                                  validation_num_inference_steps=2)
            paths = run_validation(self.load("wan"), validation, step=3)
            folder = Path(tmp) / "validation" / "step-3"
            self.assertEqual([p.name for p in paths],
                             ["clip-00.webp", "clip-00-frames.png", "clip-01.webp",
                              "clip-01-frames.png", "grid.png"])
            with Image.open(folder / "clip-01-frames.png") as strip:
                self.assertEqual((strip.size, strip.info["prompt"]), ((320, 48), "a blue circle"))
                strip_pixels = np.asarray(strip.convert("RGB"))
            with Image.open(folder / "clip-01.webp") as clip:
                self.assertEqual((clip.format, clip.size, clip.n_frames), ("WEBP", (64, 48), 5))
                self.assertTrue(clip.is_animated)
                for index in range(5):  # lossless: the strip's frames, each shown 1/8 s
                    clip.seek(index)
                    clip.load()  # Pillow reads a frame's duration with its pixels
                    self.assertEqual(clip.info["duration"], 125)
                    self.assertTrue(np.array_equal(np.asarray(clip.convert("RGB")),
                                                   strip_pixels[:, 64 * index:64 * (index + 1)]))
            with Image.open(folder / "grid.png") as grid:
                self.assertEqual(grid.size, (320, 96))
            shown = read_report_data(Path(tmp), verify_hashes=False).validation[3]  # the report
            self.assertEqual([(v.path, v.prompt, v.size) for v in shown],
                             [("validation/step-3/clip-00.webp", "a red square", (64, 48)),
                              ("validation/step-3/clip-01.webp", "a blue circle", (64, 48))])


class VideoValidationOptionsTest(unittest.TestCase):
    def load(self, family: str, **options):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            make_shapes(root / "data", per_size=1, sizes=((64, 64),))
            config = write_config(root, root / "data", model_family=family,
                                  pretrained_model_name_or_path=f"builtin:tiny-{family}",
                                  **options)
            return load_configuration(config, cwd=root).training

    def problems(self, family: str, **options) -> str:
        with self.assertRaises(ConfigError) as caught:
            self.load(family, **options)
        return str(caught.exception)

    def test_frames_the_vae_encodes_for_video_families_only_and_simpletuners_framerate(self):
        self.assertIn("key 'validation_num_video_frames' (16) is not a count wan's VAE encodes "
                      "(4n+1 frames); use 13 or 17",
                      self.problems("wan", validation_num_video_frames=16))
        refused = self.problems("sd1x", validation_num_video_frames=17)
        self.assertRegex(refused, r"key 'validation_num_video_frames' applies to the video "
                                  r"families \([^)]*\bwan\b[^)]*\); 'sd1x' validates with images")
        training = self.load("wan", validation_num_video_frames=17, framerate=8)
        self.assertEqual((training.validation_num_video_frames, training.validation_framerate),
                         (17, 8))
        self.assertIsNone(self.load("wan", framerate=None).validation_framerate)  # "not set"


class DemoClipsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp())
        cls.folder = ensure_demo_clips(cls.tmp / "first")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_two_generations_are_byte_identical(self):
        # A separate interpreter without torch: a lossy encoder's float path differed in one
        # with torch imported (this one), which lossless H.264 does not.
        second = self.tmp / "second"
        made = run_bounded([sys.executable, "-m", "simpletuner.demo_clips", second],
                           tmpdir=self.tmp, timeout=120)
        self.assertEqual(made.returncode, 0, made.stderr[-3000:])
        digests = [{p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                    for p in sorted(folder.iterdir())} for folder in (self.folder, second)]
        self.assertEqual(digests[0], digests[1])

    def test_clips_of_wan_frame_counts_at_16_fps_in_two_sizes(self):
        seen = set()
        for path in sorted(self.folder.glob("*.mp4")):
            probe = probe_clip(str(path), path.stat().st_size)
            self.assertIsNone(probe.error, path.name)
            self.assertEqual(Fraction(probe.fps), 16)
            self.assertEqual((probe.frames - 1) % 4, 0)
            seen.add((probe.width, probe.height, probe.frames))
        self.assertEqual(len(list(self.folder.glob("*.txt"))), len(demo_clips()))
        self.assertEqual(seen, {(64, 48, 17), (48, 64, 17), (64, 48, 21), (48, 64, 21)})

    def test_each_caption_says_where_its_shape_moves(self):
        moves = {"right": (1, 0), "left": (-1, 0), "down": (0, 1), "up": (0, -1)}
        for path in sorted(self.folder.glob("*.mp4")):
            caption = path.with_suffix(".txt").read_text().split()
            colour, direction = caption[1], caption[caption.index("moving") + 1]
            frames = displayed_frames(path)
            centres = []
            for frame in (frames[0], frames[-1]):  # the pixels nearest the shape's colour
                distance = np.abs(frame.astype(int) - COLOURS[colour]).sum(axis=2)
                ys, xs = np.nonzero(distance < 60)
                self.assertGreater(len(xs), 20, path.name)
                centres.append(np.array([xs.mean(), ys.mean()]))
            travel = centres[1] - centres[0]
            self.assertGreater(float(travel @ np.array(moves[direction])), 15, path.name)


if __name__ == "__main__":
    unittest.main()
