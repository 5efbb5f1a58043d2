"""``dataset_type: image`` (the default): images trained on."""

from simpletuner.dataset_kinds.kind import DatasetKind
from simpletuner.helpers.data_backend.storage import IMAGE_EXTENSIONS

KIND = DatasetKind(name="image", extensions=IMAGE_EXTENSIONS, trains=True,
                   takes_references=True, is_default=True)
