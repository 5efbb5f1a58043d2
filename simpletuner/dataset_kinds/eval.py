"""``dataset_type: eval``: images whose loss is measured every eval_steps_interval, each sample
exactly once per evaluation, one per rank at a time; never trained on."""

from simpletuner.dataset_kinds.kind import DatasetKind
from simpletuner.helpers.data_backend.storage import IMAGE_EXTENSIONS

KIND = DatasetKind(name="eval", extensions=IMAGE_EXTENSIONS, trains=False, evaluates=True,
                   takes_references=True)
