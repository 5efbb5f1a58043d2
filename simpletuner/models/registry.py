"""model_family -> adapter class, as the family's spec names it (simpletuner/families/).
Adapters are imported only when asked for, so choosing one family never imports another's
dependencies."""

from __future__ import annotations

from simpletuner.families import family_spec, load_object
from simpletuner.models.base import ModelAdapter


def get_adapter_class(model_family: str) -> type[ModelAdapter]:
    """The family's adapter for its usual folder (``for_folder`` picks a variant's); ValueError
    naming the known families for an unknown one."""
    return load_object(family_spec(model_family).adapter)
