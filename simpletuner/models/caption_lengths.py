"""A network without a text mask (Kandinsky 5, LongCat-Image-Edit) attends to every caption
token it is given, so a sample sees exactly its own caption, as its pipeline encodes one prompt,
only when every sample of the call has that many tokens: a batch runs once per caption length
and the outputs go back in the batch's order."""

from __future__ import annotations

from typing import Callable

import torch


def per_caption_length(mask: torch.Tensor,
                       predict: Callable[[torch.Tensor, int], torch.Tensor]) -> torch.Tensor:
    """``predict(rows, length)``: the output of the batch rows ``rows`` (an index tensor) with
    their captions cut to ``length`` tokens; ``mask`` [B, T] marks each caption's tokens (on
    the meta device, the memory plan's: all T)."""
    if mask.is_meta:
        lengths = [mask.shape[1]] * mask.shape[0]
    else:
        lengths = mask.to(torch.long).sum(dim=1).tolist()
    groups: dict[int, list[int]] = {}
    for row, length in enumerate(lengths):
        groups.setdefault(int(length), []).append(row)
    outputs, order = [], []
    for length, rows in groups.items():
        outputs.append(predict(torch.tensor(rows, device=mask.device), length))
        order += rows
    if len(groups) == 1:
        return outputs[0]
    return torch.cat(outputs)[torch.argsort(torch.tensor(order, device=mask.device))]
