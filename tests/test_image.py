"""Image preparation: geometry over a grid of sizes and crop settings, and colour modes."""

from __future__ import annotations

import io
import random
import unittest

import numpy as np
import torch
from PIL import Image

from simpletuner.configuration import DatasetConfig, TrainingConfig
from simpletuner.helpers.metadata.buckets import SizeFilters
from simpletuner.helpers.multiaspect.image import (
    Downsample, crop_box, crop_rng, fit_to_target, load_rgb, prepare_image,
)

ORIGINALS = [(100, 60), (60, 100), (64, 64), (333, 127), (17, 200), (1000, 999)]
TARGETS = [(64, 64), (96, 64), (64, 96), (48, 80)]


def png_bytes(image: Image.Image, **save_args) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", **save_args)
    return buffer.getvalue()


def noise_image(width: int, height: int, seed: int = 0) -> Image.Image:
    values = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(values, "RGB")


class GeometryTest(unittest.TestCase):
    def test_output_matches_target_over_grid(self):
        for (ow, oh) in ORIGINALS:
            image = noise_image(ow, oh)
            for (tw, th) in TARGETS:
                for crop, style in [(False, "center"), (True, "center"), (True, "random")]:
                    with self.subTest(original=(ow, oh), target=(tw, th), crop=crop, style=style):
                        rng = crop_rng(3, "d", f"{ow}x{oh}") if style == "random" else None
                        out = fit_to_target(image, (tw, th), crop=crop, crop_style=style, rng=rng)
                        self.assertEqual(tuple(out.pixels.shape), (3, th, tw))
                        self.assertEqual(out.pixels.dtype, torch.float32)
                        self.assertGreaterEqual(float(out.pixels.min()), -1.0)
                        self.assertLessEqual(float(out.pixels.max()), 1.0)
                        self.assertEqual(out.original_size, (oh, ow))
                        self.assertEqual(out.target_size, (th, tw))
                        if not crop:
                            self.assertEqual(out.crop_top_left, (0, 0))

    def test_crop_box_covers_target_and_stays_inside(self):
        for (ow, oh) in ORIGINALS:
            for (tw, th) in TARGETS:
                for style in ("center", "random"):
                    rng = crop_rng(0, "d", "s") if style == "random" else None
                    (rw, rh), (left, top) = crop_box((ow, oh), (tw, th), style, rng)
                    with self.subTest(original=(ow, oh), target=(tw, th), style=style):
                        self.assertGreaterEqual(rw, tw)
                        self.assertGreaterEqual(rh, th)
                        # Scaled to cover: one side fits exactly (up to rounding).
                        self.assertTrue(rw - tw <= 1 or rh - th <= 1)
                        self.assertAlmostEqual(rw / rh, ow / oh, delta=0.05 * ow / oh + 0.02)
                        self.assertTrue(0 <= left <= rw - tw and 0 <= top <= rh - th)
                        if style == "center":
                            self.assertLessEqual(abs(left - (rw - tw - left)), 1)
                            self.assertLessEqual(abs(top - (rh - th - top)), 1)

    def test_crop_takes_the_reported_region(self):
        # At scale 1 the crop is exact, so the pixels must equal the source at the offset.
        source = noise_image(100, 64, seed=1)
        array = np.asarray(source)
        for style, seed_sample in [("center", None), ("random", "a.png"), ("random", "b.png")]:
            rng = crop_rng(7, "d", seed_sample) if seed_sample else None
            out = fit_to_target(source, (64, 64), crop=True, crop_style=style, rng=rng)
            top, left = out.crop_top_left
            expected = torch.from_numpy(array[top:top + 64, left:left + 64].copy())
            expected = expected.permute(2, 0, 1).float() / 127.5 - 1.0
            self.assertTrue(torch.allclose(out.pixels, expected, atol=1e-6), (style, left))

    def test_no_crop_keeps_the_whole_image(self):
        # Left half black, right half white: without crop both halves survive the resize.
        image = Image.new("RGB", (120, 60), (0, 0, 0))
        image.paste((255, 255, 255), (60, 0, 120, 60))
        out = fit_to_target(image, (64, 32), crop=False)
        self.assertLess(float(out.pixels[:, :, :28].max()), -0.9)
        self.assertGreater(float(out.pixels[:, :, 36:].min()), 0.9)

    def test_random_crop_reproducible_per_sample_and_varies_across_samples(self):
        image = noise_image(300, 64)
        data = png_bytes(image)
        offsets = []
        for i in range(20):
            first = prepare_image(data, (64, 64), crop=True, crop_style="random", seed=5,
                                  dataset_id="d", sample_id=f"img{i}.png")
            again = prepare_image(data, (64, 64), crop=True, crop_style="random", seed=5,
                                  dataset_id="d", sample_id=f"img{i}.png")
            self.assertEqual(first.crop_top_left, again.crop_top_left)
            self.assertTrue(torch.equal(first.pixels, again.pixels))
            offsets.append(first.crop_top_left)
        self.assertGreater(len(set(offsets)), 10)
        other_seed = [prepare_image(data, (64, 64), crop=True, crop_style="random", seed=6,
                                    dataset_id="d", sample_id=f"img{i}.png").crop_top_left
                      for i in range(20)]
        self.assertNotEqual(offsets, other_seed)

    def test_random_crop_leaves_global_rngs_alone(self):
        random.seed(11)
        torch.manual_seed(11)
        np.random.seed(11)
        state = (random.getstate(), torch.get_rng_state(), np.random.get_state()[1].copy())
        prepare_image(png_bytes(noise_image(200, 64)), (64, 64), crop=True,
                      crop_style="random", seed=1, dataset_id="d", sample_id="x")
        self.assertEqual(random.getstate(), state[0])
        self.assertTrue(torch.equal(torch.get_rng_state(), state[1]))
        self.assertTrue(np.array_equal(np.random.get_state()[1], state[2]))

    def test_random_style_without_rng_is_an_error(self):
        with self.assertRaisesRegex(ValueError, "crop_rng"):
            crop_box((100, 50), (50, 50), "random")


class DownsampleTest(unittest.TestCase):
    """SimpleTuner's maximum_image_size + target_downsample_size: a larger image is brought to
    the target size before the crop is cut."""

    def test_scale_in_each_resolution_unit(self):
        self.assertEqual(Downsample("pixel", 200, 150).scale(400, 300), 0.5)  # short edge 300
        self.assertIsNone(Downsample("pixel", 200, 150).scale(180, 300))
        self.assertAlmostEqual(Downsample("area", 0.1, 0.05).scale(1000, 1000),
                               (0.05 / 1.0) ** 0.5)
        self.assertEqual(Downsample("pixel_area", 512, 256).scale(1024, 1024), 0.25)

    def test_the_crop_comes_from_the_downsampled_image(self):
        # A white 240x240 square in the middle of 400x400 black: downsampled to 200 and cropped
        # to the centre 100x100 it is all white; cropped without it the black border remains.
        image = Image.new("RGB", (400, 400), (0, 0, 0))
        image.paste((255, 255, 255), (80, 80, 320, 320))
        downsampled = fit_to_target(image, (100, 100), crop=True,
                                    downsample=Downsample("pixel", 200, 200))
        self.assertEqual(downsampled.crop_top_left, (50, 50))
        self.assertGreater(float(downsampled.pixels.min()), 0.9)
        plain = fit_to_target(image, (100, 100), crop=True)
        self.assertEqual(plain.crop_top_left, (0, 0))
        self.assertLess(float(plain.pixels.min()), -0.9)
        small = Image.new("RGB", (150, 150))
        self.assertEqual(fit_to_target(small, (100, 100), crop=True, downsample=Downsample(
            "pixel", 200, 200)).crop_top_left, (0, 0))  # below the maximum: only covers

    def test_with_a_target_the_maximum_no_longer_skips(self):
        training = TrainingConfig(model_family="sd1x", pretrained_model_name_or_path="m",
                                  output_dir="o", data_backend_config="d", resolution=64)
        alone = DatasetConfig(id="a", maximum_image_size=128, resolution_type="pixel")
        paired = DatasetConfig(id="a", maximum_image_size=128, target_downsample_size=96,
                               resolution_type="pixel")
        self.assertIn("too large", SizeFilters.for_dataset(alone, training).reason_to_skip(
            400, 300))
        self.assertIsNone(SizeFilters.for_dataset(paired, training).reason_to_skip(400, 300))


class ModeTest(unittest.TestCase):
    def assert_rgb_pixel(self, data: bytes, expected: tuple[int, int, int], tolerance: int = 0):
        image = load_rgb(data)
        self.assertEqual(image.mode, "RGB")
        pixel = np.asarray(image)[0, 0].astype(int)
        self.assertTrue(np.all(np.abs(pixel - expected) <= tolerance), (pixel, expected))
        tensor = prepare_image(data, (8, 8), crop=False).pixels
        self.assertEqual(tuple(tensor.shape), (3, 8, 8))
        self.assertTrue(-1.0 <= float(tensor.min()) and float(tensor.max()) <= 1.0)

    def test_cmyk(self):
        buffer = io.BytesIO()
        Image.new("CMYK", (16, 16), (0, 255, 255, 0)).save(buffer, format="JPEG", quality=95)
        self.assert_rgb_pixel(buffer.getvalue(), (255, 0, 0), tolerance=8)

    def test_palette_with_transparency_is_composited_on_white(self):
        image = Image.new("P", (16, 16), 0)
        image.putpalette([0, 0, 0] + [0, 0, 255] * 255)
        image.info["transparency"] = 0
        self.assert_rgb_pixel(png_bytes(image, transparency=0), (255, 255, 255))

    def test_rgba_transparent_is_white_and_opaque_kept(self):
        image = Image.new("RGBA", (16, 16), (0, 255, 0, 0))
        image.putpixel((1, 0), (0, 255, 0, 255))
        loaded = np.asarray(load_rgb(png_bytes(image)))
        self.assertEqual(loaded[0, 0].tolist(), [255, 255, 255])
        self.assertEqual(loaded[0, 1].tolist(), [0, 255, 0])

    def test_sixteen_bit_grayscale_is_scaled_not_clipped(self):
        values = np.full((16, 16), 32768, dtype=np.uint16)
        data = png_bytes(Image.fromarray(values))
        self.assert_rgb_pixel(data, (128, 128, 128), tolerance=1)

    def test_grayscale_and_gray_alpha(self):
        self.assert_rgb_pixel(png_bytes(Image.new("L", (16, 16), 77)), (77, 77, 77))
        self.assert_rgb_pixel(png_bytes(Image.new("LA", (16, 16), (0, 0))), (255, 255, 255))
        self.assert_rgb_pixel(png_bytes(Image.new("1", (16, 16), 1)), (255, 255, 255))

    def test_exif_orientation_is_applied(self):
        image = Image.new("RGB", (40, 20), (0, 0, 0))
        image.putpixel((0, 0), (255, 0, 0))
        exif = Image.Exif()
        exif[0x0112] = 6  # "rotate 90 clockwise to display"
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", exif=exif)
        loaded = load_rgb(buffer.getvalue())
        self.assertEqual(loaded.size, (20, 40))
        self.assertEqual(np.asarray(loaded)[0, 19].tolist(), [255, 0, 0])
        out = prepare_image(buffer.getvalue(), (16, 32), crop=False)
        self.assertEqual(out.original_size, (40, 20))

    def test_truncated_file_raises(self):
        data = png_bytes(noise_image(64, 64))
        with self.assertRaises(OSError):
            load_rgb(data[: len(data) // 2])


if __name__ == "__main__":
    unittest.main()
