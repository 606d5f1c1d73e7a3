"""Measured peaks: a busy machine's low figures are called out, and `python -m gpulab.peaks --refresh` replaces them."""
from __future__ import annotations

from gpulab import peaks as peaks_module
from gpulab.peaks import Peaks, implausibly_low


def _peaks(copy_gbps, tflops, device="cpu"):
    return Peaks(device=device, name="test cpu", copy_gbps=copy_gbps, matmul_tflops=tflops,
                 matmul_dtype="float32", copy_bytes=1, matmul_size=1)


def test_peaks_measured_under_load_are_called_implausibly_low():
    low = implausibly_low(_peaks(1.6, 0.005))  # measured on a 2-core machine under heavy load
    assert low == ["copy bandwidth 1.6 GB/s (expected at least 2)",
                   "matmul rate 0.005 TFLOP/s (expected at least 0.006)"]
    assert implausibly_low(_peaks(19.6, 0.059)) == []  # the same machine, loaded as usual
    assert implausibly_low(_peaks(20.0, 0.06, device="cuda"))  # a CPU's figures for a GPU


def test_refresh_measures_again_and_the_warning_says_how(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPULAB_CACHE", str(tmp_path))
    measured = iter([_peaks(1.6, 0.005), _peaks(19.6, 0.059)])
    monkeypatch.setattr(peaks_module, "measure_peaks", lambda device=None: next(measured))
    assert peaks_module.main(["--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "look too low" in err and "python -m gpulab.peaks --refresh" in err
    assert peaks_module.measured_peaks("cpu").copy_gbps == 1.6  # cached, and still called out
    assert "look too low" in capsys.readouterr().err
    peaks_module.main(["--device", "cpu", "--refresh"])
    captured = capsys.readouterr()
    assert "19.6 GB/s" in captured.out and captured.err == ""
    assert peaks_module.measured_peaks("cpu").copy_gbps == 19.6
