"""SimpleTuner's own example and quickstart configs pass `python -m simpletuner check` with only
their paths changed, or are refused only for features this trainer does not have, each named.
Paths point at the built-in tiny models and a folder of generated images. The examples' datasets
are `type: huggingface` with Hub ids: they are kept as they are, the ids served from a Hugging
Face cache (HF_HOME) where a snapshot of each was downloaded, as README says to do first.
"""

from __future__ import annotations

import json
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
FILE_KEYS = ("lycoris_config", "user_prompt_library")  # files beside the examples
# What SimpleTuner's examples use that does not exist here, by feature: the keys refused.
CHECKPOINT_STRIDE = {"gradient_checkpointing_segment_stride"}
RAMTORCH = {"ramtorch"}                            # weights streamed from RAM
SDNQ = {"base_model_precision"}                    # base_model_precision 'int8-sdnq'
CONTROLNET = {"controlnet"}                        # ControlNet-LoRA (model_type lora)
CONTROL = {"conditioning"}                         # control (canny, kontext) conditioning data
DISTILLATION = {"distillation_method"}
CREPA = {"crepa_enabled"}
WEBSHART = {"type", "caption_strategy", "metadata_backend", "source", "subfolder"}  # webshart
CAPTION_DATASETS = {"dataset_type", "caption_file_extensions"}  # text-only datasets
HUB_CLIPS = {"dataset_type", "video_column"}       # clips from a datasets-library split
IDEOGRAM_ENHANCER = {"ideogram_auto_json", "ideogram_prompt_enhancer_head_id",
                     "ideogram_schedule_mu", "ideogram_schedule_std", "ideogram_validation"}
QWEN_21 = CREPA | WEBSHART | {"webshart"}
ANYFLOW = DISTILLATION | WEBSHART | {"webshart", "metadata"}
ASSISTANT = DISTILLATION | CAPTION_DATASETS
# Example (`simpletuner/examples/<name>/config.json` of the 4.10.1 wheel, every one of a family
# supported here whose files the wheel holds) -> the keys it is refused for.
EXAMPLES = {
    "sd1x-dreamshaper.peft-lora": set(),
    "sd3.peft-lora": set(),
    "flux.peft-lora": set(),
    "sdxl.lycoris-lokr": set(),
    "auraflow.peft-lora": set(),
    "chroma.peft-lora": set(),
    "lumina2.peft-lora": set(),
    "z-image.peft-lora": set(),
    "sdxl.peft-controlnet-lora": CONTROLNET,
    "sd3.peft-controlnet-lora": CONTROLNET,
    "auraflow.peft-controlnet-lora": CONTROLNET,
    "flux.peft-controlnet-lora": CONTROLNET | {"flux_lora_target"},  # its 'controlnet' targets
    "flux.peft-lora+TREAD": set(),
    "kontext.peft-lora": CONTROL,
    "flux2-klein-9b-i2i.lycoris-lokr": CONTROL,
    "flux2.peft-lora": SDNQ,
    "flux2.peft-lora+TREAD": SDNQ | {"tread_config"},  # TREAD: Flux and Wan only
    "krea2.peft-lora": SDNQ,
    "z-image-turbo.peft-lora": SDNQ,
    "z-image-turbo.peft-lora+canny-conditioning": CONTROL,
    "z-image-turbo.peft-lora+canny-conditioning-ddp8": CONTROL,
    "ernie.peft-lora": RAMTORCH,
    "sana.lycoris-lokr": {"delete_problematic_images", "evaluation_type"},  # CLIP scores
    "ideogram-fp8.peft-lora": IDEOGRAM_ENHANCER,
    "ideogram-image-24g.peft-lora": IDEOGRAM_ENHANCER,
    "ideogram-image-32g.peft-lora": IDEOGRAM_ENHANCER,
    "ideogram-image-48g.peft-lora": IDEOGRAM_ENHANCER | {"ideogram_fp8_base_upcast"},
    "ideogram-image-80g.peft-lora": (IDEOGRAM_ENHANCER
                                     | CHECKPOINT_STRIDE | {"ideogram_fp8_base_upcast"}),
    "qwen_image.peft-lora": QWEN_21,
    "qwen_image-2.1-24g.peft-lora": QWEN_21,
    "qwen_image-2.1-32g.peft-lora": QWEN_21,
    "qwen_image-2.1-48g.peft-lora": QWEN_21,
    "qwen_image-2.1-80g.peft-lora": QWEN_21,
    "qwen_image-2.1-144g.peft-lora": QWEN_21,
    "qwen_image-2.1-anyflow-stage1.peft-lora": ANYFLOW,
    "qwen_image-2.1-anyflow-stage2.peft-lora": ANYFLOW,
    "qwen_image-2.1-anyflow-stage3.peft-lora": ANYFLOW,
    "qwen_image-2.1-assistant-lora.peft-lora": ASSISTANT,
    "qwen_image-2.1-assistant-lora-multires.peft-lora": ASSISTANT,
    "qwen_image-2.1-assistant-lora-offline.peft-lora": WEBSHART,
    "wan-1.3b.peft-lora+TREAD": HUB_CLIPS,
    "wan-2.2-i2v-a14b-high.peft-lora+TREAD": HUB_CLIPS,
    "wan-2.2-i2v-a14b-low.peft-lora+TREAD": HUB_CLIPS,
    "wan2.1-i2v-14b-480p-8xh100.peft-lora+cp-fa3": HUB_CLIPS,
    "wan2.1-i2v-14b-720p-8xh100.peft-lora+cp-fa3": HUB_CLIPS,
    "wan2.1-t2v-14b-480p-8xh100.peft-lora+cp-fa3": HUB_CLIPS,
    "wan2.1-t2v-1.3b-480p-single-gpu.peft-lora+ramtorch": HUB_CLIPS | RAMTORCH,
    "wan2.1-t2v-14b-480p-single-gpu.peft-lora+ramtorch": HUB_CLIPS | RAMTORCH,
    "kolors.peft-lora": set(),
    "hidream.peft-lora": {"evaluation_type", "prodigy_steps"},
    "kandinsky5-image-6b-t2i.lycoris-lokr": set(),
}
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
        if entry.get("type", "local") == "local" and "instance_data_dir" in entry:
            entry["instance_data_dir"] = str(root / "images")
        for key in PATH_KEYS:
            if key in entry:
                entry[key] = str(root / name / "cache" / Path(entry[key]).name)
        changed.append(entry)
    return changed


def fixture_file(path: str) -> Path:
    """The fixture copy of a file an example names: an example folder's own file as
    <folder>.<file>, a file of the examples folder under its name."""
    folder, file = Path(path).parent.name, Path(path).name
    own = FIXTURES / "examples" / f"{folder}.{file}"
    return own if own.is_file() else FIXTURES / "examples" / file


def write_example(root: Path, name: str, config: dict, datasets: list) -> Path:
    """The config and its dataset file under ``root`` with only their paths changed: the model
    (and a component path that named the model too), data, output and the files it names."""
    config = {key.removeprefix("--"): value for key, value in config.items()}
    backend = root / f"{name}.multidatabackend.json"
    backend.write_text(json.dumps(local_paths(datasets, root, name)))
    model = f"builtin:tiny-{config['model_family']}"
    original = config.get("pretrained_model_name_or_path")
    config = {key: model if original is not None and value == original else value
              for key, value in config.items()}
    config.update(data_backend_config=str(backend), output_dir=str(root / name / "output"),
                  pretrained_model_name_or_path=model)
    for key in FILE_KEYS:  # SimpleTuner's relative path: the fixture copy
        if isinstance(config.get(key), str) and not Path(config[key]).is_absolute():
            config[key] = str(fixture_file(config[key]))
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
    backend = {k.removeprefix("--"): v for k, v in config.items()}["data_backend_config"]
    return config, json.loads(fixture_file(backend).read_text("utf-8"))


# What `check` runs, for many configs in one interpreter: config path -> its problems' keys.
CHECK_MANY = """
import json, sys
from pathlib import Path
from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.training.run.launch_checks import launch_problems
found = {}
for path in json.loads(sys.argv[1]):
    try:
        problems = launch_problems(load_configuration(path, cwd=Path(path).parent))
    except ConfigError as exc:
        problems = exc.records
    found[path] = [[problem.key, str(problem)] for problem in problems]
print(json.dumps(found))
"""


def check_many(paths: list[Path], hf_home: Path) -> dict[Path, list[list[str]]]:
    """``python -m simpletuner check``'s problems of each config, as [key, message] pairs."""
    tmp = paths[0].parent / "tmp"
    tmp.mkdir(exist_ok=True)
    result = run_bounded([sys.executable, "-c", CHECK_MANY, json.dumps([str(p) for p in paths])],
                         tmpdir=tmp, env=hub_environment(str(tmp), hf_home), timeout=300)
    if result.returncode != 0:
        raise AssertionError(result.stderr[-3000:])
    return {Path(path): problems for path, problems in json.loads(result.stdout).items()}


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
        """Every example, checked as `check` does, in one interpreter (SimpleTuner's examples
        are many; train.sh's own check path is tested by the quickstart configs below)."""
        paths = {name: write_example(self.root, name, *example(name)) for name in EXAMPLES}
        found = check_many(list(paths.values()), self.hf_home)
        self.assertEqual(len(paths), len(list((FIXTURES / "examples").glob("*.config.json"))))
        for name, refused in EXAMPLES.items():
            with self.subTest(example=name):
                problems = found[paths[name]]
                self.assertEqual({key for key, _ in problems}, refused,
                                 "\n".join(message for _, message in problems))

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
