"""Floating-point formats and loss scaling on a toy model (lesson 07 introduces them).

- :data:`FORMATS`: the bit layout of the formats mixed-precision training uses, ``name -> Format``
  (exponent bits, mantissa bits, whether the all-ones exponent still holds numbers, the torch dtype
  if there is one; TF32 is a tensor-core mode with no dtype of its own).
- :func:`toy_scaled_loss` and :func:`replay_scaler`: a one-tensor "model" whose forward and backward
  run in float16 while its parameter (the master copy) stays float32, driven through any loss scaler
  with the ``torch.amp.GradScaler`` interface (``scale``, ``step``, ``update``, ``get_scale``). The
  lesson replays ``GradScaler`` on a stream of gradients; lab 07's check replays the learner's
  scaler and ``GradScaler`` on the same stream and compares them step by step (the toy split over
  several parameters in several param groups too: an overflow anywhere must be found).
- :func:`matmul_tflops`: one large matmul per precision on a GPU (tensor cores), for lesson and lab 07.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Format:
    """A binary floating-point layout: 1 sign bit, ``exp_bits`` exponent bits, ``mantissa_bits``
    stored fraction bits. ``finite_only``: no infinities, the all-ones exponent holds numbers and
    only its all-ones mantissa is NaN (OCP FP8 E4M3, torch's ``float8_e4m3fn``)."""

    exp_bits: int
    mantissa_bits: int
    finite_only: bool = False
    dtype: torch.dtype | None = None

    @property
    def bits(self) -> int:
        return 1 + self.exp_bits + self.mantissa_bits


FORMATS = {
    "fp32": Format(8, 23, dtype=torch.float32),
    "tf32": Format(8, 10),  # tensor-core matmul inputs: fp32 range, fp16 precision, no storage dtype
    "bf16": Format(8, 7, dtype=torch.bfloat16),
    "fp16": Format(5, 10, dtype=torch.float16),
    "fp8 e5m2": Format(5, 2, dtype=torch.float8_e5m2),
    "fp8 e4m3fn": Format(4, 3, finite_only=True, dtype=torch.float8_e4m3fn),
}


def float_bits(x: float, dtype: torch.dtype) -> str:
    """The bits of ``x`` stored as ``dtype`` (float32, float16 or bfloat16), as 'sign exponent mantissa'."""
    fmt = next(f for f in FORMATS.values() if f.dtype == dtype)
    as_int = {4: torch.int32, 2: torch.int16}[fmt.bits // 8]
    raw = int(torch.tensor([x], dtype=dtype).view(as_int)) & ((1 << fmt.bits) - 1)
    s = format(raw, f"0{fmt.bits}b")
    return f"{s[0]} {s[1:1 + fmt.exp_bits]} {s[1 + fmt.exp_bits:]}"


def toy_scaled_loss(param: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """A float32 loss whose gradient with respect to ``param`` (n,) float32 is ``grad`` (n,) / n, computed
    the way autocast computes it: the forward and the backward of the product run in float16, so a
    scaled gradient overflows to inf exactly where fp16 would (``|scale / n x grad| > 65504``)."""
    return (param.half() * grad.half()).float().mean()


def replay_scaler(scaler, grads: list[torch.Tensor], lr: float = 0.1, device: str = "cpu",
                  unscale_first: bool = False, groups: list[list[int]] | None = None,
                  wrap_step: Callable | None = None) -> dict:
    """Train the toy parameter (n,) float32 (all ones) with SGD over ``grads``, one (n,) float32 per step,
    through ``scaler``. Per step: scale the loss, backward, (``scaler.unscale_(opt)`` first if
    ``unscale_first``, as a step that clips does), ``scaler.step(opt)``, ``scaler.update()``.

    ``groups``: the toy split into several parameters in several optimizer param groups, as sizes
    (``[[20, 12], [32]]``: two groups, the first of two parameters; the sizes add up to n); by default
    one parameter in one group. ``wrap_step``: called with the optimizer's ``step``, returns the
    function that replaces it (lab 07's check watches what runs inside ``scaler.step``).

    Returns plain lists: ``scale`` (the scale each step's loss was multiplied by), ``stepped`` (whether
    ``optimizer.step`` ran inside ``scaler.step``), ``after`` (the scale after ``update``) and ``param``
    (the parameters after each step, concatenated, CPU float32)."""
    n = grads[0].numel()
    sizes = groups or [[n]]
    params = [[torch.nn.Parameter(torch.ones(k, device=device)) for k in group] for group in sizes]
    flat = [p for group in params for p in group]
    opt = torch.optim.SGD([{"params": group} for group in params], lr=lr)
    calls = [0]
    real_step = wrap_step(opt.step) if wrap_step else opt.step

    def counted_step(*args, **kwargs):
        calls[0] += 1
        return real_step(*args, **kwargs)

    opt.step = counted_step
    out = {"scale": [], "stepped": [], "after": [], "param": []}
    for g in grads:
        opt.zero_grad(set_to_none=True)
        out["scale"].append(float(scaler.get_scale()))
        pieces = g.to(device).split([p.numel() for p in flat])  # (n,) -> one piece per parameter
        # toy_scaled_loss over the whole toy: each piece's gradient is piece / n, computed in float16
        loss = sum((p.half() * piece.half()).float().sum() for p, piece in zip(flat, pieces)) / n
        scaler.scale(loss).backward()
        if unscale_first:
            scaler.unscale_(opt)
        before = calls[0]
        scaler.step(opt)
        scaler.update()
        out["stepped"].append(calls[0] > before)
        out["after"].append(float(scaler.get_scale()))
        out["param"].append(torch.cat([p.detach().float().cpu() for p in flat]))
    return out


def overflows(grad: torch.Tensor, scale: float) -> bool:
    """Whether the toy's fp16 backward of ``grad`` (n,) at loss scale ``scale`` holds an inf or a NaN."""
    param = torch.ones(grad.numel(), requires_grad=True)
    (toy_scaled_loss(param, grad) * scale).backward()
    return not bool(torch.isfinite(param.grad).all())


MATMUL_MODES = (("fp32", torch.float32, False), ("tf32", torch.float32, True),
                ("bf16", torch.bfloat16, False), ("fp16", torch.float16, False))


def matmul_tflops(n: int = 4096, device: str = "cuda") -> dict:
    """TFLOP/s of one (n, n) @ (n, n) matmul per mode (fp32, tf32, bf16, fp16), median time of
    :func:`gpulab.bench.benchmark`. Meant for a GPU (tensor cores); TF32 is switched back off after."""
    from gpulab.bench import benchmark

    rates = {}
    try:
        for label, dtype, tf32 in MATMUL_MODES:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
            rates[label] = 2 * n ** 3 / (benchmark(torch.matmul, a, b).median_ms * 1e-3) / 1e12
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
    return rates
