"""The Qwen3VLProcessor Qwen-Image 2.1 reads prompts with, built and saved without torchvision
(as processor.py does for Qwen2VLProcessor: transformers checks the video part against a base
class that exists only with torchvision, and the pipeline passes images and text only). It
saves the folder Qwen3VLProcessor itself writes, so where torchvision is installed
``QwenImage21Pipeline.from_pretrained`` loads an export with no arguments; without it, pass
``processor=ImageTextQwen3VLProcessor.from_pretrained(folder, subfolder="processor")``."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import Qwen2Tokenizer, Qwen3VLProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from simpletuner.common.atomic import atomic_write_text

# What model_index.json names: the class the folder is for, not the subclass built here.
PIPELINE_ENTRY = ("transformers", "Qwen3VLProcessor")
IMAGE_CONFIG, VIDEO_CONFIG = "preprocessor_config.json", "video_preprocessor_config.json"


class ImageTextQwen3VLProcessor(Qwen3VLProcessor):
    """Qwen3VLProcessor without its video part (see the module docstring)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    @classmethod
    def from_pretrained(cls, folder, subfolder: str = "", **_) -> "ImageTextQwen3VLProcessor":
        """A processor folder (preprocessor_config.json and the tokenizer files)."""
        image = Qwen2VLImageProcessorPil.from_pretrained(folder, subfolder=subfolder)
        tokenizer = Qwen2Tokenizer.from_pretrained(folder, subfolder=subfolder)
        return cls(image, tokenizer, chat_template=tokenizer.chat_template)

    def to_dict(self) -> dict:
        return {**super().to_dict(), "processor_class": PIPELINE_ENTRY[1]}

    def save_pretrained(self, save_directory, **kwargs):
        """Qwen3VLProcessor's files; the image part's config also on its own, and the video
        part's config Qwen3VLProcessor would have written, with the image part's patching and
        statistics."""
        written = super().save_pretrained(save_directory, **kwargs)
        image = self.image_processor
        atomic_write_text(Path(save_directory) / IMAGE_CONFIG, image.to_json_string())
        video = {"video_processor_type": "Qwen3VLVideoProcessor",
                 "processor_class": PIPELINE_ENTRY[1],
                 "patch_size": image.patch_size, "temporal_patch_size": image.temporal_patch_size,
                 "merge_size": image.merge_size, "image_mean": image.image_mean,
                 "image_std": image.image_std, "do_convert_rgb": True, "do_resize": True,
                 "do_rescale": True, "do_normalize": True, "resample": 3,
                 "rescale_factor": image.rescale_factor}
        atomic_write_text(Path(save_directory) / VIDEO_CONFIG, json.dumps(video, indent=2))
        return written
