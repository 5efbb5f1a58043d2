"""``dataset_type: video``: clips trained on, each probed for its frames and bucketed by them
(helpers/metadata/backends/clip_source.py, video_buckets.py; the ``video`` block)."""

from simpletuner.dataset_kinds.kind import DatasetKind
from simpletuner.helpers.data_backend.storage import VIDEO_EXTENSIONS

KIND = DatasetKind(name="video", extensions=VIDEO_EXTENSIONS, trains=True, has_clips=True,
                   sample_noun="clip", probe_noun="clips probed", needs=("av", "video"))
