"""A full disk (a real ENOSPC: a 64 KB tmpfs, which needs root and mount) makes every write
fail naming its path: the atomic writes the caches use, the export, and a run's latent cache."""

from __future__ import annotations

import errno
import shutil
import tempfile
import unittest
from pathlib import Path

import numpy as np
import torch
from diffusers import DiffusionPipeline
from safetensors.torch import save_file

from simpletuner.common.atomic import atomic_write_bytes, atomic_write_json, atomic_write_with
from simpletuner.helpers.metadata.index_file import write_columns
from simpletuner.models.base import LossSettings
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.pipelines import export_pipeline
from simpletuner.models.registry import get_adapter_class
from simpletuner.training.adapters.lora import LORA_WEIGHTS, add_lora, export_lora

from launching import run_bounded
from training_fixtures import make_shapes, run_training, write_config

BIG = 200_000  # bytes: more than the tmpfs holds


class FullDiskCase(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="st-full-disk-"))
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.full = self.tmp / "full"
        self.full.mkdir()
        mounted = run_bounded(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", self.full],
                              tmpdir=self.tmp, timeout=60)
        if mounted.returncode != 0:
            self.skipTest(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
        self.addCleanup(self.unmount)

    def unmount(self) -> None:
        unmounted = run_bounded(["umount", self.full], tmpdir=self.tmp, timeout=60)
        self.assertEqual(unmounted.returncode, 0, unmounted.stderr)

    def assertNamesTheFullDisk(self, exc: OSError, path: Path) -> None:
        self.assertEqual(exc.errno, errno.ENOSPC, exc)
        self.assertIn(f"No space left on device: '{path}'", str(exc))


class AtomicWriteTest(FullDiskCase):
    def test_each_kind_of_atomic_write_names_its_file_and_leaves_no_temporary(self):
        tensors = {"latent": torch.zeros(BIG // 4)}
        writes = {
            "bytes.bin": lambda path: atomic_write_bytes(path, b"x" * BIG),
            "streamed.json": lambda path: atomic_write_json(path, ["x" * 100] * (BIG // 100)),
            "tensors.safetensors": lambda path: atomic_write_with(
                path, lambda temporary: save_file(tensors, temporary)),
            "columns.index": lambda path: write_columns(  # written by a thread of its own
                path, {}, {"ids": np.zeros(BIG, np.uint8)}),
        }
        for name, write in writes.items():
            with self.subTest(name):
                path = self.full / "cache" / name
                with self.assertRaises(OSError) as caught:
                    write(path)
                self.assertNamesTheFullDisk(caught.exception, path)
                self.assertEqual(list((self.full / "cache").iterdir()), [])

    def test_an_export_names_the_pipeline_folder_and_leaves_nothing(self):
        pipeline = DiffusionPipeline.from_pretrained(ensure_builtin_model("tiny-sd1x"))
        with self.assertRaises(OSError) as caught:
            export_pipeline(pipeline, self.full)
        self.assertNamesTheFullDisk(caught.exception, self.full / "pipeline")
        self.assertEqual(list(self.full.iterdir()), [])

    def test_a_lora_export_names_its_file_and_leaves_no_staging_folder(self):
        family = get_adapter_class("sd1x")
        adapter = family.load(ensure_builtin_model("tiny-sd1x"), device=torch.device("cpu"),
                              weight_dtype=torch.float32, loss_settings=LossSettings())
        add_lora(adapter.trainable, family, rank=64)  # more than the tmpfs holds
        with self.assertRaises(OSError) as caught:
            export_lora(family, adapter.trainable, self.full)
        self.assertNamesTheFullDisk(caught.exception, self.full / "lora" / LORA_WEIGHTS)
        self.assertEqual(list((self.full / "lora").iterdir()), [])


class CachingRunTest(FullDiskCase):
    def test_a_run_whose_latent_cache_is_full_stops_naming_the_file(self):
        make_shapes(self.tmp / "data", per_size=2, sizes=((64, 64),))
        with open(self.full / "filler", "wb", buffering=0) as filler:  # leave no byte free
            with self.assertRaises(OSError):
                while True:
                    filler.write(b"x" * 4096)
        cache = self.full / "latents"
        datasets = [{"id": "shapes", "instance_data_dir": str(self.tmp / "data"),
                     "caption_strategy": "textfile", "cache_dir_vae": str(cache)}]
        config = write_config(self.tmp, self.tmp / "data", "full", datasets=datasets,
                              max_train_steps=1)
        result = run_training(config, str(self.tmp), timeout=300)
        self.assertEqual(result.returncode, 1, result.stderr[-3000:])
        (stopped,) = [line for line in result.stderr.splitlines()
                      if "[rank 0] training stopped" in line]
        self.assertIn(f"No space left on device: '{cache}/", stopped)
        self.assertFalse([p for p in cache.rglob("*") if p.is_file()])  # no temporary left


if __name__ == "__main__":
    unittest.main()
