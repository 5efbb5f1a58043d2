"""The schedule keys in multidatabackend.json (probability, start_epoch, start_step,
is_regularisation_data): SimpleTuner's values accepted, mistakes reported before heavy work,
every one at once, each naming the dataset, the key and what to do; a start that only the
bucket sizes show to come too late is the same kind of error, on every rank."""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path

from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.multiaspect.dataset_schedule import DatasetSchedule
from simpletuner.helpers.multiaspect.sampler import MultiAspectSampler, SamplerDataset
from test_plan_cli import run_plan
from training_fixtures import make_shapes, write_config


class ScheduleKeysTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.root = Path(self._tmp.name)
        (self.root / "images").mkdir()

    def load(self, options: dict, datasets: list[dict]):
        backend = self.root / "multidatabackend.json"
        backend.write_text(json.dumps(datasets))
        config = {"model_family": "sd1x", "pretrained_model_name_or_path": "builtin:tiny-sd1x",
                  "output_dir": "out", "data_backend_config": str(backend),
                  "max_train_steps": 100, **options}
        (self.root / "config.json").write_text(json.dumps(config))
        return load_configuration(self.root / "config.json", cwd=self.root)

    def problems(self, options: dict, datasets: list[dict]) -> list[str]:
        with self.assertRaises(ConfigError) as caught:
            self.load(options, datasets)
        return caught.exception.problems

    def dataset(self, dataset_id: str = "photos", **keys) -> dict:
        return {"id": dataset_id, "instance_data_dir": str(self.root / "images"), **keys}

    def test_simpletuners_keys_are_read_with_its_spelling_and_defaults(self):
        config = self.load({"model_type": "lora"}, [
            self.dataset(probability=0.7), self.dataset("reg", is_regularization_data=True,
                                                        start_epoch=0),
            self.dataset("late", start_epoch=2, start_step=40)])
        photos, reg, late = config.datasets
        self.assertEqual((photos.probability, photos.start_epoch, photos.start_step,
                          photos.is_regularisation_data), (0.7, 1, 0, False))
        self.assertTrue(reg.is_regularisation_data)
        self.assertEqual(DatasetSchedule.of(reg), DatasetSchedule())  # start_epoch 0 is 1
        self.assertEqual((late.start_epoch, late.start_step), (2, 40))

    def test_every_mistake_at_once(self):
        problems = self.problems({"model_type": "full"}, [
            self.dataset(probability=1.5), self.dataset("never", probability=0),
            self.dataset("reg", is_regularisation_data=True),
            self.dataset("held", dataset_type="eval", start_step=3),
            self.dataset("late", start_step=101)])
        text = "\n".join(problems)
        self.assertEqual(len(problems), 5, text)
        self.assertIn("key 'probability'", problems[0])
        self.assertIn("dataset 'never': probability 0 would never draw it; set 'disabled': true",
                      text)
        self.assertIn("dataset 'reg': is_regularisation_data takes the base model's prediction "
                      "as the target, which needs model_type 'lora'", text)
        self.assertIn("dataset 'held': start_step shape training; an 'eval' dataset", text)
        self.assertIn("dataset 'late': start_step 101 is after the last step (max_train_steps "
                      "100)", text)
        self.assertNotIn("did you mean", text)

    def test_something_must_start_at_once_and_before_the_last_epoch(self):
        (problem,) = self.problems({}, [self.dataset(start_step=5),
                                        self.dataset("b", start_epoch=2)])
        self.assertIn("no training dataset starts at the first step ('photos' start_epoch 1, "
                      "start_step 5; 'b' start_epoch 2, start_step 0)", problem)
        (problem,) = self.problems({"max_train_steps": None, "num_train_epochs": 2},
                                   [self.dataset(), self.dataset("b", start_epoch=3)])
        self.assertIn("dataset 'b': start_epoch 3 is after the last epoch (num_train_epochs 2)",
                      problem)


class JoinsTooLateTest(unittest.TestCase):
    """start_step within max_train_steps can still be unreachable when start_epoch holds the
    dataset back: found from the bucket sizes, so on every rank alike."""

    def test_a_dataset_that_never_joins_in_time_is_a_configuration_error(self):
        a = SamplerDataset(DatasetIndex("a", {"64x64": [f"{i}.png" for i in range(8)]}, {}),
                           str, 1)
        b = SamplerDataset(DatasetIndex("b", {"64x64": [f"b{i}.png" for i in range(4)]}, {}),
                           str, 1, schedule=DatasetSchedule(start_epoch=3))
        sampler = MultiAspectSampler([a, b], seed=1, processes=1, rank=0, accumulation=1)
        sampler.timeline.check_every_dataset_joins(17)  # epochs of 8 steps: epoch 3 at 17
        with self.assertRaises(ConfigError) as caught:
            sampler.timeline.check_every_dataset_joins(16)
        self.assertIn("dataset 'b': start_epoch 3, start_step 0 come after the last of the 16 "
                      "optimizer steps", str(caught.exception))


class PlanShowsTheScheduleTest(unittest.TestCase):
    def test_probabilities_start_points_and_where_each_joins(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            make_shapes(root / "a", per_size=8, sizes=((64, 64),))
            make_shapes(root / "b", per_size=4, sizes=((64, 64),))
            config = write_config(root, root / "a", model_type="lora", max_train_steps=20,
                                  train_batch_size=1, data_backend_sampling="uniform", datasets=[
                {"id": "a", "instance_data_dir": str(root / "a"), "probability": 0.25},
                {"id": "b", "instance_data_dir": str(root / "b"), "start_step": 11,
                 "is_regularisation_data": True}])
            result = run_plan(config, "--json")
            self.assertEqual(result.returncode, 0, result.stderr[-2000:])
            schedule = json.loads(result.stdout)["schedule"]
            self.assertEqual(schedule["a"]["share"], 0.2)  # 0.25 / (0.25 + 1)
            self.assertEqual(schedule["a"]["sampling"], "uniform")
            # a: 8 steps per epoch; b may start at step 11: epoch 2 (steps 9..) at its step 3
            self.assertEqual(schedule["b"]["joins"],
                             {"epoch": 2, "step_of_epoch": 3, "optimizer_step": 11})
            self.assertTrue(schedule["b"]["is_regularisation_data"])
            self.assertEqual(json.loads(run_plan(config, "--json", "--num-processes", "1").stdout)
                             ["split"]["micro_batches_per_epoch"], [8, 12, 12])  # b from epoch 1
            text = run_plan(config).stdout
            self.assertIn("gradient accumulation 1, data_backend_sampling uniform:", text)
            self.assertIn("dataset 'a': probability 0.25 (20.0% of the odds per step while it has "
                          "groups left), start_epoch 1, "
                          "start_step 0: joins epoch 1 (trace epoch 0) at its step 1 (optimizer step 1)", text)
            self.assertIn("dataset 'b': probability 1 (80.0% of the odds per step while it has "
                          "groups left), start_epoch 1, "
                          "start_step 11: joins epoch 2 (trace epoch 1) at its step 3 (optimizer step 11); "
                          "regularisation (target: the base model's prediction)", text)


if __name__ == "__main__":
    unittest.main()
