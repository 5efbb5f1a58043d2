"""Third-party messages that say nothing about a run, dropped where they are raised.

Each is one message of one library logger about an optional backend this machine cannot use
(bitsandbytes' CPU kernel from a hub repository, torchao's CUDA-only libraries, torchvision's
image processors) or a deprecation inside torchao's own call to torch. A filter on that logger
drops only records whose message matches, so the same loggers' other warnings still show."""

from __future__ import annotations

import logging

# logger name -> text its noise contains
NOISE = {
    "bitsandbytes.backends.cpu.ops": "Failed to load CPU gemm_4bit_forward",
    "torchao": "Failed to load ",
    "torch.utils._pytree": "is an Enum subclass and is now natively supported",
    "diffusers.quantizers.torchao.torchao_quantizer": "Unable to import `torchao` Tensor",
    "transformers.utils.import_utils": "requires torchvision (not installed)",
}


class _DropMessage(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in str(record.msg)


def quiet_libraries() -> None:
    """Install the filters (once per logger, however often it is called)."""
    for name, text in NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) for f in logger.filters):
            logger.addFilter(_DropMessage(text))
