"""``dataset_type: conditioning``: reference images of an edit dataset, each paired with the
target of the same path (helpers/metadata/pairs.py) and trained only as part of it. Captions
are the target's, so no caption files are read here."""

from simpletuner.dataset_kinds.kind import DatasetKind
from simpletuner.helpers.data_backend.storage import IMAGE_EXTENSIONS

KIND = DatasetKind(name="conditioning", extensions=IMAGE_EXTENSIONS, trains=False,
                   is_reference=True, reads_caption_files=False)
