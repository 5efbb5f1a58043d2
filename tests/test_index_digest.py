"""The index digest: recorded in the index cache by the main rank as it writes it, taken as it
is by every loading rank (no rank hashes every id at start-up), derived for a smaller index,
and still telling apart ranks that read different caches (real gloo processes)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import unittest
from dataclasses import replace
from pathlib import Path

import numpy as np

from discovery_fixtures import dataset_config, encode, image, training_config, write
from launching import run_bounded
from simpletuner.helpers.metadata.backends.base import MetadataBackend
from simpletuner.helpers.metadata.file_table import ascending_strings
from simpletuner.helpers.metadata.index import ClipPlan, DatasetIndex
from simpletuner.helpers.metadata.index_columns import ListColumn, MappedIds, StringColumn
from simpletuner.helpers.metadata.index_file import read_columns, write_columns

SIZES = [(96, 64), (64, 96), (64, 64), (64, 64), (128, 64), (96, 64)]


def content_digest(dataset_id: str, buckets: dict[str, list[str]]) -> str:
    """The digest's definition (index.py), written out here: SHA-256 of the compact JSON of
    the dataset id and the buckets by key."""
    payload = json.dumps([dataset_id, dict(sorted(buckets.items()))], separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def populate(folder: Path, count: int = len(SIZES)) -> None:
    for i in range(count):
        w, h = SIZES[i % len(SIZES)]
        write(folder, f"dir{i % 2}/img{i:02d}.png", encode(image(w, h, seed=i), "PNG"))


class RecordedDigestTest(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.data, self.output = Path(tmp.name) / "data", Path(tmp.name) / "out"
        populate(self.data)

    def backend(self) -> MetadataBackend:
        return MetadataBackend.from_config(dataset_config(self.data),
                                           training_config(self.output))

    def expected(self, index: DatasetIndex) -> str:
        return content_digest("photos", {k: list(v) for k, v in index.buckets.items()})

    def test_the_main_rank_records_the_content_digest_and_other_ranks_take_it(self):
        main = self.backend()
        index = main.refresh_index(show_progress=False)
        self.assertEqual(read_columns(main.cache_path)[0]["index_digest"], self.expected(index))
        loaded = self.backend().load_index()
        self.assertEqual(loaded.buckets, index.buckets)
        self.assertEqual(loaded.known_digest, self.expected(index))  # known before any hashing
        # Taken as recorded, not recomputed: a loading rank's start-up hashes no id.
        meta, columns = read_columns(main.cache_path)
        write_columns(main.cache_path, {**meta, "index_digest": "recorded by the main rank"},
                      {name: np.array(values) for name, values in columns.items()})
        self.assertEqual(self.backend().load_index().digest(), "recorded by the main rank")

    def test_a_smaller_index_derives_its_digest_from_what_was_removed(self):
        self.backend().refresh_index(show_progress=False)
        index = self.backend().load_index()
        gone = sorted(index.buckets["64x64"])[0]
        smaller = index.without({gone: "undecodable"})
        self.assertNotIn(gone, smaller.buckets["64x64"])
        self.assertNotEqual(smaller.digest(), index.digest())
        # the same on every rank that removes the same samples, whatever the reason's text
        other_rank = self.backend().load_index().without({gone: "another reason"})
        self.assertEqual(other_rank.digest(), smaller.digest())
        other_sample = sorted(index.buckets["96x64"])[0]
        self.assertNotEqual(index.without({other_sample: "undecodable"}).digest(),
                            smaller.digest())
        self.assertNotEqual(index.without({gone: "x", other_sample: "y"}).digest(),
                            smaller.digest())
        # derived from the parent's digest: other content before, another digest after
        twin = DatasetIndex("photos", index.buckets, {})
        twin.set_digest("another parent")
        self.assertNotEqual(twin.without({gone: "undecodable"}).digest(), smaller.digest())

    def test_other_content_made_with_replace_does_not_keep_the_digest(self):
        self.backend().refresh_index(show_progress=False)
        index = self.backend().load_index()
        sample = sorted(index.buckets["64x64"])[0]
        clips = {sample: ClipPlan(1, "24/1", 1, "container")}
        changed = replace(index, clips=clips)  # how paired indexes gain their references
        self.assertIsNone(changed.known_digest)
        self.assertNotEqual(changed.digest(), index.digest())
        self.assertEqual(changed.digest(),
                         DatasetIndex("photos", index.buckets, {}, clips=clips).digest())

    def test_an_index_with_most_samples_removed_hashes_what_is_left(self):
        self.backend().refresh_index(show_progress=False)
        index = self.backend().load_index()
        kept = sorted(index.buckets["64x64"])[-1]
        few = index.without({s: "beyond max_num_samples" for ids in index.buckets.values()
                             for s in ids if s != kept})
        self.assertEqual(few.buckets, {"64x64": [kept]})
        self.assertEqual(few.digest(), content_digest("photos", {"64x64": [kept]}))


class DigestDefinitionTest(unittest.TestCase):
    def test_any_ids_clips_and_references_hash_as_their_compact_json(self):
        odd = ["a\"b.png", "back\\slash.png", "caf\udce9.png", "tab\there.png", "ünï.png",
               "x\",\"y.png", "é"]
        plain = [f"dir/{i:03d}.png" for i in range(50)]
        for ids in (plain, odd, plain + odd, ["one.png"]):
            with self.subTest(ids=ids[:3]):
                buckets = {"64x64": sorted(ids), "32x32": sorted(ids[:1])}
                self.assertEqual(DatasetIndex("d", buckets, {}).digest(),
                                 content_digest("d", buckets))
        clips = {plain[0]: ClipPlan(5, "24/1", 9, "container")}
        references = {plain[0]: ("ref/a.png",)}
        index = DatasetIndex("d", {"64x64": plain}, {}, clips=clips, references=references)
        payload = json.dumps(["d", {"64x64": plain}, {plain[0]: ["24/1", 9]},
                              {plain[0]: ["ref/a.png"]}], separators=(",", ":"))
        self.assertEqual(index.digest(), hashlib.sha256(payload.encode()).hexdigest())


    def test_buckets_as_rows_of_an_encoded_or_listed_table_hash_the_same(self):
        odd = ["a\"b.png", "back\\slash.png", "caf\udce9.png", "del\x7f.png", "ünï.png", "é"]
        plain = [f"dir{i % 9}/img_{i:06d}.png" for i in range(250_000)]  # several scans
        for ids in (plain, odd, plain[:50] + odd, ["tab\there.png"] + plain[:5]):
            table = sorted(ids)
            rows = {"64x64": np.arange(0, len(table), 2), "32x32": np.arange(1, len(table), 3),
                    "16x16": np.arange(len(table))[-1:]}
            expected = content_digest("d", {key: [table[r] for r in part.tolist()]
                                            for key, part in rows.items()})
            for column in (StringColumn.encode(table), ListColumn(table)):
                with self.subTest(ids=table[:2], column=type(column).__name__):
                    buckets = {key: MappedIds(column, part) for key, part in rows.items()}
                    self.assertEqual(DatasetIndex("d", buckets, {}).digest(), expected)
        joined = MappedIds(StringColumn.encode(["a.png", "b.png", "c.png"]), np.array([0, 2]))
        self.assertEqual(joined.plain_joined(b'","'), b'a.png","c.png')
        quoted = MappedIds(StringColumn.encode(['a".png', "b.png"]), np.array([1]))
        self.assertIsNone(quoted.plain_joined(b'","'))  # b.png alone needs none, the column does


class FileTableOrderTest(unittest.TestCase):
    def test_a_table_is_read_only_with_strictly_ascending_string_ids(self):
        self.assertTrue(ascending_strings(["a/1.png", "a/2.png", "b.png"]))
        self.assertTrue(ascending_strings([]))
        for ids in (["b.png", "a.png"], ["a.png", "a.png"], ["a.png", 1], [1, 2], [None]):
            with self.subTest(ids=ids):
                self.assertFalse(ascending_strings(ids))


WORKER = r"""
import json, sys
from pathlib import Path
from accelerate import Accelerator
sys.path.insert(0, sys.argv[4])
from discovery_fixtures import dataset_config, training_config
from simpletuner.common.clean_exit import exit_process
from simpletuner.helpers.metadata.backends.base import IndexAgreementError, MetadataBackend

accelerator = Accelerator(cpu=True)
data, shared, stale, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[5]
main = accelerator.is_main_process
outcomes = []
for rank_one_output in (shared, stale):
    output = shared if main else rank_one_output
    backend = MetadataBackend.from_config(dataset_config(data), training_config(output))
    index = backend.refresh_index(show_progress=False) if main else None
    accelerator.wait_for_everyone()  # the main rank's cache is written
    index = index or backend.load_index()
    try:
        MetadataBackend.check_index_agreement({"photos": index}, None, accelerator)
        outcomes.append(["agreed", index.known_digest])
    except IndexAgreementError as exc:
        outcomes.append([str(exc), index.known_digest])
Path(out, f"rank-{accelerator.process_index}.json").write_text(json.dumps(outcomes))
accelerator.end_training()
exit_process(0)
"""


class RanksReadingDifferentCachesTest(unittest.TestCase):
    def test_recorded_digests_agree_on_one_cache_and_tell_a_stale_one_apart(self):
        tmp = Path(tempfile.mkdtemp())
        data = tmp / "data"
        populate(data, 5)
        stale = MetadataBackend.from_config(dataset_config(data), training_config(tmp / "stale"))
        stale_digest = stale.refresh_index(show_progress=False).digest()
        populate(data, 6)  # the data changed after the stale cache was written
        (tmp / "worker.py").write_text(WORKER)
        (tmp / "result").mkdir()
        tests = Path(__file__).resolve().parent
        env = dict(os.environ, ACCELERATE_USE_CPU="true", OMP_NUM_THREADS="1")
        done = run_bounded(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
             "2", tmp / "worker.py", data, tmp / "shared", tmp / "stale", tests, tmp / "result"],
            tmpdir=tmp, env=env, timeout=180)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        ranks = [json.loads((tmp / "result" / f"rank-{r}.json").read_text()) for r in range(2)]
        (agreed0, main_digest), (agreed1, loaded_digest) = ranks[0][0], ranks[1][0]
        self.assertEqual((agreed0, agreed1), ("agreed", "agreed"))
        self.assertEqual(loaded_digest, main_digest)  # rank 1 took the recorded one
        self.assertNotEqual(main_digest, stale_digest)
        (error0, _), (error1, stale_loaded) = ranks[0][1], ranks[1][1]
        self.assertEqual(stale_loaded, stale_digest)
        self.assertEqual(error0, error1)  # every rank fails with the same message
        self.assertIn("the ranks see different bucket indexes", error0)
        self.assertIn(f"ranks 1: {{'photos': '{stale_digest[:12]}'}}", error0)


if __name__ == "__main__":
    unittest.main()
