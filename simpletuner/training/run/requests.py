"""Requests a running training takes from outside, at its next step: save a checkpoint now,
validate now (the web UI's buttons; any script may do the same). A request is a file in
``output_dir/requests/``, written atomically; the main rank looks for them before each step's
reduce, which carries them to every rank, so all ranks act at the same step. The file is
removed once acted on. Torch-free: the UI writes them."""

from __future__ import annotations

from pathlib import Path

from simpletuner.common.atomic import atomic_write_text

REQUESTS_FOLDER = "requests"
CHECKPOINT, VALIDATE = "checkpoint", "validate"
REQUESTS = (CHECKPOINT, VALIDATE)


def request(output_dir: Path, name: str) -> Path:
    """Ask the run training in ``output_dir`` for ``name`` at its next step."""
    if name not in REQUESTS:
        raise ValueError(f"{name!r} is not a run request; known: {', '.join(REQUESTS)}")
    path = Path(output_dir) / REQUESTS_FOLDER / name
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "")
    return path


class RunRequests:
    """The main rank's view of ``output_dir/requests/``; other ranks see none (the step's
    reduce tells them)."""

    def __init__(self, output_dir: Path, *, main: bool):
        self.folder = Path(output_dir) / REQUESTS_FOLDER
        self.main = main

    def pending(self) -> tuple[bool, bool]:
        """(checkpoint asked, validation asked): two stat calls a step, on the main rank."""
        if not self.main:
            return False, False
        return tuple((self.folder / name).exists() for name in REQUESTS)

    def answered(self, totals) -> None:
        """Remove the requests this step's reduce carried (``totals``: its StepTotals), before
        they are acted on, so one asked during the checkpoint or validation waits for the
        next step instead of being lost."""
        if not self.main:
            return
        for name, asked in zip(REQUESTS, (totals.checkpoint_asked, totals.validation_asked)):
            if asked:
                (self.folder / name).unlink(missing_ok=True)
