"""Edit pairs, pure: targets matched to references by path stem whatever either folder's listing
order, orphans and shared stems skipped on their own side, and every rank simulated over a
grid of sizes trains each kept target exactly once per epoch with its own references; the
audit's check catches a sample traced with another's reference; the dataset file's problems
with conditioning datasets are reported together."""

from __future__ import annotations

import contextlib
import io
import json
import random
import tempfile
import unittest
from collections import Counter
from pathlib import Path

from edit_fixtures import edit_datasets, make_edit_pairs
from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.planning import run_plan
from simpletuner.training.run.dataset_folders import output_dir_problems
from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.metadata.pairs import pair_references
from simpletuner.helpers.metadata.split import DatasetSpec, split_dataset
from simpletuner.helpers.multiaspect.sampler import MultiAspectSampler, SamplerDataset
from simpletuner.helpers.multiaspect.trace import trace_record
from simpletuner.helpers.multiaspect.verify import build_plan, verify
from training_fixtures import write_config

BUCKETS = ("64x64", "96x64")


def shuffled(ids: list[str], seed: int) -> list[str]:
    ids = list(ids)
    random.Random(seed).shuffle(ids)
    return ids


def target_index(count: int, seed: int) -> DatasetIndex:
    """``count`` targets t/NNNN.png over two buckets, each bucket listed in a shuffled order."""
    names = [f"t/{i:04d}.png" for i in range(count)]
    buckets = {key: shuffled(names[k::2], seed) for k, key in enumerate(BUCKETS)}
    return DatasetIndex("edits", buckets, {s: (64, 64) for s in names})


def reference_index(dataset_id: str, stems: list[str], seed: int) -> DatasetIndex:
    names = shuffled([f"{stem}.jpg" for stem in stems], seed)
    return DatasetIndex(dataset_id, {"64x64": names}, {s: (64, 64) for s in names})


def paired_grid_case(count: int, seed: int):
    """Every 5th target lacks its reference; two references have no target."""
    stems = [f"t/{i:04d}" for i in range(count) if i % 5 != 3] + ["t/extra-a", "u/extra-b"]
    return pair_references(target_index(count, seed), [reference_index("refs", stems, seed + 1)])


class PairingTest(unittest.TestCase):
    def test_the_pairing_does_not_depend_on_either_folders_listing_order(self):
        digests = {paired_grid_case(23, seed).target.digest() for seed in range(6)}
        self.assertEqual(len(digests), 1)

    def test_orphans_on_either_side_are_skipped_by_name_and_counted(self):
        paired = paired_grid_case(23, 0)
        lonely_targets = {f"t/{i:04d}.png" for i in range(23) if i % 5 == 3}
        self.assertEqual({s.path for s in paired.target.skipped}, lonely_targets)
        self.assertEqual(paired.target.sample_count, 23 - len(lonely_targets))
        self.assertEqual({s.path for s in paired.references[0].skipped},
                         {"t/extra-a.jpg", "u/extra-b.jpg"})
        for skipped in paired.target.skipped:
            self.assertIn("no usable reference named", skipped.reason)
            self.assertIn("refs", skipped.reason)
        for sample_id, refs in paired.target.references.items():
            self.assertEqual(refs, (sample_id.replace(".png", ".jpg"),))

    def test_files_sharing_a_stem_are_skipped_on_their_side_with_their_partner(self):
        target = DatasetIndex("edits", {"64x64": ["a.png", "a.jpg", "b.png", "c.png"]}, {})
        refs = DatasetIndex("refs", {"64x64": ["a.png", "b.jpg", "b.png", "c.webp"]}, {})
        paired = pair_references(target, [refs])
        self.assertEqual(dict(paired.target.references), {"c.png": ("c.webp",)})
        reasons = {s.path: s.reason for s in paired.target.skipped}
        self.assertEqual(set(reasons), {"a.png", "a.jpg", "b.png"})
        self.assertIn("2 files share the name 'a'", reasons["a.png"])
        ref_reasons = {s.path: s.reason for s in paired.references[0].skipped}
        self.assertEqual(set(ref_reasons), {"a.png", "b.jpg", "b.png"})
        self.assertIn("share the name 'b'", ref_reasons["b.jpg"])

    def test_several_conditioning_datasets_give_references_in_their_order(self):
        target = DatasetIndex("edits", {"64x64": ["x.png", "y.png"]}, {})
        first = DatasetIndex("first", {"64x64": ["x.jpg", "y.jpg"]}, {})
        second = DatasetIndex("second", {"64x64": ["x.webp"]}, {})
        paired = pair_references(target, [first, second])
        self.assertEqual(dict(paired.target.references), {"x.png": ("x.jpg", "x.webp")})
        (skipped,) = paired.target.skipped
        self.assertEqual(skipped.path, "y.png")
        self.assertIn("second", skipped.reason)
        self.assertNotIn("first", skipped.reason)
        self.assertEqual([s.path for s in paired.references[0].skipped], ["y.jpg"])


def simulate(index: DatasetIndex, processes: int, batch: int, accumulation: int, epochs: int):
    """Every rank's micro-batches, each rank a sampler of its own as on a real run."""
    samplers = [MultiAspectSampler([SamplerDataset(index, lambda s: "", batch,
                                                   bucket_tail="trim")], seed=5,
                                   processes=processes, rank=rank, accumulation=accumulation)
                for rank in range(processes)]
    return {rank: [trace_record(b) for _ in range(epochs) for b in s.plans()]
            for rank, s in enumerate(samplers)}


class EveryRankTest(unittest.TestCase):
    def test_each_kept_target_once_per_epoch_with_its_own_reference_over_a_grid(self):
        for count in (12, 31, 64):
            for processes in (1, 2, 3, 4):
                for batch, accumulation in ((1, 1), (2, 1), (1, 2)):
                    with self.subTest(count=count, processes=processes, batch=batch,
                                      accumulation=accumulation):
                        self.check_case(count, processes, batch, accumulation)

    def check_case(self, count: int, processes: int, batch: int, accumulation: int):
        index = paired_grid_case(count, seed=count + processes).target
        effective = batch * processes * accumulation
        if min(len(ids) for ids in index.buckets.values()) < effective:
            return  # refused at start-up (an undersized bucket), as test_split shows
        traces = simulate(index, processes, batch, accumulation, epochs=2)
        for epoch in (0, 1):
            seen = Counter()
            for records in traces.values():
                for record in (r for r in records if r["epoch"] == epoch):
                    for sample_id, refs in zip(record["samples"], record["references"]):
                        seen[sample_id] += 1
                        self.assertEqual(refs, [sample_id.replace(".png", ".jpg")])
                        self.assertIn(sample_id, index.buckets[record["bucket"]])
            self.assertEqual(max(seen.values()), 1, "a target trained twice in one epoch")
            for key, ids in index.buckets.items():  # what is untrained is a trimmed tail
                left = [s for s in ids if s not in seen]
                self.assertEqual(len(left), len(ids) % effective, key)

    def test_the_audit_catches_a_sample_traced_with_another_samples_reference(self):
        index = paired_grid_case(16, seed=1).target
        traces = simulate(index, 2, 2, 1, epochs=1)
        spec = DatasetSpec("edits", index.buckets, 0, 2, False, False, "trim")
        pieces = split_dataset(spec, seed=5, epoch=0, processes=2, rank=0, accumulation=1)
        plan = build_plan(
            seed=5, world_size=2, accumulation=1, datasets=[spec],
            trimmed={0: {"edits": {k: p.trimmed for k, p in pieces.items()}}},
            carried={0: {"edits": {k: p.carried for k, p in pieces.items()}}},
            references={"edits": {s: list(r) for s, r in index.references.items()}})
        self.assertTrue(verify(plan, traces).ok, verify(plan, traces).lines())
        record = traces[1][0]
        record["references"][0] = traces[0][0]["references"][0]
        report = verify(plan, traces)
        self.assertFalse(report.ok)
        self.assertIn(f"edits/{record['samples'][0]} with references", " ".join(report.problems))


class ConditioningConfigTest(unittest.TestCase):
    def problems(self, datasets, **options) -> list[str]:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            targets, references, _ = make_edit_pairs(root, count=1)
            config = write_config(root, targets, datasets=datasets(targets, references),
                                  **options)
            with self.assertRaises(ConfigError) as caught:
                load_configuration(config, cwd=root)
        return caught.exception.problems

    def test_every_problem_of_the_conditioning_datasets_is_reported_at_once(self):
        def datasets(targets, references):
            edits, refs = edit_datasets(targets, references)
            return [{**edits, "conditioning_data": ["edit-references", "missing-id", "shapes"]},
                    {**refs, "conditioning_type": None},
                    {"id": "shapes", "instance_data_dir": str(targets)},
                    {"id": "held-out", "dataset_type": "eval", "instance_data_dir": str(targets),
                     "conditioning_type": "reference_strict"},
                    {"id": "unused", "dataset_type": "conditioning",
                     "conditioning_type": "reference_strict", "instance_data_dir": str(references)}]

        text = json.dumps(self.problems(datasets))  # model_family sd1x takes no references
        for expected in ("'missing-id', which is not an enabled dataset",
                         "names 'shapes', whose dataset_type is 'image'",
                         "dataset 'held-out': key 'conditioning_type' belongs to",
                         "'edit-references': a 'conditioning' dataset needs 'conditioning_type'",
                         "'unused' has 'dataset_type': 'conditioning' but no dataset names it",
                         "use model_family 'flux' with model_flavour 'kontext'"):
            self.assertIn(expected, text)

    def test_conditioning_types_that_are_not_built_are_refused_with_what_to_do(self):
        for kind, advice in (("depth", "'controlnet' with controlnet: true"),
                             ("segmentation", "'mask' for masked loss")):
            def datasets(targets, references, kind=kind):
                edits, refs = edit_datasets(targets, references)
                return [edits, {**refs, "conditioning_type": kind}]

            with self.subTest(kind=kind):
                (problem,) = self.problems(datasets, model_family="flux",
                                           model_flavour="kontext")
                self.assertIn(f"conditioning_type '{kind}' is not supported here", problem)
                self.assertIn(advice, problem)
                self.assertNotIn("did you mean", problem)

    def test_plan_counts_the_pairs_and_names_the_orphan_target(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            targets, references, ids = make_edit_pairs(root, count=3)
            (references / ids[0].replace(".png", ".jpg")).unlink()
            config = write_config(root, targets, datasets=edit_datasets(targets, references),
                                  model_family="flux", model_flavour="kontext")
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                    self.assertLogs("simpletuner.plan", "INFO") as logs:
                status = run_plan(str(config), as_json=True)
        self.assertEqual(status, 0, err.getvalue())
        dataset = json.loads(out.getvalue())["datasets"]["edits"]
        self.assertEqual(dataset["buckets"], {"64x64": ids[1:]})
        self.assertEqual([s["path"] for s in dataset["skipped"]], [ids[0]])
        self.assertIn("2 paired; 1 targets without a reference", "\n".join(logs.output))

    def test_loose_references_need_micro_batches_of_one(self):
        def datasets(targets, references):
            edits, refs = edit_datasets(targets, references)
            return [edits, {**refs, "conditioning_type": "reference_loose"}]

        (problem,) = self.problems(datasets, model_family="flux", model_flavour="kontext")
        self.assertIn("'reference_loose', each in its own aspect bucket", problem)
        self.assertIn("set train_batch_size 1 (it is 2;", problem)

    def test_simpletuner_s_kontext_datasets_load_as_they_are_written(self):
        """Its quickstart's entries: the reference dataset says conditioning_type only."""
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            targets, references, _ = make_edit_pairs(root, count=1)
            datasets = [{"id": "edited-images", "type": "local",
                         "instance_data_dir": str(targets),
                         "conditioning_data": "reference-images", "resolution": 64,
                         "caption_strategy": "textfile"},
                        {"id": "reference-images", "type": "local",
                         "instance_data_dir": str(references),
                         "conditioning_type": "reference_loose", "resolution": 64,
                         "caption_strategy": "textfile"}]
            config = write_config(root, targets, datasets=datasets, model_family="flux",
                                  model_flavour="kontext", train_batch_size=1)
            loaded = load_configuration(config, cwd=root)
        self.assertEqual([d.id for d in loaded.datasets], ["edited-images"])
        (reference,) = loaded.references
        self.assertEqual((reference.id, reference.dataset_type, reference.conditioning_type),
                         ("reference-images", "conditioning", "reference_loose"))

    def test_an_output_dir_inside_the_reference_folder_is_a_problem(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            targets, references, _ = make_edit_pairs(root, count=1)
            config = write_config(root, targets, datasets=edit_datasets(targets, references),
                                  model_family="flux", model_flavour="kontext",
                                  output_dir=str(references / "out"))
            (problem,) = output_dir_problems(load_configuration(config, cwd=root))
        self.assertIn("the folder of dataset 'edit-references'", problem.message)

    def test_a_kontext_config_with_its_references_loads(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            targets, references, _ = make_edit_pairs(root, count=1)
            config = write_config(root, targets, datasets=edit_datasets(targets, references),
                                  model_family="flux", model_flavour="kontext")
            loaded = load_configuration(config, cwd=root)
        self.assertEqual([d.id for d in loaded.datasets], ["edits"])
        self.assertEqual([d.id for d in loaded.references], ["edit-references"])
        self.assertEqual(loaded.datasets[0].conditioning_ids(), ["edit-references"])


if __name__ == "__main__":
    unittest.main()
