"""lora_format 'comfyui': for every family with LoRA, the exported file has the key layout of
the family's ecosystem (written out below from diffusers' converters, which read those files),
and diffusers' own load_lora_weights, converting it, gives the image the diffusers file gives."""

from __future__ import annotations

import re
import tempfile
import unittest
from pathlib import Path

import numpy as np
import torch
from diffusers import DiffusionPipeline
from safetensors import safe_open

from model_fixtures import TinyModelCase
from trained_outputs import file_data_sha256
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.training.adapters.lora import add_lora, export_lora

RANK, ALPHA = 4, 8.0
_UNET = (r"lora_unet_(down_blocks_\d+|mid_block|up_blocks_\d+)_attentions_\d+_"
         r"transformer_blocks_\d+_attn[12]_to_(q|k|v|out_0)")
_KOHYA = (r"\.lora_down\.weight", r"\.lora_up\.weight", r"\.alpha")
_DOWN_UP = (r"\.lora_down\.weight", r"\.lora_up\.weight", r"\.alpha")
_A_B = (r"\.lora_A\.weight", r"\.lora_B\.weight", r"\.alpha")
_FLUX = (r"transformer\.(transformer_blocks\.\d+\.attn\.(to_q|to_k|to_v|to_out\.0|add_q_proj|"
         r"add_k_proj|add_v_proj|to_add_out)|single_transformer_blocks\.\d+\.attn\.(to_q|to_k|"
         r"to_v))")
# The module keys of each family's ComfyUI file and the suffixes beside them: kohya's SD
# layout (diffusers' _convert_non_diffusers_lora_to_diffusers), Flux's transformer. layout with
# alpha (FluxLoraLoaderMixin.lora_state_dict), the diffusion_model. layouts of Qwen-Image,
# Z-Image and Wan (_convert_non_diffusers_{qwen,z_image,wan}_lora_to_diffusers), LTX-Video's.
REFERENCE_LAYOUTS = {
    "sd1x": (_UNET, _KOHYA), "sd2x": (_UNET, _KOHYA),
    "sdxl": (_UNET, _KOHYA),
    "flux": (_FLUX, _A_B),
    "chroma": (r"transformer\.(transformer_blocks\.\d+\.attn\.(to_q|to_k|to_v|to_out\.0)|"
               r"single_transformer_blocks\.\d+\.attn\.(to_q|to_k|to_v))", _A_B),
    "sd3": (r"transformer\.transformer_blocks\.\d+\.attn\.(to_q|to_k|to_v|to_out\.0|add_q_proj|"
            r"add_k_proj|add_v_proj|to_add_out)", (r"\.lora_A\.weight", r"\.lora_B\.weight")),
    "qwen_image": (r"diffusion_model\.transformer_blocks\.\d+\.attn\.(to_q|to_k|to_v|to_out\.0)",
                   _DOWN_UP),
    "z_image": (r"diffusion_model\.(layers|noise_refiner|context_refiner)\.\d+\.attention\."
                r"(to_q|to_k|to_v|to_out\.0)", _DOWN_UP),
    "wan": (r"diffusion_model\.blocks\.\d+\.(self_attn|cross_attn)\.(q|k|v|o)", _DOWN_UP),
    "flux2": (r"diffusion_model\.(double_blocks\.\d+\.img_attn\.(qkv|proj)|single_blocks\.\d+\."
              r"linear1)", (r"\.lora_A\.weight", r"\.lora_B\.weight")),
    # _convert_non_diffusers_ltxv_lora_to_diffusers: LTX's names are diffusers', no alpha
    "ltxvideo": (r"diffusion_model\.transformer_blocks\.\d+\.attn[12]\."
                 r"(to_q|to_k|to_v|to_out\.0)",
                 (r"\.lora_A\.weight", r"\.lora_B\.weight")),
    # _convert_non_diffusers_ltx2_lora_to_diffusers: the attention projections keep their names
    "ltxvideo2": (r"diffusion_model\.transformer_blocks\.\d+\.(audio_)?(attn[12]|"
                  r"audio_to_video_attn|video_to_audio_attn)\.(to_q|to_k|to_v|to_out\.0)",
                  (r"\.lora_A\.weight", r"\.lora_B\.weight")),
}
# Modules whose LoRA the file holds inside another's: FLUX.2 fuses k and v into q's img_attn.qkv.
MERGED = {"flux2": r"transformer_blocks\.\d+\.attn\.to_(k|v)"}


def _image(folder: Path, adapter, lora_folder: Path | None) -> np.ndarray:
    pipeline = DiffusionPipeline.from_pretrained(folder)
    if lora_folder is not None:
        pipeline.load_lora_weights(lora_folder)
    pipeline.set_progress_bar_config(disable=True)
    arguments = {**adapter.validation_arguments({"guidance_scale": 3.0}), "output_type": "np"}
    result = pipeline(prompt="a red circle", height=64, width=64, num_inference_steps=2,
                      generator=torch.Generator().manual_seed(0), **arguments)
    frames = getattr(result, "frames", None)
    return np.asarray(result.images if frames is None else frames, dtype=np.float64)


class ComfyUIFormatTest(TinyModelCase):
    def setUp(self):
        self.output = Path(self.enterContext(tempfile.TemporaryDirectory()))

    def _adapted(self, family: str):
        adapter = self.load(family)
        torch.manual_seed(0)
        add_lora(adapter.trainable, type(adapter), rank=RANK, alpha=ALPHA)
        with torch.no_grad():  # a trained-looking adapter: B away from its zero start
            for name, parameter in adapter.trainable.named_parameters():
                if ".lora_B." in name:
                    parameter.normal_(0.0, 0.05)
        return adapter

    def _assert_layout(self, family: str, path: Path, adapted_modules: int):
        module_pattern, suffixes = REFERENCE_LAYOUTS[family]
        with safe_open(str(path), "pt") as handle:
            keys, metadata = list(handle.keys()), handle.metadata()
            alphas = [handle.get_tensor(k).item() for k in keys if k.endswith(".alpha")]
            fused = [handle.get_tensor(k).shape[0] for k in keys if ".qkv.lora_A" in k]
        modules = set()
        for key in keys:
            match = re.fullmatch(f"({module_pattern})({'|'.join(suffixes)})", key)
            self.assertIsNotNone(match, f"{family}: {key} is not in the reference layout")
            modules.add(match.group(1))
        self.assertEqual(len(modules), adapted_modules)
        self.assertEqual(len(keys), len(suffixes) * adapted_modules)
        self.assertTrue(all(alpha == ALPHA for alpha in alphas), alphas[:3])
        self.assertTrue(all(r == 3 * RANK for r in fused), fused)  # q, k and v stacked
        self.assertEqual(metadata["ss_network_dim"], str(RANK))
        self.assertEqual(metadata["sshs_model_hash"], file_data_sha256(path))  # kohya's form

    def test_each_family_file_loads_in_diffusers_as_the_diffusers_file(self):
        for family in REFERENCE_LAYOUTS:
            with self.subTest(family=family):
                adapter = self._adapted(family)
                network, adapter_class = adapter.trainable, type(adapter)
                adapted = [n for n, m in network.named_modules() if hasattr(m, "lora_A")]
                merged = [n for n in adapted if re.fullmatch(MERGED.get(family, "$^"), n)]
                diffusers_file = export_lora(adapter_class, network, self.output / family / "d")
                comfyui_file = export_lora(adapter_class, network, self.output / family / "c",
                                           "comfyui")
                self._assert_layout(family, comfyui_file, len(adapted) - len(merged))
                folder = ensure_builtin_model(f"tiny-{family}")
                base = _image(folder, adapter, None)
                expected = _image(folder, adapter, diffusers_file.parent)
                got = _image(folder, adapter, comfyui_file.parent)
                self.assertGreater(np.abs(expected - base).max(), 1e-3, "the LoRA does nothing")
                self.assertLessEqual(np.abs(got - expected).max(), 1e-4)


if __name__ == "__main__":
    unittest.main()
