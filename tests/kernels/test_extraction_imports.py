"""What a candidate module may import in the extraction's sandbox: torch's own modules import
there as they do anywhere. torch.distributed.checkpoint (which Liger-Kernel reaches through
transformers and torchao) loads libc with ctypes at import, which the audit hook refuses: the
extraction imports that module before it installs the hook."""

from __future__ import annotations

from stillroom.kernels import evaluate

from .test_validator import HONEST, RELU


def test_a_candidate_that_imports_torch_distributed_checkpoint_earns_1():
    source = "import torch.distributed.checkpoint  # noqa: F401\n" + HONEST
    r = evaluate(RELU, source, trials=1, cases=["zero"])
    assert r.reward == 1, r.reasons
