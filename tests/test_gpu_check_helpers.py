"""The gpulab helpers the GPU check relies on: honest timing options, autotune candidates while grading, and
an environment report that says which distributed backend a launch will really use."""
import pytest
import torch

from gpulab import bench, device


def test_host_clock_times_back_to_back_calls():
    calls = []
    t = bench.host_clock(lambda: calls.append(1), device="cpu", calls=7, warmup=2, rounds=3)
    assert len(calls) == 2 + 7 * 3 and t.n == 3 and t.median_ms >= 0


def test_an_unknown_flush_is_refused():
    with pytest.raises(ValueError, match="flush must be one of"):
        bench.benchmark(lambda: None, device="cpu", flush="dirty")


def test_tuning_configs_keep_the_first_while_grading(monkeypatch):
    configs = ["best guess", "second", "third", "fourth"]
    monkeypatch.delenv("GPULAB_GRADING", raising=False)
    assert device.tuning_configs(configs) == configs
    monkeypatch.setenv("GPULAB_GRADING", "1")
    assert device.tuning_configs(configs) == ["best guess", "second"]
    assert device.tuning_configs(configs, grading_keep=1) == ["best guess"]


def test_tuning_configs_drop_what_this_gpu_cannot_hold(monkeypatch):
    class Props:
        shared_memory_per_block_optin = 99 * 1024  # an RTX 4090

    monkeypatch.delenv("GPULAB_GRADING", raising=False)
    monkeypatch.setattr(device, "current_device", lambda: "cuda")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props())
    sizes = {"h100 tile": 200 * 1024, "small tile": 64 * 1024}
    assert device.tuning_configs(list(sizes), shared_bytes=sizes.get) == ["small tile"]
    assert device.tuning_configs(["h100 tile"], shared_bytes=sizes.get) == ["h100 tile"]  # never none at all


@pytest.mark.parametrize("gpus, backend", [(1, "gloo"), (2, "nccl")])
def test_describe_names_the_backend_a_two_rank_launch_uses(monkeypatch, gpus, backend):
    monkeypatch.setattr(device, "current_device", lambda: "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "a GPU")
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    import gpulab.dist
    monkeypatch.setattr(gpulab.dist, "current_device", lambda: "cuda", raising=False)
    assert device.describe()["distributed_backend"] == backend
