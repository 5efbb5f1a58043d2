"""The Qwen2VLProcessor the Qwen-Image-Edit pipelines read reference images with, built and saved
without torchvision. transformers checks each part of a processor against its base class, and
the video part's base class exists only with torchvision, so even ``video_processor=None`` fails;
the edit pipelines pass images and text only. ``ImageTextQwen2VLProcessor`` is Qwen2VLProcessor
with those two parts (the image part is transformers' Pillow image processor), and it saves the
folder Qwen2VLProcessor itself writes, video part included, so where torchvision is installed
``QwenImageEditPipeline.from_pretrained`` loads the export with no arguments."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import Qwen2Tokenizer, Qwen2VLProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from simpletuner.common.atomic import atomic_write_text

# What model_index.json names: the class the folder is for, not the subclass built here.
PIPELINE_ENTRY = ("transformers", "Qwen2VLProcessor")
IMAGE_CONFIG, VIDEO_CONFIG = "preprocessor_config.json", "video_preprocessor_config.json"


class ImageTextQwen2VLProcessor(Qwen2VLProcessor):
    """Qwen2VLProcessor without its video part (see the module docstring)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    def to_dict(self) -> dict:
        return {**super().to_dict(), "processor_class": PIPELINE_ENTRY[1]}

    def save_pretrained(self, save_directory, **kwargs):
        """Qwen2VLProcessor's files; the image part's config also on its own, as processors
        saved before transformers 5 have it; and the video part's config Qwen2VLProcessor would
        have written: the default Qwen2VLVideoProcessor's, with the image part's patching and
        statistics."""
        written = super().save_pretrained(save_directory, **kwargs)
        image = self.image_processor
        atomic_write_text(Path(save_directory) / IMAGE_CONFIG, image.to_json_string())
        video = {"video_processor_type": "Qwen2VLVideoProcessor",
                 "processor_class": PIPELINE_ENTRY[1],
                 "patch_size": image.patch_size, "temporal_patch_size": image.temporal_patch_size,
                 "merge_size": image.merge_size, "image_mean": image.image_mean,
                 "image_std": image.image_std, "do_convert_rgb": True, "do_resize": True,
                 "do_rescale": True, "do_normalize": True, "resample": 3,
                 "rescale_factor": image.rescale_factor,
                 "size": {"shortest_edge": 128 * 28 * 28, "longest_edge": 768 * 28 * 28}}
        atomic_write_text(Path(save_directory) / VIDEO_CONFIG, json.dumps(video, indent=2))
        return written


def build_processor(tokenizer: Qwen2Tokenizer, **image_settings) -> ImageTextQwen2VLProcessor:
    """Around ``tokenizer``; ``image_settings`` for Qwen2VLImageProcessorPil (e.g. its size)."""
    return ImageTextQwen2VLProcessor(Qwen2VLImageProcessorPil(**image_settings), tokenizer,
                                     chat_template=tokenizer.chat_template)


def load_processor(folder: Path, subfolder: str = "processor") -> ImageTextQwen2VLProcessor:
    """A pipeline folder's processor/ (preprocessor_config.json and the tokenizer files)."""
    image = Qwen2VLImageProcessorPil.from_pretrained(folder, subfolder=subfolder)
    tokenizer = Qwen2Tokenizer.from_pretrained(folder, subfolder=subfolder)
    return ImageTextQwen2VLProcessor(image, tokenizer, chat_template=tokenizer.chat_template)
