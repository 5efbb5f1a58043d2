"""The datasets' folders: where output_dir may be against them, and folders that several
datasets read (torch-free: ``check`` and the preflight run both).

A run writes validation images and grids under output_dir, and "delete output_dir to start
over" is the README's advice. So output_dir is refused when it is the filesystem root or the
home folder, when it is a dataset folder or inside one (the next run would list the run's own
PNGs as training images), and when it holds one (deleting it would delete the dataset).
Both sides are compared resolved: the loader already made them absolute from the working
directory and resolved symlinks; resolving again keeps this true for a hand-built config.

Datasets that read one folder into different latent cache folders (the default is one per
dataset id) encode and cache every image once each: a warning, since entries that differ in
resolution or crop on purpose are a reason to have them.
"""

from __future__ import annotations

from pathlib import Path

from simpletuner.configuration import Configuration
from simpletuner.configuration.errors import Location, Problem
from simpletuner.helpers.data_backend.local import LocalStorage

_SHOWN_IDS = 5  # a folder shared by thousands of dataset entries is named, not listed whole
_OUTSIDE = "use an output_dir of its own, outside every dataset folder (e.g. output/<run-name>)"


def output_dir_problems(configuration: Configuration) -> list[Problem]:
    """Problems with where output_dir is (its key in config.json)."""
    output_dir = Path(configuration.training.output_dir).resolve()
    where = Location(str(configuration.config_path))
    if output_dir == Path(output_dir.anchor):
        return [where.problem("output_dir", f"key 'output_dir' is {output_dir}, the filesystem "
                              "root: the run would write its checkpoints, caches and images "
                              "there", _OUTSIDE)]
    if output_dir == Path.home().resolve():
        return [where.problem("output_dir", f"key 'output_dir' is {output_dir}, the home "
                              "folder: the run would write its checkpoints, caches and images "
                              "among your files, and deleting output_dir to start over would "
                              "delete them", _OUTSIDE)]
    backend = configuration.training.data_backend_config
    problems = []
    for folder, ids in _local_folders(configuration).items():
        named = f"{_datasets(ids)} (instance_data_dir in {backend})"
        if output_dir == folder:
            problems.append(where.problem(
                "output_dir", f"key 'output_dir' is {output_dir}, the folder of {named}: the "
                "next run would train on this run's validation images and grids, and deleting "
                "output_dir to start over would delete the dataset", _OUTSIDE))
        elif output_dir.is_relative_to(folder) and not _hidden_below(output_dir, folder):
            problems.append(where.problem(
                "output_dir", f"key 'output_dir' ({output_dir}) is inside {folder}, the folder "
                f"of {named}: the next run would train on this run's validation images and "
                "grids", _OUTSIDE))
        elif folder.is_relative_to(output_dir):
            problems.append(where.problem(
                "output_dir", f"key 'output_dir' ({output_dir}) holds {folder}, the folder of "
                f"{named}: deleting output_dir to start over would delete the dataset", _OUTSIDE))
    return problems


def shared_folder_warnings(configuration: Configuration) -> list[str]:
    """One warning per folder that datasets read into more than one latent cache folder, with
    the images and bytes encoded and cached again. Lists only the folders that are shared."""
    by_id = {ds.id: ds for ds in (*configuration.datasets, *configuration.references)}
    output_dir = Path(configuration.training.output_dir).resolve()
    backend = configuration.training.data_backend_config
    warnings = []
    for folder, ids in _local_folders(configuration).items():
        caches = {_latent_folder(by_id[dataset_id], output_dir) for dataset_id in ids}
        if len(caches) < 2:
            continue  # one cache folder: entries are content-addressed, so shared
        listing = LocalStorage(folder).list_files()
        images, size, again = len(listing.sample_ids), sum(listing.sizes), len(caches) - 1
        warnings.append(
            f"{backend}: {_datasets(ids)} read the same folder {folder} ({images} image"
            f"{'' if images == 1 else 's'}, {size:,} bytes) into {len(caches)} latent cache "
            f"folders, so each of its images is read, encoded and cached {len(caches)} times "
            f"({again * images} extra latents from {again * size:,} bytes of images). For more "
            "of these images per epoch use 'repeats' on one dataset; to keep several entries "
            "(other resolutions or crops), give them one 'cache_dir_vae' so that equal latents "
            "are shared")
    return warnings


def _latent_folder(ds, output_dir: Path) -> Path:
    """Where the dataset's latents go (caching/latents.py: cache_dir_vae, else per id below
    output_dir, which the loader resolved)."""
    if ds.cache_dir_vae:
        return Path(ds.cache_dir_vae).resolve()
    return output_dir / "cache" / "vae" / ds.id


def _local_folders(configuration: Configuration) -> dict[Path, list[str]]:
    """Resolved folder -> ids of the enabled local datasets (reference datasets too) that
    read it, in config order."""
    folders: dict[Path, list[str]] = {}
    resolved: dict[str, Path] = {}  # thousands of entries may name one folder: resolve it once
    for ds in (*configuration.datasets, *configuration.references):
        # a generated conditioning dataset (a conditioning block) caches what it makes of its
        # target's images, not their latents: not a second read of the folder to warn of
        if ds.type == "aws" or ds.instance_data_dir is None or ds.conditioning:
            continue
        if ds.instance_data_dir not in resolved:
            resolved[ds.instance_data_dir] = Path(ds.instance_data_dir).resolve()
        folders.setdefault(resolved[ds.instance_data_dir], []).append(ds.id)
    return folders


def _datasets(ids: list[str]) -> str:
    shown = ", ".join(f"'{dataset_id}'" for dataset_id in ids[:_SHOWN_IDS])
    more = f" and {len(ids) - _SHOWN_IDS} more" if len(ids) > _SHOWN_IDS else ""
    return f"dataset{'s' if len(ids) > 1 else ''} {shown}{more}"


def _hidden_below(path: Path, folder: Path) -> bool:
    """The listing skips hidden files and folders, so a '.name' on the way keeps path out."""
    return any(part.startswith(".") for part in path.relative_to(folder).parts)
