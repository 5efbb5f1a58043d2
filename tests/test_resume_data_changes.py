"""Resume after the data changed: a checkpoint's sampler state holds digests, not sample lists;
the earlier index cache is kept under cache/metadata/previous/, and the one resume warning
names the files added, removed, rewritten or moved since the checkpoint."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import unittest
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import numpy as np

from discovery_fixtures import dataset_config, encode, image, touch_later, training_config, write
from training_fixtures import make_shapes, run_in_process_logged, write_config
from simpletuner.helpers.metadata.backends import probe_pool
from simpletuner.helpers.metadata.backends.base import MetadataBackend
from simpletuner.helpers.metadata.data_changes import describe_file_changes
from simpletuner.helpers.metadata.file_table import FileTable
from simpletuner.helpers.metadata.index_cache import DIGEST_KEY, cache_columns, load_cache
from simpletuner.helpers.metadata import index_history
from simpletuner.helpers.metadata.index_history import KEPT_VERSIONS, data_digest
from simpletuner.helpers.metadata.index_columns import StringColumn
from simpletuner.helpers.metadata.skipped import SkippedFile, SkippedFiles
from simpletuner.helpers.metadata.startup import DataStartup, build_sampler

SAMPLER_LOG = "simpletuner.helpers.multiaspect.sampler"


def png(width: int, height: int, seed: int = 0) -> bytes:
    return encode(image(width, height, seed=seed), "PNG")


def digest_of(cache: dict) -> str:
    """data_digest of a cache given as plain lists (cache_of's shape, with its skips)."""
    files, index = cache["files"], cache["index"]
    table = FileTable(files["ids"], files["bytes"], files["change_key"],
                      [64] * len(files["ids"]), [64] * len(files["ids"]))
    columns = cache_columns(table, StringColumn.encode(table.ids), index["buckets"], None)
    return data_digest(columns, table, index["buckets"],
                       index.get("skipped", []))


def digest_of_file(path: Path) -> str:
    """The digest of a kept cache file's own content, recomputed from its columns."""
    loaded = load_cache(path)
    return digest_of({**loaded.change_view(), "index": {
        **loaded.change_view()["index"], "skipped": loaded.skipped}})


class ChangedDataTest(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.root = Path(tmp.name)
        self.data = self.root / "data"
        for i in range(12):
            write(self.data, f"sq/{i:02d}.png", png(64, 64, seed=i))
        self.reads: list[str] = []

    def backend(self, **training) -> MetadataBackend:
        return MetadataBackend.from_config(dataset_config(self.data),
                                           training_config(self.root / "out", **training))

    def sampler(self, backend: MetadataBackend, rank: int = 0):
        real = probe_pool.probe_images

        def counting(paths, **kwargs):
            self.reads.extend(Path(p).relative_to(self.data).as_posix() for p in paths)
            return real(paths, **kwargs)

        with mock.patch.object(probe_pool, "probe_images", counting):
            index = backend.refresh_index(show_progress=False)
        startup = DataStartup({"photos": backend}, {"photos": index}, 7, False, [])
        return build_sampler(startup, backend.training,
                             SimpleNamespace(num_processes=1 + rank, process_index=rank))

    def saved_state(self) -> dict:
        s = self.sampler(self.backend())
        next(iter(s))
        return json.loads(json.dumps(s.state_dict()))

    def resume_warning(self, state: dict, **training) -> str:
        with self.assertLogs(SAMPLER_LOG, "WARNING") as logs:
            self.sampler(self.backend(**training)).load_state_dict(state)
        self.assertEqual(len(logs.records), 1, "expected exactly one warning")
        return logs.records[0].getMessage()

    def test_added_removed_rewritten_and_moved_files_are_named(self):
        state = self.saved_state()
        write(self.data, "sq/new.png", png(64, 64))
        (self.data / "sq" / "03.png").unlink()
        (self.data / "sq" / "03.txt").unlink()
        write(self.data, "sq/05.png", png(64, 64, seed=40))
        touch_later(self.data / "sq" / "05.png")
        write(self.data, "sq/07.png", png(64, 128))
        message = self.resume_warning(state)
        self.assertIn("datasets.photos.index:", message)
        self.assertIn("dataset 'photos' files: 1 added (sq/new.png); 1 removed (sq/03.png); "
                      "2 rewritten (sq/05.png, sq/07.png); "
                      "1 moved to another bucket (sq/07.png 64x64 -> 64x128)", message)
        self.assertIn("not supported", message)

    def test_the_checkpoint_holds_a_digest_not_the_samples(self):
        state = self.saved_state()
        self.assertEqual(set(state), {"epoch", "step", "fingerprint", "data"})
        cache = load_cache(self.root / "out/cache/metadata/photos.index")
        self.assertEqual(state["data"], {"photos": cache.meta[DIGEST_KEY]})
        self.assertEqual(state["data"], {"photos": digest_of_file(cache_path(self.root))})
        self.assertNotIn("sq/", json.dumps(state))

    def test_the_replaced_cache_is_kept_under_previous_by_its_digest(self):
        state = self.saved_state()
        previous = self.root / "out/cache/metadata/previous/photos"
        self.assertFalse(previous.exists(), "nothing changed, nothing kept")
        write(self.data, "sq/new.png", png(64, 64))
        self.sampler(self.backend())
        kept = previous / f"{state['data']['photos']}.index"
        self.assertEqual(digest_of_file(kept), state["data"]["photos"])
        self.assertNotIn("sq/new.png", list(load_cache(kept).ids))
        self.assertIn("sq/new.png", list(load_cache(cache_path(self.root)).ids))

    def test_without_hard_links_the_replaced_cache_is_copied(self):
        state = self.saved_state()
        write(self.data, "sq/new.png", png(64, 64))
        refused = OSError(1, "Operation not permitted")
        with mock.patch("simpletuner.helpers.metadata.index_history.os.link",
                        side_effect=refused):
            self.sampler(self.backend())
        kept = self.root / f"out/cache/metadata/previous/photos/{state['data']['photos']}.index"
        self.assertEqual(digest_of_file(kept), state["data"]["photos"])
        self.assertEqual(kept.stat().st_nlink, 1)  # a copy, not a link
        self.assertIn("1 added (sq/new.png)", self.resume_warning(state))

    def test_only_the_newest_versions_are_kept_and_an_older_one_is_said_to_be_gone(self):
        state = self.saved_state()
        for i in range(KEPT_VERSIONS + 1):
            write(self.data, f"sq/new{i}.png", png(64, 64))
            self.sampler(self.backend())
        previous = self.root / "out/cache/metadata/previous/photos"
        self.assertEqual(len(list(previous.glob("*.index"))), KEPT_VERSIONS)
        message = self.resume_warning(state)
        self.assertIn("the index cache the checkpoint was saved with is no longer kept", message)
        self.assertNotIn("added", message)

    def test_a_damaged_kept_cache_is_named_and_the_resume_goes_on(self):
        state = self.saved_state()
        write(self.data, "sq/new.png", png(64, 64))
        self.sampler(self.backend())
        kept = self.root / f"out/cache/metadata/previous/photos/{state['data']['photos']}.index"
        kept.write_bytes(kept.read_bytes()[:-10])
        resumed = self.sampler(self.backend())
        with self.assertLogs(SAMPLER_LOG, "WARNING") as logs:
            resumed.load_state_dict(state)
        self.assertIn(f"the kept index cache {kept} is damaged (IndexFileError",
                      logs.records[0].getMessage())
        self.assertEqual((resumed.epoch, resumed.step), (state["epoch"], state["step"]))

    def test_new_bucket_settings_name_the_moved_files_and_no_other_change(self):
        write(self.data, "wide.png", png(128, 64))
        state = self.saved_state()
        message = self.resume_warning(state, resolution=32)
        self.assertIn("dataset 'photos' files: 13 moved to another bucket (sq/00.png 64x64 -> "
                      "32x32,", message)
        for kind in ("added", "removed", "rewritten"):
            self.assertNotIn(kind, message)

    def test_unchanged_data_resumes_without_a_warning_or_a_kept_version(self):
        state = self.saved_state()
        with self.assertNoLogs(SAMPLER_LOG, "WARNING"):
            self.sampler(self.backend()).load_state_dict(state)
        self.assertFalse((self.root / "out/cache/metadata/previous").exists())

    def test_other_ranks_warn_without_reading_old_caches(self):
        state = self.saved_state()
        write(self.data, "sq/new.png", png(64, 64))
        with self.assertLogs(SAMPLER_LOG, "WARNING") as logs:
            self.sampler(self.backend(), rank=1).load_state_dict(state)
        self.assertIn("datasets.photos.index:", logs.records[0].getMessage())
        self.assertNotIn("files:", logs.records[0].getMessage())

    def test_the_json_cache_of_an_earlier_version_is_removed_once_replaced(self):
        legacy = self.root / "out/cache/metadata/photos.json"
        legacy.parent.mkdir(parents=True)
        legacy.write_text('{"version": 5, "files": {}}')
        state = self.saved_state()
        self.assertFalse(legacy.exists())
        self.assertEqual(state["data"]["photos"], digest_of_file(cache_path(self.root)))


def cache_path(root: Path) -> Path:
    return root / "out/cache/metadata/photos.index"


class ResumedTrainingTest(unittest.TestCase):
    """A run checkpoints, files are added and removed, the run resumes in the same output_dir:
    it continues from the checkpoint and its one warning names the files."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-data-change-")
        root = Path(cls.tmp)
        make_shapes(root / "data", per_size=4)
        options = dict(checkpointing_steps=2, max_train_steps=2)
        cls.first = run_in_process_logged(write_config(root, root / "data", **options), cls.tmp)
        (root / "data" / "64x64-01.png").unlink()
        make_shapes(root / "more", per_size=2, sizes=((32, 32),))
        for path in (root / "more").iterdir():
            shutil.copy(path, root / "data" / f"new-{path.name}")
        options.update(max_train_steps=4, resume_from_checkpoint="latest")
        cls.resumed = run_in_process_logged(write_config(root, root / "data", **options), cls.tmp)
        cls.out = root / "config-out"

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_the_resumed_run_names_the_changed_files_and_finishes(self):
        self.assertEqual(self.first.returncode, 0, self.first.stderr[-3000:])
        self.assertEqual(self.resumed.returncode, 0, self.resumed.stderr[-3000:])
        self.assertIn("resumed from", self.resumed.stderr)
        self.assertEqual(self.resumed.stderr.count("Resuming with different data settings"), 1)
        self.assertIn("dataset 'shapes' files: 2 added (new-32x32-00.png, new-32x32-01.png); "
                      "1 removed (64x64-01.png)", self.resumed.stderr)
        self.assertTrue((self.out / "checkpoint-4" / "manifest.json").is_file())


def cache_of(buckets: dict[str, list[str]], change_key: int = 1) -> dict:
    ids = sorted(s for members in buckets.values() for s in members)
    return {"files": {"ids": ids, "bytes": [10] * len(ids), "change_key": [change_key] * len(ids)},
            "index": {"buckets": {key: sorted(ids.index(s) for s in members)
                                  for key, members in buckets.items()}}}


class DescribeTest(unittest.TestCase):
    def test_many_files_are_counted_past_the_first_ten(self):
        before = cache_of({"64x64": [f"b/{i:04d}.png" for i in range(13)]})
        after = cache_of({"64x64": [f"b/{i:04d}.png" for i in range(40)]})
        (line,) = describe_file_changes("beta", before, after)
        self.assertIn("27 added (b/0013.png, b/0014.png,", line)
        self.assertIn("b/0022.png and 17 more)", line)
        self.assertNotIn("b/0023.png", line)

    def test_names_that_are_not_utf8_are_printed_escaped(self):
        before = cache_of({"64x64": ["a.png"]})
        after = cache_of({"64x64": ["a.png", "caf\udce9.png"]})
        self.assertEqual(describe_file_changes("d", before, after),
                         ["dataset 'd' files: 1 added (caf\\xe9.png)"])

    def test_files_newly_skipped_and_taken_in_are_named(self):
        before = cache_of({"64x64": ["a.png", "b.png"]})
        after = {**before, "index": {"buckets": {"64x64": [1]}}}
        self.assertEqual(describe_file_changes("d", before, after),
                         ["dataset 'd' files: 1 now skipped (a.png)"])
        self.assertEqual(describe_file_changes("d", after, before),
                         ["dataset 'd' files: 1 no longer skipped (a.png)"])

    def test_identical_caches_name_nothing(self):
        cache = cache_of({"64x64": ["a.png"], "64x128": ["t.png"]})
        self.assertEqual(describe_file_changes("d", cache, json.loads(json.dumps(cache))), [])


class DigestTest(unittest.TestCase):
    def base(self) -> dict:
        base = cache_of({"64x64": ["a.png", "b.png"], "64x128": ["t.png"]})
        base["index"]["skipped"] = []
        return base

    def test_every_part_of_the_sample_table_changes_the_digest(self):
        base = self.base()
        digest = digest_of(base)
        self.assertEqual(digest_of(json.loads(json.dumps(base))), digest)
        changes = {
            "an id": lambda c: c["files"]["ids"].__setitem__(0, "caf\udce9.png"),
            "a size": lambda c: c["files"]["bytes"].__setitem__(1, 11),
            "a change key": lambda c: c["files"]["change_key"].__setitem__(2, 2),
            "an ETag": lambda c: c["files"].__setitem__("change_key", ["e1", "e2", "e3"]),
            "a bucket's rows": lambda c: c["index"]["buckets"].__setitem__("64x64", [0]),
            "a bucket's key": lambda c: c["index"]["buckets"].__setitem__(
                "32x32", c["index"]["buckets"].pop("64x128")),
            "a skip": lambda c: c["index"]["skipped"].append(["t.png", "too small"]),
        }
        for what, change in changes.items():
            with self.subTest(what):
                changed = json.loads(json.dumps(base))
                change(changed)
                self.assertNotEqual(digest_of(changed), digest)

    def test_the_definition_is_the_one_older_checkpoints_recorded(self):
        """SHA-256 of the row count, the ids joined by NUL, sizes and change keys as int64
        (ETags as JSON), each bucket's key (JSON) and rows (int64), and the skips (JSON): the
        JSON cache's definition, so a checkpoint saved before the binary cache still matches."""
        for keys in ([1, 1, 1], ["e1", "e2", "e3"]):
            cache = self.base()
            cache["files"]["change_key"] = keys
            cache["index"]["skipped"] = [["z.png", "too small"]]
            files, index = cache["files"], cache["index"]
            want = hashlib.sha256((3).to_bytes(8, "little"))
            want.update("\0".join(files["ids"]).encode("utf-8"))
            want.update(np.asarray(files["bytes"], np.int64).tobytes())
            want.update(np.asarray(keys, np.int64).tobytes() if isinstance(keys[0], int)
                        else json.dumps(keys, ensure_ascii=False).encode("utf-8"))
            for key, rows in sorted(index["buckets"].items()):
                want.update(json.dumps(key).encode("utf-8") + np.asarray(rows, np.int64).tobytes())
            want.update(json.dumps(index["skipped"]).encode("utf-8"))
            self.assertEqual(digest_of(cache), want.hexdigest())

    def test_skips_as_columns_hash_as_their_pairs_did(self):
        """An index's skips (SkippedFiles, hashed a slice at a time) give the digest of the same
        [path, reason] pairs, names that are not UTF-8 included, across slice boundaries."""
        pairs = [["caf\udce9.png", "too small"], ["t.png", "too small"], ["\u00fc.png", "odd"]]
        cache = self.base()
        cache["index"]["skipped"] = pairs
        skips = SkippedFiles.of(SkippedFile(path, reason) for path, reason in pairs)
        for at_once in (1, 2, 1 << 16):
            with self.subTest(at_once=at_once), \
                    mock.patch.object(index_history, "_HASHED_AT_ONCE", at_once):
                self.assertEqual(digest_of({**cache, "index": {**cache["index"],
                                                                "skipped": skips}}),
                                 digest_of(cache))


if __name__ == "__main__":
    unittest.main()
