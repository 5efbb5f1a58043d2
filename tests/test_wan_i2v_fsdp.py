"""FSDP2 for Wan 2.1 image-to-video on CPU: a full run of builtin:tiny-wan-i2v on clips (the
first-frame condition and CLIP embedding cached with each clip's latents) in two gloo
processes sharded per block, against two DDP processes on the same data and seed: the same
weights after the same steps, weights that moved, and one shard per rank of about half."""

from __future__ import annotations

import shutil
import tempfile
import unittest
from pathlib import Path

from test_fsdp_training import TRANSFORMER_WEIGHTS, DdpFsdpPair
from video_fixtures import write_clip


class WanI2VFullFsdpTest(DdpFsdpPair, unittest.TestCase):
    options = {"model_family": "wan", "pretrained_model_name_or_path": "builtin:tiny-wan-i2v",
               "model_flavour": "i2v-480p-14b-2.1", "resolution": 48, "train_batch_size": 1,
               "learning_rate": 1e-3}
    weights = TRANSFORMER_WEIGHTS

    @classmethod
    def setUpClass(cls):
        clips = Path(tempfile.mkdtemp(prefix="st-fsdp-clips-"))
        cls.addClassCleanup(shutil.rmtree, clips, ignore_errors=True)
        for i in range(4):
            write_clip(clips / f"walk{i}.mp4", 64, 48, 5, seed=i,
                       caption=f"a square walking, take {i}")
        cls.datasets = [{"id": "clips", "dataset_type": "video", "instance_data_dir": str(clips),
                         "video": {"bucket_strategy": "resolution_frames"}}]
        super().setUpClass()


if __name__ == "__main__":
    unittest.main()
