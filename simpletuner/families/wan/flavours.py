"""Which Wan folders are a supported flavour, decided without torch from the folder's layout and
model_index.json: Wan 2.1 text-to-video and image-to-video (one transformer), Wan 2.2 T2V-A14B
(two experts, transformer/ for high noise and transformer_2/ for low, split at boundary_ratio)
and Wan 2.2 TI2V-5B (expand_timesteps) as text-to-video. ``check`` (run by ./train.sh before the
launcher) and the adapter's folder check both ask it, so VACE and Wan 2.2 I2V folders are
refused by name; and whether ``model_flavour`` names the folder's kind."""

from __future__ import annotations

from pathlib import Path

from simpletuner.models.model_index import read_model_index as model_index

T2V_PIPELINE, I2V_PIPELINE = "WanPipeline", "WanImageToVideoPipeline"
# What each kind of folder is, as the refusals name it.
KINDS = {"t2v": "a Wan 2.1 text-to-video model (WanPipeline, one transformer)",
         "i2v": "a Wan 2.1 image-to-video model (WanImageToVideoPipeline)",
         "a14b": "a two-expert Wan 2.2 A14B model (transformer_2/ and boundary_ratio)",
         "ti2v": "a Wan 2.2 TI2V-5B model (WanPipeline with expand_timesteps)"}
# SimpleTuner's model_flavour names -> the kind of folder they name.
FLAVOUR_KINDS = {"t2v-480p-1.3b-2.1": "t2v", "t2v-480p-14b-2.1": "t2v",
                 "i2v-480p-14b-2.1": "i2v", "i2v-720p-14b-2.1": "i2v",
                 "t2v-14b-2.2-high": "a14b", "t2v-14b-2.2-low": "a14b", "ti2v-5b-2.2": "ti2v"}
# model_flavour -> the A14B expert it trains, named after SimpleTuner's i2v-14b-2.2-high/-low.
EXPERT_FLAVOURS = {"t2v-14b-2.2-high": "high", "t2v-14b-2.2-low": "low"}
SUPPORTED = ("supported here: Wan 2.1 text-to-video (model_flavour t2v-480p-1.3b-2.1 or "
             "t2v-480p-14b-2.1: a WanPipeline folder with one transformer), Wan 2.1 "
             "image-to-video (i2v-480p-14b-2.1 or i2v-720p-14b-2.1: a WanImageToVideoPipeline "
             "folder with image_encoder/), Wan 2.2 T2V-A14B (t2v-14b-2.2-high or "
             "t2v-14b-2.2-low: a WanPipeline folder with transformer_2/ and boundary_ratio) and "
             "Wan 2.2 TI2V-5B as text-to-video (ti2v-5b-2.2: a WanPipeline folder with "
             "expand_timesteps)")


def is_two_expert(folder: Path) -> bool:
    """A Wan 2.2 A14B folder: transformer_2/ beside transformer/."""
    return (folder / "transformer_2").is_dir()


def folder_kind(folder: Path) -> str:
    """The folder's key in KINDS, from its layout (unsupported_flavour refuses the mixtures)."""
    if is_two_expert(folder):
        return "a14b"
    index = model_index(folder)
    if index.get("expand_timesteps"):
        return "ti2v"
    return "i2v" if index.get("_class_name") == I2V_PIPELINE else "t2v"


def unsupported_flavour(folder: Path) -> str | None:
    """What makes ``folder`` a Wan flavour not supported here (VACE, Wan 2.2 I2V, a second
    expert with no boundary), or None."""
    index = model_index(folder)
    name = index.get("_class_name", "")
    if name.startswith("Wan") and name not in (T2V_PIPELINE, I2V_PIPELINE):
        return f"its model_index.json names {name}"
    has_boundary = index.get("boundary_ratio") is not None
    if name == I2V_PIPELINE:
        if has_boundary or is_two_expert(folder) or index.get("expand_timesteps"):
            return (f"its model_index.json names {I2V_PIPELINE} with Wan 2.2's transformer_2/, "
                    "boundary_ratio or expand_timesteps (Wan 2.2 image-to-video)")
        if not (folder / "image_encoder").is_dir():
            return "it is an image-to-video folder without image_encoder/ (Wan 2.2 I2V)"
    if is_two_expert(folder) and not has_boundary:
        return "it has transformer_2/ but its model_index.json sets no boundary_ratio"
    if has_boundary and not is_two_expert(folder):
        return "its model_index.json sets boundary_ratio but it has no transformer_2/"
    return None


def unsupported_folder(name_or_path: str) -> str | None:
    """Why the local folder ``name_or_path`` is a Wan flavour not supported here, as ``check``
    and the folder check say it; None when it is supported."""
    problem = unsupported_flavour(Path(name_or_path).expanduser())
    return None if problem is None else (
        f"{name_or_path} is not a supported Wan folder: {problem}; {SUPPORTED}")


def flavour_mismatch(folder: Path, flavour: str | None) -> str | None:
    """Why ``flavour`` does not name ``folder``'s kind of Wan model; None if it does, or if it
    is not set where the folder decides (a two-expert folder needs the expert to train)."""
    kind = folder_kind(folder)
    if kind == "a14b" and flavour not in EXPERT_FLAVOURS:
        return (f"{folder} is a two-expert Wan 2.2 A14B model; set model_flavour to "
                f"{' or '.join(EXPERT_FLAVOURS)} (the high- or low-noise expert to train)"
                + ("" if flavour is None else f", not {flavour!r}"))
    if flavour is None:
        return None
    if flavour not in FLAVOUR_KINDS:
        return (f"{flavour!r} is not a supported Wan flavour; use one of "
                f"{', '.join(FLAVOUR_KINDS)}, or remove it (the folder decides)")
    expected = FLAVOUR_KINDS[flavour]
    if expected == kind:
        return None
    if flavour in EXPERT_FLAVOURS:
        return (f"{flavour!r} trains one expert of a Wan 2.2 A14B model, but {folder} has one "
                "transformer; use a folder with transformer_2/ (e.g. builtin:tiny-wan22), or "
                "remove model_flavour")
    return (f"{flavour!r} is {KINDS[expected]}, but {folder} is {KINDS[kind]}; set "
            "model_flavour to match the folder, or remove it")


def boundary_ratio(folder: Path) -> float:
    return float(model_index(folder)["boundary_ratio"])
