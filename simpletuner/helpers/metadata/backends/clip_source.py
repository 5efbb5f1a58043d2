"""``dataset_type: video`` with ``metadata_backend: discovery``: clips probed with PyAV
(clip_probe.py), only new or changed ones, through the storage interface: local files by path,
remote objects by ranged reads. A StorageError stops the run, as for image headers.
With ``metadata_backend: parquet`` the table (table.py, its row checks) names the clips and
gives their captions; the size and frames still come from each clip's container, the truth the
decode will see.

Threads, not worker processes (as headers.py uses for local images): a probe costs about 2 ms
(a container parse and one decoded frame), a clip dataset holds thousands of files, not
millions, and remote probes wait on ranged GETs, which threads overlap (figures:
benchmarks/PERFORMANCE.md, bench_video_discovery.py).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from tqdm import tqdm

from simpletuner.common.cores import usable_cores
from simpletuner.helpers.data_backend.storage import Listing, Storage
from simpletuner.helpers.metadata.backends.clip_probe import ClipProbe, probe_stored_clip
from simpletuner.helpers.metadata.backends.headers import FoundFiles
from simpletuner.helpers.metadata.backends.table import TableSource
from simpletuner.helpers.metadata.file_table import FileTable

if TYPE_CHECKING:
    from simpletuner.helpers.metadata.index_cache import LoadedIndex

MAX_LOCAL_THREADS = 8
MAX_REMOTE_THREADS = 32
PROBE_VERSION = 2  # bump when a probe reads a clip differently: the cached readings are redone


class ClipSource:
    def __init__(self, storage: Storage, dataset_id: str, table: TableSource | None = None):
        self.storage = storage
        self.dataset_id = dataset_id
        self.table = table

    def key(self) -> dict:
        return {"samples": "clips", "probe": PROBE_VERSION,
                **(self.table.key() if self.table else {"metadata_backend": "discovery"})}

    def unchanged(self, listing: Listing, cached: "LoadedIndex") -> bool:
        """Never: whether a caption file exists decides skips too, and it is not in ``cached``."""
        return False

    def read(self, listing: Listing, known: FileTable, show_progress: bool,
             store=None) -> FoundFiles:
        # store: unused; base adds the columns of what this returns (FoundFiles.stored)
        if known.clips is None:  # an image table: nothing in it describes a clip
            known = FileTable.for_clips()
        files, stale, forgotten = known.reconcile(listing)
        probes = probe_clips(self.storage, [files.ids[row] for row in stale],
                             [files.sizes[row] for row in stale],
                             show_progress=show_progress and bool(stale),
                             description=f"{self.dataset_id}: reading clips")
        for row, probe in zip(stale, probes):
            files.record(row, probe)
        if self.table is None:
            return FoundFiles(files, len(stale), forgotten)
        tabled = self.table.read(listing, FileTable(), False)  # rows in listing order, as files
        for row, sample_id in enumerate(files.ids):
            reason = tabled.files.errors.get(sample_id)
            if reason is not None and sample_id not in files.errors:
                files.record(row, ClipProbe(error=reason))
        return FoundFiles(files, len(stale), forgotten, tabled.skipped, tabled.captions)


def probe_clips(storage: Storage, names: list[str], sizes: list[int], *,
                show_progress: bool = False, description: str = "reading clips",
                threads: int | None = None) -> list[ClipProbe]:
    """Probe every clip in parallel; results in the order of ``names``."""
    if threads is None:
        threads = (min(MAX_REMOTE_THREADS, storage.max_connections) if storage.remote
                   else min(MAX_LOCAL_THREADS, usable_cores()))
    threads = max(1, min(threads, len(names)))
    with ThreadPoolExecutor(threads) as pool, tqdm(total=len(names), desc=description,
                                                   unit="clip", disable=not show_progress) as bar:
        def one(name_and_size: tuple[str, int]) -> ClipProbe:
            probe = probe_stored_clip(storage, *name_and_size)
            bar.update(1)
            return probe

        return list(pool.map(one, zip(names, sizes)))
