"""PrefetchedBatches: the sampler's order across epochs, batches (and captions) read ahead on
another thread, a checkpoint position that counts only what the loop consumed, errors at their
own micro-batch with their sample ids, and no thread left behind."""

from __future__ import annotations

import tempfile
import threading
import unittest
from dataclasses import replace
from pathlib import Path

import torch

from simpletuner.helpers.caching.latents import LatentCache
from simpletuner.helpers.caching.storage import CacheEntryError, entry_path, save_entry
from simpletuner.helpers.caching.text_embeds import TextEmbedCache
from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.multiaspect.captions import CaptionPolicy
from simpletuner.helpers.multiaspect.dataset import BatchAssembler
from simpletuner.helpers.multiaspect.prefetch import PrefetchedBatches, positions_after
from simpletuner.helpers.multiaspect.sampler import MultiAspectSampler, SamplerDataset
from simpletuner.models.training_batch import TrainingBatch

WAIT_S = 10  # generous: the machine is shared; a correct run never waits this long


def caption_of(sample_id: str) -> str:
    return f"caption of {sample_id}"


def new_sampler(seed: int = 5, caption_for=caption_of) -> MultiAspectSampler:
    index = DatasetIndex("d", {"64x64": [f"sq/{i:02d}.png" for i in range(12)],
                               "128x64": [f"wide/{i:02d}.png" for i in range(8)]}, {})
    policy = CaptionPolicy(dropout_probability=0.3)  # captions that change with the epoch
    return MultiAspectSampler([SamplerDataset(index, caption_for, 2, captions=policy)],
                              seed=seed, processes=1, rank=0, accumulation=2)


def key(micro_batch) -> tuple:
    return micro_batch.epoch, micro_batch.step, tuple(s.sample_id for s in micro_batch.samples)


class RecordingAssembler:
    """A batch whose latents encode (epoch, step); records what it assembled, on which thread,
    and fails at the micro-batch positions in ``fail_at``."""

    def __init__(self, fail_at: frozenset = frozenset()):
        self.fail_at = fail_at
        self.assembled: list[tuple] = []
        self.threads: set[str] = set()
        self.changed = threading.Condition()

    def __call__(self, micro_batch) -> TrainingBatch:
        if (micro_batch.epoch, micro_batch.step) in self.fail_at:
            raise FileNotFoundError(f"no cached latent for step {micro_batch.step}")
        with self.changed:
            self.assembled.append(key(micro_batch))
            self.threads.add(threading.current_thread().name)
            self.changed.notify_all()
        n = len(micro_batch.samples)
        value = micro_batch.epoch * 100.0 + micro_batch.step
        return TrainingBatch(latents=torch.full((n, 1), value),
                             prompt_embeds={"prompt_embeds": torch.zeros(n, 1)},
                             original_sizes=[], crop_top_lefts=[], target_sizes=[])

    def wait_for(self, count: int) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: len(self.assembled) >= count, WAIT_S)


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("batch-prefetch")]


def first(iterable, count: int) -> list:
    """The first ``count`` items, then the loop is left as a training loop leaves it: break."""
    items = []
    for item in iterable:
        items.append(item)
        if len(items) == count:
            break
    return items


def real_assembler(folder: Path, damaged: str) -> BatchAssembler:
    """The project's assembler over cache files for every sample of new_sampler(); the entry
    of ``damaged`` holds garbage."""
    latents = LatentCache(folder / "vae")
    text = TextEmbedCache(folder / "text", "te")
    for micro_batch in new_sampler():
        for sample in micro_batch.samples:
            path = entry_path(latents.folder, f"{len(latents.paths):064x}")
            save_entry(path, {"latent": torch.randn(4, 8, 8),
                              "geometry": torch.tensor([64, 64, 0, 0, 64, 64])})
            latents.paths[sample.sample_id] = path
            save_entry(text.path_for(sample.caption), {"prompt_embeds": torch.zeros(77, 32)})
    latents.paths[damaged].write_bytes(b"damaged")
    return BatchAssembler({"d": latents}, {"d": text})


class PositionsAfterTest(unittest.TestCase):
    def test_runs_on_into_the_next_epochs(self):
        ten = lambda epoch: 10  # noqa: E731
        self.assertEqual(positions_after(3, 0, ten, 2), [(3, 1), (3, 2)])
        self.assertEqual(positions_after(3, 8, ten, 2), [(3, 9), (4, 0)])
        self.assertEqual(positions_after(3, 9, ten, 2), [(4, 0), (4, 1)])
        self.assertEqual(positions_after(0, 0, lambda epoch: 1, 2), [(1, 0), (2, 0)])

    def test_epochs_of_different_lengths(self):
        # bucket_tail carry: epochs 0, 1, 2 of 3, 1 and 2 micro-batches.
        lengths = [3, 1, 2]
        self.assertEqual(positions_after(0, 1, lengths.__getitem__, 4),
                         [(0, 2), (1, 0), (2, 0), (2, 1)])


class OrderAndPositionTest(unittest.TestCase):
    def setUp(self):
        self.assertEqual(prefetch_threads(), [])

    def tearDown(self):
        self.assertEqual(prefetch_threads(), [], "a prefetch thread outlived its loop")

    def test_yields_the_samplers_sequence_across_epochs_with_each_ones_batch(self):
        per_epoch = len(new_sampler())
        plain = new_sampler()
        expected = [key(m) for _ in range(3) for m in plain]
        assembler = RecordingAssembler()
        got = first(PrefetchedBatches(new_sampler(), assembler), 3 * per_epoch)
        self.assertEqual([key(m) for m, _ in got], expected)
        for micro_batch, batch in got:
            self.assertEqual(batch.latents[0, 0].item(),
                             micro_batch.epoch * 100 + micro_batch.step)
        self.assertTrue(assembler.threads)
        self.assertNotIn(threading.current_thread().name, assembler.threads,
                         "assembly ran on the loop's thread")

    def test_yields_the_samplers_micro_batches_captions_included(self):
        plain = new_sampler()
        expected = [m for _ in range(2) for m in plain]
        got = first(PrefetchedBatches(new_sampler(), RecordingAssembler()), len(expected))
        self.assertEqual([m for m, _ in got], expected)
        self.assertIn("", [s.caption for m in expected for s in m.samples])  # some dropped

    def test_captions_are_read_by_the_worker_not_the_loops_thread(self):
        threads = set()

        def recording_caption(sample_id: str) -> str:
            threads.add(threading.current_thread().name)
            return caption_of(sample_id)

        first(PrefetchedBatches(new_sampler(caption_for=recording_caption),
                                RecordingAssembler()), 5)
        self.assertTrue(threads)
        self.assertTrue(all(name.startswith("batch-prefetch") for name in threads), threads)

    def test_the_worker_assembles_with_one_torch_thread_and_leaves_the_loops_alone(self):
        # A second thread's parallel regions (torch.stack of large latents) on top of the
        # model's compute threads oversubscribe the cores: SDXL-sized assembly took 3x the
        # step on two cores. One thread in the worker; the loop keeps its own count.
        seen = []

        class CountingAssembler(RecordingAssembler):
            def __call__(self, micro_batch):
                seen.append(torch.get_num_threads())
                return super().__call__(micro_batch)

        before = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            first(PrefetchedBatches(new_sampler(), CountingAssembler()), 4)
            self.assertEqual(torch.get_num_threads(), 2)
        finally:
            torch.set_num_threads(before)
        self.assertTrue(seen)
        self.assertEqual(set(seen), {1})

    def test_reads_ahead_while_the_loop_holds_a_batch(self):
        assembler = RecordingAssembler()
        batches = iter(PrefetchedBatches(new_sampler(), assembler, depth=2))
        next(batches)
        # The loop is "training" micro-batch 0: micro-batches 1 and 2 get assembled meanwhile.
        self.assertTrue(assembler.wait_for(3), assembler.assembled)
        expected = [key(m) for m in first(new_sampler(), 3)]
        self.assertEqual(assembler.assembled[:3], expected)
        batches.close()

    def test_checkpoint_while_batches_are_read_ahead_resumes_the_same_sequence(self):
        """A fake training whose 'weights' are a running sum of batch values: the run stopped at
        a checkpoint and resumed from its sampler state ends like the uninterrupted one."""
        total, stop_at = 2 * len(new_sampler()) + 3, len(new_sampler()) + 3  # mid-epoch 1
        full_trace, full_weight = self.train(new_sampler(), total)

        first_sampler, assembler = new_sampler(), RecordingAssembler()
        batches = iter(PrefetchedBatches(first_sampler, assembler, depth=2))
        trace, weight = [], 0.0
        for micro_batch, batch in batches:
            trace.append(key(micro_batch))
            weight += batch.latents.sum().item()
            if len(trace) == stop_at:
                break
        # Everything the loop consumed, and the two ahead of it, were assembled.
        self.assertTrue(assembler.wait_for(stop_at + 2))
        saved = first_sampler.state_dict()
        batches.close()
        self.assertEqual((saved["epoch"], saved["step"]), (1, 3))

        resumed = new_sampler()
        resumed.load_state_dict(saved)
        rest_trace, rest_weight = self.train(resumed, total - stop_at)
        self.assertEqual(trace + rest_trace, full_trace)
        self.assertEqual(weight + rest_weight, full_weight)

    def train(self, sampler, count: int) -> tuple[list, float]:
        trace, weight = [], 0.0
        for micro_batch, batch in first(PrefetchedBatches(sampler, RecordingAssembler()), count):
            trace.append(key(micro_batch))
            weight += batch.latents.sum().item()
        return trace, weight


class FailureTest(unittest.TestCase):
    def tearDown(self):
        self.assertEqual(prefetch_threads(), [], "a prefetch thread outlived its loop")

    def test_an_assembly_error_surfaces_at_its_micro_batch_naming_its_samples(self):
        sampler = new_sampler()
        failing = list(new_sampler())[3]
        consumed = []
        with self.assertRaises(FileNotFoundError) as raised:
            for micro_batch, _ in PrefetchedBatches(sampler, RecordingAssembler(
                    fail_at=frozenset({(0, 3)}))):
                consumed.append(micro_batch.step)
        # Read ahead while step 1 trained, but raised only when the loop reached step 3.
        self.assertEqual(consumed, [0, 1, 2])
        notes = "\n".join(getattr(raised.exception, "__notes__", []))
        for sample in failing.samples:
            self.assertIn(f"d/{sample.sample_id}", notes)
        self.assertIn("micro-batch 3 of epoch 0", notes)
        self.assertEqual(sampler.step, 4, "the sampler handed out the failing micro-batch")

    def test_a_caption_read_error_surfaces_at_its_micro_batch_naming_its_samples(self):
        failing = list(new_sampler())[2]
        unreadable = failing.samples[0].sample_id

        def caption_for(sample_id: str) -> str:
            if sample_id == unreadable:
                raise OSError(f"caption file of {sample_id} cannot be read")
            return caption_of(sample_id)

        consumed = []
        with self.assertRaises(OSError) as raised:
            for micro_batch, _ in PrefetchedBatches(new_sampler(caption_for=caption_for),
                                                    RecordingAssembler()):
                consumed.append(micro_batch.step)
        self.assertEqual(consumed, [0, 1])
        notes = "\n".join(raised.exception.__notes__)
        self.assertIn("micro-batch 2 of epoch 0", notes)
        self.assertIn(f"d/{unreadable}", notes)

    def test_a_damaged_cache_entry_names_its_file_and_its_micro_batchs_samples(self):
        failing = list(new_sampler())[2]
        damaged = failing.samples[1].sample_id
        with tempfile.TemporaryDirectory() as tmp:
            assembler = real_assembler(Path(tmp), damaged)
            consumed = []
            with self.assertRaises(CacheEntryError) as raised:
                for micro_batch, batch in PrefetchedBatches(new_sampler(), assembler):
                    self.assertEqual(batch.latents.shape, (2, 4, 8, 8))
                    consumed.append(micro_batch.step)
        self.assertEqual(consumed, [0, 1])
        self.assertIn(repr(damaged), str(raised.exception))
        notes = "\n".join(raised.exception.__notes__)
        self.assertIn(", ".join(f"d/{s.sample_id}" for s in failing.samples), notes)

    def test_a_batch_read_ahead_for_another_plan_is_an_error_not_trained(self):
        class Replanned(MultiAspectSampler):  # its own plans differ from its twin's after step 0
            def plan(self, epoch, step):
                batch = super().plan(epoch, step)
                if step == 0:
                    return batch
                return replace(batch, samples=tuple(reversed(batch.samples)))

        plain = new_sampler()
        changed = Replanned(plain.datasets, seed=plain.seed, processes=1, rank=0,
                            accumulation=2)
        consumed = []
        with self.assertRaisesRegex(RuntimeError, "micro-batch 1 of epoch 0 was planned"):
            for micro_batch, _ in PrefetchedBatches(changed, RecordingAssembler()):
                consumed.append(micro_batch.step)
        self.assertEqual(consumed, [0])  # the first is assembled for what was handed out

    def test_an_error_in_the_loop_body_ends_the_thread(self):
        with self.assertRaises(RuntimeError):
            for micro_batch, _ in PrefetchedBatches(new_sampler(), RecordingAssembler()):
                if micro_batch.step == 2:
                    raise RuntimeError("non-finite loss")

    def test_breaking_out_ends_the_thread(self):
        self.assertEqual(len(first(PrefetchedBatches(new_sampler(), RecordingAssembler()), 2)), 2)


if __name__ == "__main__":
    unittest.main()
