"""The ``device`` setting of HyFEM and FedBCD: ``auto`` (default), ``cpu``, ``cuda``.

On this machine (no GPU) the CUDA run is skipped with a printed reason; ``auto`` must then give
exactly the CPU results, and ``cuda`` must be refused by config validation before anything runs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from hybridfl.algorithms.fedbcd import FedBCDConfig
from hybridfl.algorithms.hyfem import HyFEMConfig, run_hyfem
from hybridfl.data import load_digits
from hybridfl.data.partitioners import ClassBlockPartitioner
from hybridfl.models.hybrid import MaxPool2x2

HAS_CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def tiny_hyfem():
    """HyFEM on the digits as 4x4 image quadrants (CNN extractors), 3 clients."""
    split = load_digits(flatten=False)
    part = ClassBlockPartitioner(num_clients=3, classes_per_client=(6, 8), blocks_per_client=3, seed=0).partition(
        split.train
    )
    return split, part


def _run(split, part, device: str):
    cfg = HyFEMConfig(rounds=2, local_steps=5, eval_every=1, baselines=True, device=device)
    return run_hyfem(split, part, cfg, seed=1)


def _metrics(res) -> list[dict]:
    return [{k: v for k, v in r.items() if "seconds" not in k} for r in res.history]


def test_device_names_are_checked_before_anything_runs():
    with pytest.raises(ValidationError, match="device"):
        HyFEMConfig(device="tpu")
    assert HyFEMConfig().device == "auto" and FedBCDConfig().device == "auto"  # a GPU when there is one
    if HAS_CUDA:
        assert HyFEMConfig(device="cuda").device == "cuda"
    else:
        with pytest.raises(ValidationError, match="no CUDA GPU"):
            HyFEMConfig(device="cuda")


@pytest.mark.skipif(HAS_CUDA, reason="auto resolves to cuda on this machine")
def test_auto_without_a_gpu_is_the_cpu_run(tiny_hyfem):
    split, part = tiny_hyfem
    cpu, auto = _run(split, part, "cpu"), _run(split, part, "auto")
    assert _metrics(cpu) == _metrics(auto)
    for k in ("server_accuracy", "client_accuracy_local_mean", "centralized_accuracy", "standalone_accuracy_mean"):
        assert cpu.summary[k] == auto.summary[k], k
    assert cpu.summary["device"] == auto.summary["device"] == "cpu"  # the results record the device that ran


def test_auto_resolves_to_the_gpu_torch_sees_else_the_cpu():
    from hybridfl.models.device import device_name

    want = "cuda" if HAS_CUDA else "cpu"  # no GPU in CI: cpu
    assert device_name(HyFEMConfig()) == device_name(FedBCDConfig()) == want
    assert device_name(HyFEMConfig(device="cpu")) == "cpu"
    assert device_name(object()) is None  # a config without torch models records no device


def test_hyfem_on_cuda_matches_the_cpu_run(tiny_hyfem, capsys):
    if not HAS_CUDA:
        with capsys.disabled():
            print("\nSKIP test_hyfem_on_cuda_matches_the_cpu_run: torch.cuda.is_available() is False here")
        pytest.skip("no CUDA GPU: torch.cuda.is_available() is False on this machine")
    split, part = tiny_hyfem
    cpu, gpu = _run(split, part, "cpu"), _run(split, part, "cuda")
    # the same initial weights and mini-batches; GPU kernels round differently, so compare loosely
    for a, b in zip(_metrics(cpu), _metrics(gpu)):
        assert abs(a["train_loss"] - b["train_loss"]) < 1e-2
        assert abs(a["server_accuracy"] - b["server_accuracy"]) < 0.05
    assert abs(cpu.summary["centralized_accuracy"] - gpu.summary["centralized_accuracy"]) < 0.05


@pytest.mark.parametrize("shape", [(3, 8, 14, 14), (2, 16, 7, 7), (1, 2, 5, 4)])
def test_fast_pooling_equals_max_pool2d(shape):
    x = torch.randn(*shape)
    pool = MaxPool2x2()
    with torch.no_grad():
        assert torch.equal(pool(x), F.max_pool2d(x, 2))
    # with autograd it is max_pool2d itself (gradient to one input of a tie)
    xr = x.clone().requires_grad_(True)
    pool(xr).sum().backward()
    xs = x.clone().requires_grad_(True)
    F.max_pool2d(xs, 2).sum().backward()
    assert torch.equal(xr.grad, xs.grad)
    assert np.isfinite(xr.grad.numpy()).all()
