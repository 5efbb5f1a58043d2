"""plan --memory's memory model against the bytes of real tensors: each built-in tiny model set
up as the trainer does it for a grid of configs (optimizer x base precision x LoRA/full x EMA x
frozen parts kept or freed, text encoders quantized, optimizer_config), one real step taken,
every parameter, gradient, optimizer state tensor, EMA buffer and frozen component summed.
Unsharded (DDP) in this process; sharded with FSDP2 on two real gloo processes."""

from __future__ import annotations

import itertools
import json
import sys
import tempfile
import unittest
from pathlib import Path

from simpletuner.models.builtin import resolve_model_path
from simpletuner.training.memory.model import RankBytes, memory_plan

from memory_fixtures import case_config, measure
from launching import run_bounded
from training_fixtures import environment

RUNNER = Path(__file__).with_name("memory_measure_runner.py")
TOLERANCE = 0.05
OPTIMIZERS = ("adamw", "adamw_bf16", "ao-adamw8bit", "prodigy", "adafactor", "lion")


def _toggles(index: int) -> dict:
    """EMA and the frozen parts' fate, alternated so each optimizer and precision meets both."""
    return {"use_ema": index % 2 == 0,
            "frozen_components_after_caching": ("keep", "free")[index // 2 % 2]}


def _lora_cases() -> list[dict]:
    grid = itertools.product(("no_change", "int8-torchao", "int8-quanto"), OPTIMIZERS)
    cases = [{"family": "flux", "model_type": "lora", "mixed_precision": "bf16",
              "base_model_precision": precision, "optimizer": optimizer, **_toggles(index)}
             for index, (precision, optimizer) in enumerate(grid)]
    return cases + [
        {"family": "sd1x", "model_type": "lora", "base_model_precision": "int8-quanto",
         "mixed_precision": "bf16", "optimizer": "adafactor", "text_encoder_1_precision":
         "int8-torchao", **_toggles(0)},
        {"family": "sd1x", "model_type": "lora", "optimizer": "adamw",  # a float32 base
         "optimizer_config": "amsgrad=true", **_toggles(1)},
        {"family": "flux", "model_type": "lora", "mixed_precision": "bf16", "optimizer":
         "prodigy", "optimizer_config": "slice_p=11,betas=[0.0,0.99]",
         "text_encoder_2_precision": "int8-quanto", **_toggles(2)},
        {"family": "flux", "model_type": "lora", "mixed_precision": "bf16", "optimizer":
         "adamw_bf16", "optimizer_config": "kahan_sum=false", **_toggles(3)}]


def _full_cases() -> list[dict]:
    cases = [{"family": "flux", "model_type": "full", "optimizer": optimizer,
              "mixed_precision": "bf16" if optimizer == "adamw_bf16" or index % 2 else "no",
              **_toggles(index)} for index, optimizer in enumerate(OPTIMIZERS)]
    return cases + [{"family": "sd1x", "model_type": "full", "optimizer": optimizer,
                     **_toggles(index)}  # the UNet: 4-D convolution weights
                    for index, optimizer in enumerate(("adafactor", "ao-adamw8bit", "prodigy"))]


UNSHARDED = _lora_cases() + _full_cases()
# int4-quanto's forward builds optimum-quanto's C++ extension on first use (minutes on two
# cores): its cases are measured while the caches are built, where its weights are held.
WEIGHTS_ONLY = [{"family": family, "model_type": "lora", "mixed_precision": "bf16",
                 "base_model_precision": "int4-quanto", "text_encoder_1_precision":
                 "int4-quanto", "frozen_components_after_caching": "free"}
                for family in ("flux", "sd1x")]
FULL_SD1X = {"family": "sd1x", "model_type": "full", "optimizer": "adamw", "use_ema": True,
             "frozen_components_after_caching": "free"}
SHARDED = [
    {"family": "flux", "model_type": "lora", "mixed_precision": "bf16", "optimizer": "adamw"},
    {"family": "flux", "model_type": "lora", "optimizer": "lion", "use_ema": True},
    {"family": "sd1x", "model_type": "lora", "mixed_precision": "bf16",
     "optimizer": "adamw_bf16", "frozen_components_after_caching": "keep"},
    {"family": "flux", "model_type": "full", "mixed_precision": "bf16",
     "optimizer": "adamw_bf16", "use_ema": True},
    {"family": "flux", "model_type": "full", "optimizer": "ao-adamw8bit"},
    {"family": "flux", "model_type": "full", "optimizer": "prodigy"},
    FULL_SD1X,
]
SHARDED = [{"frozen_components_after_caching": "free", **case} for case in SHARDED]
REFUSED = [  # the plan says FSDP2 cannot run these; the set-up must still fail
    {"family": "flux", "model_type": "lora", "base_model_precision": "int8-torchao",
     "mixed_precision": "bf16", "frozen_components_after_caching": "free"},
    {"family": "flux", "model_type": "full", "optimizer": "adafactor",
     "frozen_components_after_caching": "free"}]


def planned(case: dict, world: int = 1, rank: int | None = None) -> RankBytes:
    """The plan's DDP rank, or FSDP2's rank ``rank``."""
    training = case_config(case)
    plan = memory_plan(training, resolve_model_path(training.pretrained_model_name_or_path),
                       world)
    return plan.ddp if rank is None else plan.fsdp[rank]


def plan_parts(held: RankBytes) -> dict[str, int]:
    """The plan in memory_fixtures.measure's parts."""
    return {"trainable": sum(held.trainable.values()), "frozen": sum(held.frozen.values()),
            "gradients": held.gradients, "optimizer": held.optimizer, "ema": held.ema,
            "components": sum(held.frozen_components.values()) if held.components_stay else 0,
            "while_caching": held.while_caching, "while_training": held.while_training}


def relative_errors(plan: dict[str, int], measured: dict[str, int]) -> dict[str, float]:
    """|plan - measured| / measured per part measured; a part measured as 0 must be 0."""
    return {part: (abs(plan[part] - bytes_) / bytes_ if bytes_ else float(plan[part] != 0))
            for part, bytes_ in measured.items()}


class AgreementCase(unittest.TestCase):
    def assert_agrees(self, plan: RankBytes, measured: dict[str, int]):
        errors = relative_errors(plan_parts(plan), measured)
        worst = max(errors, key=errors.get)
        self.assertLessEqual(errors[worst], TOLERANCE,
                             f"{worst}: planned {plan_parts(plan)[worst]}, measured "
                             f"{measured[worst]}")


class PlanAgreesWithMeasuredTest(AgreementCase):
    def test_unsharded_grid(self):
        for case in UNSHARDED:
            with self.subTest(**case):
                self.assert_agrees(planned(case), measure(case))

    def test_int4_weights(self):
        for case in WEIGHTS_ONLY:
            with self.subTest(**case):
                self.assert_agrees(planned(case), measure(case, step=False))

    def test_a_lycoris_adapter_on_convolutions(self):
        """LoHa and LoKr on SD 1.x's ResNet convolutions too (LyCORIS reads their kernel sizes
        through a tensor, which the meta device cannot answer)."""
        with tempfile.TemporaryDirectory() as folder:
            for algo in ("loha", "lokr"):
                path = Path(folder) / f"{algo}.json"
                path.write_text(json.dumps({"algo": algo, "linear_dim": 4, "factor": 4}))
                case = {"family": "sd1x", "model_type": "lora", "lora_type": "lycoris",
                        "lycoris_config": str(path), "optimizer": "adamw",
                        "frozen_components_after_caching": "free"}
                with self.subTest(algo=algo):
                    self.assert_agrees(planned(case), measure(case))

    def test_frozen_parts_leave_the_training_total(self):
        kept, freed = ({**UNSHARDED[0], "frozen_components_after_caching": mode}
                       for mode in ("keep", "free"))
        difference = planned(kept).while_training - planned(freed).while_training
        self.assertEqual(difference, measure(kept)["components"])
        self.assertGreater(difference, 0)


class ShardedPlanAgreesWithMeasuredTest(AgreementCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = cls.enterClassContext(tempfile.TemporaryDirectory(prefix="st-memory-"))
        out = Path(cls.tmp) / "measured"
        cls.result = run_bounded(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
             "2", str(RUNNER), str(out), json.dumps(SHARDED + REFUSED)],
            tmpdir=cls.tmp, timeout=500, env=environment(cls.tmp))
        cls.measured = [json.loads((out / f"rank-{r}.json").read_text())
                        if (out / f"rank-{r}.json").exists() else None for r in (0, 1)]

    def test_each_rank(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr[-3000:])
        for rank in (0, 1):
            for case, measured in zip(SHARDED, self.measured[rank]):
                with self.subTest(rank=rank, **case):
                    self.assertNotIn("error", measured)
                    self.assert_agrees(planned(case, 2, rank), measured)

    def test_a_rank_holds_about_half_of_what_trains(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr[-3000:])
        case = SHARDED.index(FULL_SD1X)
        whole, half = measure(FULL_SD1X), self.measured[0][case]
        for part in ("trainable", "gradients", "optimizer", "ema"):
            self.assertAlmostEqual(half[part] / whole[part], 0.5, delta=0.05, msg=part)

    def test_what_the_plan_refuses_fails_to_set_up(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr[-3000:])
        for rank in (0, 1):
            for case, measured in zip(REFUSED, self.measured[rank][len(SHARDED):]):
                with self.subTest(rank=rank, **case):
                    training = case_config(case)
                    plan = memory_plan(training, resolve_model_path(
                        training.pretrained_model_name_or_path), 2)
                    self.assertIsNone(plan.fsdp)
                    self.assertIn("error", measured)


if __name__ == "__main__":
    unittest.main()
