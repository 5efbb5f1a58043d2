"""transfer.py: no copy for a CPU target, a non-blocking copy from pinned memory for CUDA, and
the seeded draws that go through it unchanged (values recorded before they were routed there)."""

from __future__ import annotations

import unittest

import torch

from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.flow_objective import sample_sigmas
from simpletuner.models.noise_objective import draw_noise, draw_timesteps
from simpletuner.models.transfer import batch_pinned_for, batch_to_device, pinned_for, to_device

CPU = torch.device("cpu")


def seeded() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


def host_batch() -> TrainingBatch:
    return TrainingBatch(latents=torch.randn(2, 4, 8, 8),
                         prompt_embeds={"prompt_embeds": torch.randn(2, 77, 32),
                                        "pooled_prompt_embeds": torch.randn(2, 32)},
                         original_sizes=[(64, 64)] * 2, crop_top_lefts=[(0, 0)] * 2,
                         target_sizes=[(64, 64)] * 2)


class CpuTargetTest(unittest.TestCase):
    def test_a_cpu_tensor_for_a_cpu_target_is_returned_itself(self):
        tensor = torch.arange(6.0)
        for device in (CPU, "cpu"):
            self.assertIs(to_device(tensor, device), tensor)
            self.assertIs(pinned_for(tensor, device), tensor)

    def test_a_cpu_batch_for_a_cpu_target_keeps_its_tensors(self):
        batch = host_batch()
        for moved in (batch_to_device(batch, CPU), batch_pinned_for(batch, CPU)):
            self.assertIs(moved.latents, batch.latents)
            for name, tensor in batch.prompt_embeds.items():
                self.assertIs(moved.prompt_embeds[name], tensor)
            self.assertEqual(moved.original_sizes, batch.original_sizes)


class SeededDrawsTest(unittest.TestCase):
    """Exact values from the code before the draws went through to_device: resume depends on
    them staying bit-identical."""

    def assert_values(self, tensor: torch.Tensor, expected: list) -> None:
        self.assertEqual(tensor.device, CPU)
        self.assertEqual(tensor.flatten().tolist(), expected)

    def test_noise(self):
        self.assert_values(
            draw_noise(torch.Size([1, 2, 2, 2]), device=CPU, generator=seeded()),
            [0.0461304634809494, 0.4024028182029724, -1.0115290880203247, 0.2167382389307022,
             -0.612273097038269, 0.5036107301712036, 0.23096680641174316, 0.6930773258209229])

    def test_noise_with_offset(self):
        self.assert_values(
            draw_noise(torch.Size([2, 2, 1, 2]), device=CPU, generator=seeded(), noise_offset=0.1),
            [0.019444406032562256, 0.3757167458534241, -0.7936825156211853, 0.4345848262310028,
             -0.6020593643188477, 0.513824462890625, 0.20506583154201508, 0.667176365852356])

    def test_timesteps(self):
        self.assert_values(draw_timesteps(5, 1000, device=CPU, generator=seeded()),
                           [775, 171, 806, 365, 316])

    def test_uniform_sigmas(self):
        self.assert_values(
            sample_sigmas(4, sampling="uniform", device=CPU, generator=seeded()),
            [0.028979241847991943, 0.4018985629081726, 0.25984418392181396, 0.3666413426399231])

    def test_shifted_logit_normal_sigmas(self):
        self.assert_values(
            sample_sigmas(4, sampling="logit_normal", logit_mean=0.5, logit_std=1.2, shift=3.0,
                          device=CPU, generator=seeded()),
            [0.8394268155097961, 0.8890916109085083, 0.5950247645378113, 0.8651451468467712])


@unittest.skipUnless(torch.cuda.is_available(), "needs a CUDA device")
class CudaTargetTest(unittest.TestCase):
    def test_a_host_tensor_is_staged_in_pinned_memory_and_arrives_unchanged(self):
        tensor = torch.randn(3, 5)
        self.assertTrue(pinned_for(tensor, "cuda").is_pinned())
        moved = to_device(tensor, "cuda")
        self.assertEqual(moved.device.type, "cuda")
        self.assertTrue(torch.equal(moved.cpu(), tensor))
        self.assertIs(to_device(moved, "cuda"), moved)

    def test_a_prefetched_batch_arrives_unchanged(self):
        batch = host_batch()
        moved = batch_to_device(batch_pinned_for(batch, "cuda"), "cuda")
        self.assertTrue(torch.equal(moved.latents.cpu(), batch.latents))
        for name, tensor in batch.prompt_embeds.items():
            self.assertTrue(torch.equal(moved.prompt_embeds[name].cpu(), tensor))

    def test_seeded_noise_on_cuda_equals_the_cpu_draw(self):
        on_cuda = draw_noise(torch.Size([2, 4, 8, 8]), device=torch.device("cuda"),
                             generator=seeded(), noise_offset=0.1)
        on_cpu = draw_noise(torch.Size([2, 4, 8, 8]), device=CPU, generator=seeded(),
                            noise_offset=0.1)
        self.assertTrue(torch.equal(on_cuda.cpu(), on_cpu))


if __name__ == "__main__":
    unittest.main()
