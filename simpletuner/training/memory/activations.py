"""The activation estimate: what autograd keeps for the backward of one micro-batch, counted by
running the family's own loss (its encoders for the batch's shapes, its packing, its
transformer) on the meta device, where nothing is computed or allocated. Every tensor saved for
the backward is seen by a saved-tensor hook and counted once per storage; the trained
network's parameters are weights, not activations, and are left out.

Attention is counted as the fused kernels keep it (query, key, value, output and one float32
log-sum-exp per row), not as the meta device's unfused math would (a score matrix per head).
Under gradient checkpointing a block keeps only its inputs until the backward recomputes it,
so the estimate is what runs outside the blocks, every block's inputs, and the largest
block's own saved tensors while it is recomputed. Under mixed precision the network runs in
its half dtype (autocast keeps a few results, norms and softmax, in float32: not counted)."""

from __future__ import annotations

import math
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.fx.experimental._config as fx_config
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from simpletuner.models.base import LossSettings

from simpletuner.models.training_batch import TrainingBatch
from simpletuner.training.preflight import weight_dtype

META = torch.device("meta")


class DataFree(TorchDispatchMode):
    """Meta tensors hold no values: where code reads one (a mask's ``.all()``, a count), it
    reads True / 1, i.e. nothing is padded."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default and args[0].is_meta:
            return True if args[0].dtype == torch.bool else 1
        try:
            return func(*args, **(kwargs or {}))
        except RuntimeError:
            # Host tensors that a family builds from shapes alone (token layouts, which the
            # meta device could not size) meet the meta tensors: as meta tensors.
            if not any(isinstance(arg, torch.Tensor) and arg.is_meta for arg in args):
                raise
            return func(*(_as_meta(arg) for arg in args), **(kwargs or {}))


def _as_meta(value):
    return value.to(META) if isinstance(value, torch.Tensor) and value.dim() else value


class _FusedAttention(torch.autograd.Function):
    """Shapes and saved tensors of a fused attention kernel (an attention mask, when given,
    is kept for the backward too), nothing computed."""

    @staticmethod
    def forward(ctx, query, key, value, mask):
        out = query.new_empty((*query.shape[:-1], value.shape[-1]))
        log_sum_exp = query.new_empty(query.shape[:-1], dtype=torch.float32)
        kept = (query, key, value, out, log_sum_exp) + ((mask,) if mask is not None else ())
        ctx.save_for_backward(*kept)
        return out

    @staticmethod
    def backward(ctx, grad):
        query, key, value = ctx.saved_tensors[:3]
        return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value), None


class FusedAttentionCounted(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            named = dict(zip(("query", "key", "value", "attn_mask"), args)) | kwargs
            return _FusedAttention.apply(named["query"], named["key"], named["value"],
                                         named.get("attn_mask"))
        return func(*args, **kwargs)


class SavedTensorCounter:
    """Bytes of the storages saved for the backward, each once, parameters excepted; with a
    running total per block (between its forward's pre- and post-hook) and its inputs."""

    def __init__(self, parameters):
        self.parameters = {id(p) for p in parameters}
        self.storages: dict[int, int] = {}
        self.blocks: list[tuple[int, int]] = []  # (saved inside, inputs) per block run

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in self.parameters and id(tensor._base) not in self.parameters:
            storage = tensor.untyped_storage()
            self.storages.setdefault(storage._cdata, storage.nbytes())
        return tensor

    @property
    def total(self) -> int:
        return sum(self.storages.values())

    def watch(self, block: torch.nn.Module, stack: ExitStack) -> None:
        start = {}

        def before(_, args, kwargs):
            tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
            start["saved"] = self.total
            start["inputs"] = sum(t.untyped_storage().nbytes() for t in tensors)

        def after(*_):
            self.blocks.append((self.total - start["saved"], start["inputs"]))

        stack.callback(block.register_forward_pre_hook(before, with_kwargs=True).remove)
        stack.callback(block.register_forward_hook(after).remove)


@dataclass(frozen=True)
class ActivationBytes:
    saved: int              # saved for the backward by the whole forward
    blocks_saved: int       # of which inside the repeated blocks
    blocks_inputs: int      # every block's inputs
    largest_block: int      # the largest block's own saved tensors

    def held(self, gradient_checkpointing: bool) -> int:
        if not gradient_checkpointing:
            return self.saved
        return self.saved - self.blocks_saved + self.blocks_inputs + self.largest_block

    def per_rank(self, context_parallel: int) -> "ActivationBytes":
        """One rank's with context_parallel_size C: inside the blocks a rank holds 1/C of the
        sequence (its attention over the whole sequence is for 1/C of the heads); outside them
        (the embedders, the output gathered whole, the loss) the whole micro-batch's."""
        c = context_parallel
        return ActivationBytes(saved=self.saved - self.blocks_saved + self.blocks_saved // c,
                               blocks_saved=self.blocks_saved // c,
                               blocks_inputs=self.blocks_inputs // c,
                               largest_block=self.largest_block // c)


def planned_size(training) -> tuple[int, int]:
    """(height, width) of the plan's micro-batch: the square of the training resolution's
    area (aspect buckets hold about as many pixels), on aspect_bucket_alignment."""
    side = {"pixel": training.resolution, "pixel_area": training.resolution,
            "area": math.sqrt(training.resolution * 1e6)}[training.resolution_type]
    alignment = training.aspect_bucket_alignment
    side = max(alignment, round(side / alignment) * alignment)
    return side, side


def meta_adapter(adapter_class, folder: Path, training, network: torch.nn.Module):
    """A transformer family's adapter around ``network`` with every module on the meta device
    and the folder's own tokenizers and scheduler."""
    with torch.device("meta"):
        vae = adapter_class.vae_class.from_config(
            adapter_class.vae_class.load_config(folder / "vae"))
        encoders = [encoder_class(encoder_class.config_class.from_pretrained(folder / sub))
                    for sub, _, encoder_class, _ in adapter_class.text_encoder_specs]
    tokenizers = [tokenizer_class.from_pretrained(folder / sub)
                  for _, sub, _, tokenizer_class in adapter_class.text_encoder_specs]
    scheduler = adapter_class.scheduler_class.from_pretrained(folder, subfolder="scheduler")
    return adapter_class(folder=folder, vae=vae.eval(),
                         text_encoders=[encoder.eval() for encoder in encoders],
                         tokenizers=tokenizers, device=META, transformer=network,
                         loss_settings=LossSettings.from_config(training), scheduler=scheduler)


def meta_batch(adapter, count: int, height: int, width: int, frames: int) -> TrainingBatch:
    """A micro-batch of ``count`` images (or clips of ``frames``) as the caches would hold it,
    its shapes from the family's own encoders."""
    shape = (count, 3, height, width) if frames == 1 else (count, 3, frames, height, width)
    with torch.no_grad(), DataFree():
        latents = adapter.encode_images(torch.empty(shape, device=META))
        embeds = adapter.planned_prompt_embeds(count)
    return TrainingBatch(latents=latents, prompt_embeds=embeds,
                         original_sizes=[(height, width)] * count,
                         crop_top_lefts=[(0, 0)] * count, target_sizes=[(height, width)] * count)


def activation_bytes(adapter_class, folder: Path, training, network: torch.nn.Module, *,
                     batch_size: int, height: int, width: int, frames: int = 1) -> ActivationBytes:
    """The estimate for ``network`` (on the meta device, a LoRA added as the trainer adds it;
    it is cast to the compute dtype here)."""
    dtype = weight_dtype(training.mixed_precision)
    torch.nn.Module.to(network, dtype).train()  # (diffusers' own .to warns about float32 parts)
    adapter = meta_adapter(adapter_class, folder, training, network)
    batch = meta_batch(adapter, batch_size, height, width, frames)
    counter = SavedTensorCounter(network.parameters())
    with ExitStack() as stack:
        for block in adapter.swappable_blocks(network):
            counter.watch(block, stack)
        stack.enter_context(every_element_selected())
        stack.enter_context(autocast_on_meta_is_nothing())
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t))
        stack.enter_context(DataFree())
        stack.enter_context(FusedAttentionCounted())
        adapter.compute_loss(batch, torch.Generator().manual_seed(0))
    inside = [saved for saved, _ in counter.blocks]
    return ActivationBytes(saved=counter.total, blocks_saved=sum(inside),
                           blocks_inputs=sum(inputs for _, inputs in counter.blocks),
                           largest_block=max(inside, default=0))


@contextmanager
def autocast_on_meta_is_nothing():
    """torch.autocast refuses the meta device, where a forward may switch autocast off around
    a part it keeps in float32 (ERNIE-Image's rotary positions): there it changes nothing."""
    original = torch.autocast

    def autocast(device_type, *args, **kwargs):
        if device_type == META.type:
            return nullcontext()
        return original(device_type, *args, **kwargs)

    torch.autocast = autocast
    try:
        yield
    finally:
        torch.autocast = original


@contextmanager
def every_element_selected():
    """Boolean indexing on meta tensors: every element counts as selected (nothing padded)."""
    before = fx_config.meta_nonzero_assume_all_nonzero
    fx_config.meta_nonzero_assume_all_nonzero = True
    try:
        yield
    finally:
        fx_config.meta_nonzero_assume_all_nonzero = before
