"""SimpleTuner's own example and quickstart configs pass `python -m simpletuner check` with only
their paths changed, or are refused only for features this trainer does not have, each named.
Paths point at the built-in tiny models and a folder of generated images. The examples' datasets
are `type: huggingface` with Hub ids: they are kept as they are, the ids served from a Hugging
Face cache (HF_HOME) where a snapshot of each was downloaded, as README says to do first.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import unittest
from pathlib import Path

from PIL import Image

from huggingface_fixtures import hub_snapshot, shape_rows
from launching import run_bounded
from training_fixtures import environment, make_shapes

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "simpletuner"
PATH_KEYS = ("cache_dir_vae", "cache_dir")
# Example -> the SimpleTuner options it is refused for: features that do not exist here.
EXAMPLES = {
    "sd1x-dreamshaper.peft-lora": set(),
    "sd3.peft-lora": set(),
    "flux.peft-lora": set(),
    "sdxl.lycoris-lokr": set(),
    "sdxl.peft-controlnet-lora": {"controlnet", "conditioning"},
    "sd3.peft-controlnet-lora": {"controlnet", "conditioning"},
    "flux.peft-controlnet-lora": {"controlnet", "conditioning", "flux_lora_target"},
    "flux.peft-lora+TREAD": set(),
}
REFUSED = re.compile(r"SimpleTuner option '([a-z_0-9]+)' is not supported here")
HUB_IDS = ("RareConcepts/Domokun", "keras-dreambooth/minercraft")  # the examples' dataset_name


def downloaded_hub(root: Path) -> Path:
    """An HF_HOME under ``root`` holding a snapshot of each example dataset (four 160 px
    images with captions), as `hf download --repo-type dataset <id>` leaves it."""
    hf_home = root / "hf-home"
    for repo_id in HUB_IDS:
        hub_snapshot(hf_home, repo_id, shape_rows([(160, 160)] * 4), root)
    return hf_home


def local_paths(datasets: list, root: Path, name: str) -> list:
    """The same entries with their paths under ``root``; a huggingface entry keeps its Hub id."""
    changed = []
    for entry in datasets:
        entry = dict(entry)
        if entry.get("type", "local") == "local" and entry.get("dataset_type", "image") in (
                "image", "eval"):
            entry["instance_data_dir"] = str(root / "images")
        for key in PATH_KEYS:
            if key in entry:
                entry[key] = str(root / name / "cache" / Path(entry[key]).name)
        changed.append(entry)
    return changed


def write_example(root: Path, name: str, config: dict, datasets: list) -> Path:
    """The config and its dataset file under ``root`` with only their paths changed."""
    backend = root / f"{name}.multidatabackend.json"
    backend.write_text(json.dumps(local_paths(datasets, root, name)))
    config = {**config, "data_backend_config": str(backend),
              "output_dir": str(root / name / "output"),
              "pretrained_model_name_or_path": f"builtin:tiny-{config['model_family']}"}
    if "lycoris_config" in config:  # the example's own file, beside it in the fixtures
        config["lycoris_config"] = str(FIXTURES / "examples" / f"{name}.lycoris_config.json")
    path = root / f"{name}.config.json"
    path.write_text(json.dumps(config, ensure_ascii=False))
    return path


def hub_environment(tmp: str, hf_home: Path) -> dict[str, str]:
    return {**environment(tmp), "HF_HOME": str(hf_home)}


def run_check(path: Path, hf_home: Path) -> tuple[int, str]:
    """``python -m simpletuner check`` as ./train.sh runs it: (exit status, its report)."""
    tmp = path.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    result = run_bounded([sys.executable, "-m", "simpletuner", "check", "--config", str(path)],
                         tmpdir=tmp, env=hub_environment(str(tmp), hf_home), timeout=120,
                         cwd=path.parent)
    return result.returncode, result.stderr


def example(name: str) -> tuple[dict, list]:
    config = json.loads((FIXTURES / "examples" / f"{name}.config.json").read_text("utf-8"))
    backend = FIXTURES / "examples" / Path(config["data_backend_config"]).name
    return config, json.loads(backend.read_text("utf-8"))


class SimpleTunerExamplesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.root = Path(cls._tmp.name)
        make_shapes(cls.root / "images", per_size=2, sizes=((64, 64),))
        cls.hf_home = downloaded_hub(cls.root)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def check(self, name: str, config: dict, datasets: list) -> tuple[int, str]:
        return run_check(write_example(self.root, name, config, datasets), self.hf_home)

    def test_each_example_passes_or_is_refused_only_for_missing_features(self):
        for name, refused in EXAMPLES.items():
            with self.subTest(example=name):
                status, report = self.check(name, *example(name))
                problems = [line for line in report.splitlines() if line.startswith("  - ")]
                self.assertEqual(status, 0 if not refused else 2, report)
                self.assertEqual(len(problems), len(refused), report)
                self.assertEqual({REFUSED.search(p).group(1) for p in problems}, refused, report)

    def test_the_sd3_and_sdxl_quickstart_configs_pass(self):
        library = self.root / "user_prompt_library.json"
        library.write_text((FIXTURES / "quickstart" / "flux.user_prompt_library.json").read_text())
        for family in ("sd3", "sdxl"):
            with self.subTest(family=family):
                config = json.loads((FIXTURES / "quickstart" / f"{family}.config.json")
                                    .read_text())
                if "user_prompt_library" in config:
                    config["user_prompt_library"] = str(library)
                config["max_train_steps"] = 10  # config.json.example's, which the guides edit
                datasets = json.loads((FIXTURES / "quickstart" / f"{family}.multidatabackend.json")
                                      .read_text())
                status, report = self.check(f"quickstart-{family}", config, datasets)
                self.assertEqual(status, 0, report)

    def test_the_flux_quickstart_datasets_pass_with_their_regularisation_data(self):
        datasets = json.loads((FIXTURES / "quickstart" / "flux.multidatabackend.json").read_text())
        self.assertTrue(any(d.get("is_regularisation_data") for d in datasets))
        config = {"model_family": "flux", "model_type": "lora", "max_train_steps": 10}
        status, report = self.check("quickstart-flux", config, datasets)
        self.assertEqual(status, 0, report)


class SimpleTunerExampleRunTest(unittest.TestCase):
    def test_the_sd1x_example_trains_validates_and_exports(self):
        """The example as SimpleTuner ships it (paths changed), for one step from the command
        line: its Hugging Face dataset from the Hub cache, 512 px crops of 160 px images (its
        minimum_image_size is 128), LoRA, its seed."""
        with tempfile.TemporaryDirectory() as tmp:
            root, name = Path(tmp), "sd1x-dreamshaper.peft-lora"
            hf_home = downloaded_hub(root)
            path = write_example(root, name, *example(name))
            status, report = run_check(path, hf_home)
            self.assertEqual(status, 0, report)
            result = run_bounded([sys.executable, "-m", "simpletuner.train", "--config", path,
                                  "--max_train_steps", "1"],
                                 tmpdir=tmp, env=hub_environment(tmp, hf_home), timeout=400)
            self.assertEqual(result.returncode, 0, result.stderr[-3000:])
            output = root / name / "output"
            (image,) = (output / "validation" / "step-1").glob("image-*.png")
            self.assertEqual(Image.open(image).size, (512, 512))  # its validation_resolution
            self.assertTrue((output / "lora" / "pytorch_lora_weights.safetensors").is_file())
            summary = json.loads((output / "training_summary.json").read_text())
            self.assertEqual((summary["seed"], summary["steps"]), (42, 1))

if __name__ == "__main__":
    unittest.main()
