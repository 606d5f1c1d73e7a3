"""Unit tests of the gpulab helpers, including the messages that wrong inputs get."""
import json
import time

import pytest
import torch

import gpulab
from gpulab import bench, device, peaks, seed
from gpulab import compare as chk
from gpulab.simulated import SimulatedDevice, SimulatedKernel


def test_cpu_device_turns_on_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert device.set_device("cpu") == "cpu"
    assert device.interpreted()


def test_unknown_device_says_what_to_write():
    with pytest.raises(ValueError, match="DEVICE must be one of"):
        device.pick_device("gpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_is_an_error_not_a_fallback():
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        device.pick_device("cuda")


def test_env_variable_overrides_auto(monkeypatch):
    monkeypatch.setenv("GPULAB_DEVICE", "cpu")
    assert device.pick_device("auto") == "cpu"
    monkeypatch.setenv("GPULAB_DEVICE", "tpu")
    with pytest.raises(ValueError, match="GPULAB_DEVICE"):
        device.pick_device("auto")


def test_setup_seeds_everything():
    gpulab.setup("cpu", 3, quiet=True)
    a = torch.rand(4)
    gpulab.setup("cpu", 3, quiet=True)
    assert torch.equal(a, torch.rand(4))
    with pytest.raises(TypeError, match="SEED must be an int"):
        seed.seed_everything("3")


def test_describe_reports_the_environment():
    info = gpulab.describe()
    assert info["device"] == "cpu" and info["distributed_backend"] == "gloo"
    assert info["triton_mode"].startswith("interpreter")


def test_percentiles_match_numpy():
    import numpy as np
    samples = [float(x) for x in torch.rand(37, generator=torch.Generator().manual_seed(1))]
    for q in (50, 95, 99):
        assert bench.percentile(samples, q) == pytest.approx(float(np.percentile(samples, q)))


def test_benchmark_synchronises_and_warms_up_on_a_simulated_gpu():
    sim = SimulatedDevice()
    kernel = SimulatedKernel(sim, steady_ms=3.0, cold_ms=300.0, cold_calls=2)
    t = bench.benchmark(kernel, device=sim, warmup=3, repeats=10)
    assert kernel.calls == 13 and t.n == 10
    assert 2.5 < t.median_ms < 3.0 * 5  # real sleeps on a possibly busy machine: loose bounds
    assert t.p99_ms < 150.0             # the 300 ms cold calls were not timed


def test_benchmark_rejects_bad_arguments():
    with pytest.raises(TypeError, match="callable"):
        bench.benchmark(42)
    with pytest.raises(ValueError, match="repeats >= 1"):
        bench.benchmark(lambda: None, repeats=0)


def test_rates():
    assert bench.gbps(2e9, 1000.0) == pytest.approx(2.0)
    assert bench.tflops(3e12, 1000.0) == pytest.approx(3.0)
    assert bench.pct_of_peak(45, 90) == pytest.approx(50)
    with pytest.raises(ValueError):
        bench.pct_of_peak(1, 0)


def test_peaks_are_measured_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_CACHE", str(tmp_path))
    calls = []
    fake = peaks.Peaks("cpu", "x", 10.0, 0.5, "float32", 1, 1)
    monkeypatch.setattr(peaks, "measure_peaks", lambda d=None: calls.append(d) or fake)
    assert peaks.measured_peaks("cpu") == fake
    assert peaks.measured_peaks("cpu") == fake
    assert len(calls) == 1
    assert fake.ridge_point == pytest.approx(0.5e12 / 10e9)
    (tmp_path / "peaks.json").write_text("{not json")  # a damaged cache is re-measured
    assert peaks.measured_peaks("cpu") == fake and len(calls) == 2
    assert json.loads((tmp_path / "peaks.json").read_text())


def test_measure_peaks_on_cpu_gives_positive_rates():
    p = peaks.measure_peaks("cpu")
    assert p.copy_gbps > 0 and p.matmul_tflops > 0


def test_compare_reports_shape_dtype_and_first_mismatches():
    e = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert chk.compare(e.clone(), e) is None
    assert "shape (4, 3)" in chk.compare(e.t().contiguous(), e)
    assert "dtype torch.float16" in chk.compare(e.half(), e)
    bad = e.clone()
    bad[2, 1] = 99
    report = chk.compare(bad, e)
    assert "1 of 12 elements differ" in report and "at [2, 1]: got 99" in report
    assert "not a" not in report


def test_compare_fails_nan_and_uses_dtype_tolerances():
    e = torch.ones(5, dtype=torch.float64)
    assert "NaN" in chk.compare(torch.tensor([1, 1, float("nan"), 1, 1.0], dtype=torch.float32), e,
                                dtype=torch.float32)
    assert chk.compare(torch.full((5,), 1.001, dtype=torch.float16), e, dtype=torch.float16) is None
    assert chk.compare(torch.full((5,), 1.001, dtype=torch.float32), e, dtype=torch.float32) is not None
    with pytest.raises(chk.MismatchError, match="differ"):
        chk.assert_close(torch.zeros(2), torch.ones(2))


def test_poisoned_buffer_and_guard():
    out, storage = chk.poisoned((3, 5), torch.float32)
    assert out.shape == (3, 5) and torch.isnan(out).all()
    out.fill_(1.0)
    assert chk.guard_report(storage, 15) is None
    storage[15 + 2] = 0.0
    assert "past the end" in chk.guard_report(storage, 15)
    iout, istorage = chk.poisoned((4,), torch.int8)
    assert (iout == -128).all() and chk.guard_report(istorage, 4) is None


def test_validate_messages_say_what_to_change():
    x = torch.zeros(4, 6)
    with pytest.raises(TypeError, match=r"expected torch.float16.*x.to\(torch.float16\)"):
        chk.validate(x, "x", dtype=torch.float16)
    with pytest.raises(ValueError, match=r"must have shape \(4, 5\)"):
        chk.validate(x, "x", shape=(4, 5))
    with pytest.raises(ValueError, match=r"x.contiguous\(\)"):
        chk.validate(x.t(), "x", contiguous=True)
    with pytest.raises(ValueError, match="1 dimension"):
        chk.validate(x, "x", ndim=1)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        chk.validate([1, 2], "x")
    with pytest.raises(ValueError, match=r"is on cpu.*x.to\('cuda'\)"):
        chk.validate(x, "x", device="cuda")
    assert chk.validate(x, "x", shape=(4, None)) is x


def test_launch_recording_counts_triton_kernels_only():
    import triton
    import triton.language as tl

    from gpulab.launches import record_launches

    @triton.jit
    def fill(out_ptr, BLOCK: tl.constexpr):
        tl.store(out_ptr + tl.arange(0, BLOCK), tl.zeros((BLOCK,), tl.float32))

    out = torch.ones(16)
    with record_launches() as launched:
        torch.add(out, out)
        fill[(1,)](out, BLOCK=16)
    assert launched == ["fill"] and out.sum() == 0


def test_simulated_device_is_asynchronous():
    sim = SimulatedDevice()
    start = time.perf_counter()
    sim.launch(0.05)
    assert time.perf_counter() - start < 0.02  # the launch returns at once
    sim.synchronize()
    assert time.perf_counter() - start >= 0.05
    assert "launches=1" in repr(sim)
