"""The model families this trainer supports, by SimpleTuner's model_family names: each is a
folder of simpletuner/families/ whose spec says what the configuration checks need to know."""

from __future__ import annotations

from simpletuner.families import family_names, family_spec, family_specs, flow_families
from simpletuner.families.frame_rule import FrameRule
from simpletuner.families.spec import FamilySpec

MODEL_FAMILIES = family_names()
# SimpleTuner's other names of a family here -> its name (the specs' simpletuner_names).
FAMILY_ALIASES = {alias: spec.name for spec in family_specs() for alias in spec.simpletuner_names}
FLOW_FAMILIES = flow_families()  # flow matching; the others predict noise (DDPM)


def known_spec(model_family: str | None) -> FamilySpec | None:
    """The family's spec; None for a value that names no family (its own check says so)."""
    return family_spec(model_family) if model_family in MODEL_FAMILIES else None


def families_where(wanted) -> list[str]:
    """The names of the families whose spec ``wanted`` accepts, as messages list them."""
    return [spec.name for spec in family_specs() if wanted(spec)]


def frame_rule(model_family: str | None) -> FrameRule | None:
    """The frame counts a video family's VAE encodes; None for a family trained on images."""
    spec = known_spec(model_family)
    return None if spec is None else spec.frame_rule


def video_families() -> list[str]:
    return families_where(lambda spec: spec.frame_rule is not None)
