"""Lab 02's checks: the solution passes; missing masks, bad grids, PyTorch shortcuts, ignored strides,
the wrong GELU form and a miscounted byte total are all rejected."""
import pytest
import torch
import triton
import triton.language as tl

from grader.checks import exercises, load_lab
from grader.exercise import evaluate
from grader.notebooks import exec_source
from tests import graderkit as kit
from tests.conftest import grade, with_answer

STEM = "02_triton_basics"


@pytest.mark.parametrize("eid", ["vector_add", "bias_gelu", "copy_2d", "fusion_bytes"])
def test_solution_passes_public_and_hidden_cases(sol02, eid):
    result = grade(STEM, eid, sol02)
    assert result.status == "passed", result.message


@triton.jit
def _add_store_unmasked(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, x + y)  # BUG: no mask, the last block writes past the end


@triton.jit
def _add_flat(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def _launcher(kernel, grid_fn, check_contiguous=False):
    def vector_add(x, y, out=None, BLOCK=256):
        out = torch.empty_like(x) if out is None else out
        kernel[(grid_fn(x.numel(), BLOCK),)](x, y, out, x.numel(), BLOCK=BLOCK)
        return out
    return vector_add


def test_store_without_mask_writes_the_guard_region(sol02):
    r = grade(STEM, "vector_add", with_answer(sol02, vector_add=_launcher(_add_store_unmasked, triton.cdiv)),
              hidden=False)
    assert r.status == "failed" and "past the end" in r.message


def test_grid_rounded_down_leaves_the_tail_unwritten(sol02):
    r = grade(STEM, "vector_add", with_answer(sol02, vector_add=_launcher(_add_flat, lambda n, b: max(n // b, 1))),
              hidden=False)
    assert r.status == "failed" and "NaN" in r.message


def test_strided_input_indexed_as_flat_is_wrong(sol02):
    r = grade(STEM, "vector_add", with_answer(sol02, vector_add=_launcher(_add_flat, triton.cdiv)), hidden=False)
    assert r.status == "failed" and "non-contiguous" in r.message


def test_pytorch_instead_of_a_kernel_earns_nothing(sol02):
    def vector_add(x, y, out=None):
        out = torch.empty_like(x) if out is None else out
        return torch.add(x, y, out=out)
    r = grade(STEM, "vector_add", with_answer(sol02, vector_add=vector_add), hidden=False)
    assert r.status == "failed" and r.score == 0 and "no Triton kernel" in r.message


def test_ignoring_out_is_caught(sol02):
    real = sol02["vector_add"]
    r = grade(STEM, "vector_add", with_answer(sol02, vector_add=lambda x, y, out=None: real(x, y)), hidden=False)
    assert r.status == "failed" and "`out`" in r.message


def test_mutating_an_input_is_caught(sol02):
    real = sol02["vector_add"]

    def vector_add(x, y, out=None):
        res = real(x, y, out=out)
        if x.is_contiguous():
            real(x, y, out=x)  # overwrites x
        return res
    r = grade(STEM, "vector_add", with_answer(sol02, vector_add=vector_add), hidden=False)
    assert r.status == "failed" and "was modified" in r.message


def test_tanh_gelu_where_erf_is_asked_fails_and_says_so(sol02):
    real = sol02["bias_gelu"]
    r = grade(STEM, "bias_gelu", with_answer(
        sol02, bias_gelu=lambda x, bias, approximate="none", out=None: real(x, bias, "tanh", out=out)), hidden=False)
    assert r.status == "failed" and "approximate='tanh' instead" in r.message


@triton.jit
def _gelu_store_unmasked(x_ptr, b_ptr, out_ptr, N, stride_xm, stride_om, APPROX_TANH: tl.constexpr,
                         BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    z = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0).to(tl.float32) + \
        tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = 0.5 * z * (1.0 + tl.math.erf(z * 0.7071067811865476))
    tl.store(out_ptr + row * stride_om + cols, y.to(out_ptr.dtype.element_ty))  # BUG: no mask


def test_bias_gelu_without_column_mask_fails(sol02):
    def bias_gelu(x, bias, approximate="none", out=None):
        out = torch.empty_like(x) if out is None else out
        _gelu_store_unmasked[(x.shape[0], triton.cdiv(x.shape[1], 128))](
            x, bias, out, x.shape[1], x.stride(0), out.stride(0), APPROX_TANH=False, BLOCK_N=128)
        return out
    r = grade(STEM, "bias_gelu", with_answer(sol02, bias_gelu=bias_gelu), hidden=False)
    assert r.status == "failed"


@triton.jit
def _copy_assuming_contiguous(src_ptr, out_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offs = rows[:, None] * N + cols[None, :]  # BUG: ignores the source's strides
    tl.store(out_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def test_copy_ignoring_strides_fails_with_a_stride_hint(sol02):
    def copy_2d(src, out=None):
        M, N = src.shape
        out = torch.empty((M, N), dtype=src.dtype, device=src.device) if out is None else out
        _copy_assuming_contiguous[(triton.cdiv(M, 32), triton.cdiv(N, 32))](src, out, M, N, BLOCK_M=32, BLOCK_N=32)
        return out
    r = grade(STEM, "copy_2d", with_answer(sol02, copy_2d=copy_2d), hidden=False)
    assert r.status == "failed" and "strides" in r.message
    assert 0 < r.score < r.points  # the contiguous cases still earn their share


def test_unfused_bytes_without_the_intermediate_fails(sol02):
    r = grade(STEM, "fusion_bytes", with_answer(
        sol02, bias_gelu_bytes=lambda M, N, b, fused: (2 * M * N + N) * b))
    assert r.status == "failed"


def test_rejecting_every_input_earns_nothing(sol02):
    def vector_add(x, y, out=None):
        raise ValueError("not supported")
    r = grade(STEM, "vector_add", with_answer(sol02, vector_add=vector_add), hidden=False)
    assert r.status == "error" and r.score == 0 and "not supported" in r.message


# --- missing masks at any block size, and answers that let PyTorch do the work --------------------

@triton.jit
def _add_unmasked(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs) + tl.load(y_ptr + offs))  # BUG: no mask anywhere


@triton.jit
def _does_nothing(out_ptr):
    pass


def _unmasked_add(block):
    def vector_add(x, y, out=None, BLOCK=block):
        out = torch.empty_like(x) if out is None else out
        _add_unmasked[(triton.cdiv(x.numel(), BLOCK),)](x, y, out, x.numel(), BLOCK=BLOCK)
        return out
    return vector_add


@pytest.mark.parametrize("block", [1024, 4096, 1 << 20], ids=["1024", "4096", "max"])
def test_no_mask_at_any_block_size_is_an_out_of_bounds_verdict(sol02, block):
    # The public cases are what the inline `check` runs, in the learner's own process.
    r = grade(STEM, "vector_add", with_answer(sol02, vector_add=_unmasked_add(block)), hidden=False)
    assert r.status == "failed" and "past the end of `out_ptr`" in r.message and "missing its mask" in r.message
    assert torch.equal(torch.arange(4.0) + 1, torch.ones(4) + torch.arange(4.0))  # this process lives on


def test_no_mask_through_the_inline_check_shows_a_verdict(sol02):
    from gpulab.feedback import check_result

    ns = with_answer(sol02, vector_add=_unmasked_add(1024))
    r = check_result("vector_add", ns, device="cpu", quiet=True, record=False)
    assert r.status == "failed" and "A store is missing its mask" in r.message


def test_no_mask_leaves_a_fresh_process_alive_at_every_block_size(tmp_path):
    # Heap corruption shows at exit, if not before: run the inline check where a crash would show.
    import subprocess
    import sys

    from tests.conftest import ROOT

    script = tmp_path / "nomask.py"
    script.write_text(
        "import gpulab, torch, triton, triton.language as tl\n"
        "gpulab.setup('cpu', 0)\n"
        "@triton.jit\n"
        "def vector_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):\n"
        "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
        "    tl.store(out_ptr + offs, tl.load(x_ptr + offs) + tl.load(y_ptr + offs))\n"
        "for BLOCK in (1024, 4096, 1 << 20):\n"
        "    def vector_add(x, y, out=None):\n"
        "        out = torch.empty_like(x) if out is None else out\n"
        "        vector_add_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, y, out, x.numel(), BLOCK=BLOCK)\n"
        "        return out\n"
        "    r = gpulab.feedback.check_result('vector_add', globals(), 'cpu', quiet=True, record=False)\n"
        "    print(BLOCK, r.status, 'missing its mask' in r.message)\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-3:] == ["1024 failed True", "4096 failed True", "1048576 failed True"]


def test_loads_without_masks_fail_even_when_the_output_is_right(sol02):
    @triton.jit
    def add_loads_unmasked(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs) + tl.load(y_ptr + offs), mask=offs < n)  # BUG: loads

    r = grade(STEM, "vector_add", with_answer(sol02, vector_add=_launcher(add_loads_unmasked, triton.cdiv)),
              hidden=False)
    assert r.status == "failed" and "read" in r.message and "past the end of `x_ptr`" in r.message


def test_no_op_kernel_next_to_pytorch_earns_nothing(sol02):
    def vector_add(x, y, out=None):  # attack (a): a launch for show, the sum by PyTorch
        out = torch.empty_like(x) if out is None else out
        _does_nothing[(1,)](out)
        out.copy_(x + y)
        return out
    r = grade(STEM, "vector_add", with_answer(sol02, vector_add=vector_add))
    assert r.status == "failed" and r.score == 0 and "even when your kernels do not run" in r.message
    assert "PyTorch wrote into the output in place" in r.message


def test_pytorch_writing_through_numpy_next_to_a_kernel_earns_nothing(sol02):
    def vector_add(x, y, out=None):  # no version-counter trace: only the ablated run can tell
        out = torch.empty_like(x) if out is None else out
        _does_nothing[(1,)](out)
        out.numpy()[:] = (x + y).numpy()
        return out
    r = grade(STEM, "vector_add", with_answer(sol02, vector_add=vector_add))
    assert r.status == "failed" and r.score == 0 and "even when your kernels do not run" in r.message


def test_feeding_the_no_op_kernel_a_copy_of_the_input_earns_nothing(sol02):
    def vector_add(x, y, out=None):  # the only tensor the kernel sees is one PyTorch then uses
        out = torch.empty_like(x) if out is None else out
        xs = x.clone()
        _does_nothing[(1,)](xs)
        return out.copy_(xs + y)
    r = grade(STEM, "vector_add", with_answer(sol02, vector_add=vector_add))
    assert r.status == "failed" and r.score == 0 and "even when your kernels do not run" in r.message


def test_a_launch_forged_through_the_call_stack_earns_nothing(sol02):
    import inspect

    from gpulab.launches import Launch, LaunchWatch

    def vector_add(x, y, out=None):  # attack (b): append to the recorder, launch nothing
        out = torch.empty_like(x) if out is None else out
        for frame in inspect.stack():
            for value in list(frame.frame.f_locals.values()):
                if isinstance(value, LaunchWatch):
                    value.names.append("vector_add_kernel")
                    value.launches.append(Launch("vector_add_kernel", True))
        out.data.copy_(x + y)
        return out
    r = grade(STEM, "vector_add", with_answer(sol02, vector_add=vector_add))
    # Refused twice over: it reaches gpulab.launches.Launch, a helper lab 02 does not offer, and ablation
    # sees the right output with no kernel of the learner's running.
    assert r.status == "failed" and r.score == 0 and "gpulab.launches.Launch" in r.message
    plain = load_lab(STEM).VECTOR_ADD  # the exercise without the helper rule
    r = evaluate(plain, with_answer(sol02, vector_add=vector_add), "cpu", plain.cases()[:2])
    assert r.score == 0 and "even when your kernels do not run" in r.message


def test_out_copy_of_a_pytorch_sum_earns_nothing(sol02):
    def vector_add(x, y, out=None):  # attack (c)
        out = torch.empty_like(x) if out is None else out
        return out.copy_(x + y)
    r = grade(STEM, "vector_add", with_answer(sol02, vector_add=vector_add))
    assert r.status == "failed" and r.score == 0 and "no Triton kernel" in r.message


def test_a_kernel_that_is_not_yours_earns_nothing(sol02):
    import os

    @triton.jit
    def borrowed(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)

    # As if it shipped with Triton (or gpulab, or the grader): right results, but not the learner's work.
    borrowed.fn.__code__ = borrowed.fn.__code__.replace(
        co_filename=os.path.join(os.path.dirname(triton.__file__), "ops", "add.py"))
    r = grade(STEM, "vector_add", with_answer(sol02, vector_add=_launcher(borrowed, triton.cdiv)), hidden=False)
    assert r.status == "failed" and r.score == 0 and "are not yours" in r.message


# --- the contract: do-nothing answers earn nothing; every hidden set holds the same rules ----------------

def _rule(case) -> str:
    """The rule of a case, read from its inputs (names carry random sizes)."""
    x = case.inputs
    if "fused" in x:
        return f"{x['dtype_bytes']} bytes, fused={x['fused']}"
    t = x.get("x", x.get("src"))
    return " ".join(str(v) for v in (x.get("approximate", ""), t.dtype, x["layout"]))


@pytest.mark.slow
@pytest.mark.parametrize("eid", ["vector_add", "bias_gelu", "copy_2d", "fusion_bytes"])
def test_answers_that_compute_nothing_score_zero(eid):
    kit.assert_do_nothing_scores_zero(exercises(STEM)[eid], kernels=eid != "fusion_bytes")


@pytest.mark.parametrize("eid", ["vector_add", "bias_gelu", "copy_2d", "fusion_bytes"])
def test_every_hidden_set_covers_the_same_rules(eid):
    kit.assert_same_rules_every_seed(exercises(STEM)[eid], rule=_rule)


# --- more wrong answers, each failing on every seed ------------------------------------------------------

@pytest.mark.parametrize("eid, old, new, text", [
    ("vector_add", "mask = offs < n", "mask = offs <= n", "past the end of `out_ptr`"),
    ("vector_add", "offs = pid * BLOCK + tl.arange(0, BLOCK)", "offs = pid + tl.arange(0, BLOCK)", "never written"),
    ("bias_gelu", "(z + 0.044715 * z * z * z)", "(z + 0.044715 * z * z)", "elements differ"),
    ("bias_gelu", "tl.math.erf(z * 0.7071067811865476)", "tl.math.erf(z * 0.5)", "elements differ"),
    ("bias_gelu", "y = 0.5 * z * (1.0 + tanh_u)", "y = 0.5 * x * (1.0 + tanh_u)", "elements differ"),
    ("copy_2d", "mask = (rows[:, None] < M) & (cols[None, :] < N)", "mask = rows[:, None] < M", "past the end"),
    ("copy_2d", "grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))",
     "grid = (triton.cdiv(N, BLOCK_N), triton.cdiv(M, BLOCK_M))", "elements differ"),
    ("copy_2d", "src.stride(0), src.stride(1)", "src.stride(1), src.stride(0)", "elements differ"),
    ("fusion_bytes", "return (2 * M * N + N) * dtype_bytes", "return 2 * M * N * dtype_bytes", "fused': True"),
    ("fusion_bytes", "return (4 * M * N + N) * dtype_bytes", "return (4 * M * N + 2 * N) * dtype_bytes",
     "fused': False"),
], ids=["mask <=", "offsets without BLOCK", "tanh with z^2", "erf of z/2", "gelu of x not x+b", "copy row mask only",
        "copy grid axes swapped", "copy strides swapped", "fused without bias", "unfused bias read twice"])
def test_wrong_answers_fail_on_every_seed(sol02, eid, old, new, text):
    kit.assert_fails_every_seed(exercises(STEM)[eid], kit.mutant(sol02, STEM, eid, old, new), text)


def test_bias_gelu_in_float16_arithmetic_fails_on_every_seed(sol02):
    src = kit.solution_with(STEM, "bias_gelu", "mask=mask).to(tl.float32)\n    b = tl.load(b_ptr + cols, mask=mask)"
                            ".to(tl.float32)", "mask=mask)\n    b = tl.load(b_ptr + cols, mask=mask)")
    ns = exec_source(src, "<bias_gelu in the input's dtype>", dict(sol02))  # BUG: no float32 upcast
    kit.assert_fails_every_seed(exercises(STEM)["bias_gelu"], ns, "float16",
                                pick=lambda c: c.inputs["x"].dtype == torch.float16)
