"""Lab 04's checks: the solution passes; a K loop that drops the remainder, missing masks, ignored
strides, fp16 accumulation, an off swizzle, a kernel that ignores grouped_pid, an epilogue run as a
second kernel or in PyTorch, a tile intensity without the re-loads, bad autotune configs and PyTorch
instead of a kernel are all rejected."""
import pytest
import torch
import triton
import triton.language as tl

from grader.checks import exercises
from grader.exercise import evaluate
from tests import graderkit as kit
from tests.conftest import grade, solution_namespace, with_answer

STEM = "04_matmul"


@pytest.fixture(scope="module")
def sol04():
    return solution_namespace(STEM)


def grade_some(eid, ns, picks):
    """Grade exercise ``eid`` on the public cases whose index is in ``picks`` (keeps the file fast)."""
    cases = exercises(STEM)[eid].cases()
    return evaluate(exercises(STEM)[eid], ns, "cpu", [cases[i] for i in picks])


# public cases of matmul_tiled: 0 (64,64,64) fp32, 1 (97,75,130) fp32 odd, 2 (1,1,1), 3 (80,72,100) fp16,
# 4 fp16 cancelling sums, 5 a transposed, 6 both transposed fp16, 7 b sliced, 8 grouped order,
# 9 a row-padded (tall, 32x64 tiles), 10 b row-padded (wide, 64x32 tiles)
ODD, FP16, CANCEL, A_T, BOTH_T, SLICED, ORDER, A_ROWS, B_ROWS = 1, 3, 4, 5, 6, 7, 8, 9, 10


@pytest.mark.parametrize("eid", ["tile_intensity", "grouped_order", "matmul_tiled", "matmul_autotune",
                                 "matmul_epilogue"])
def test_solution_passes_public_and_hidden_cases(sol04, eid):
    result = grade(STEM, eid, sol04)
    assert result.status == "passed", result.message


# --- wrong kernels ---------------------------------------------------------------------------------

@triton.jit
def _mm_variant(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                BUG: tl.constexpr):
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    if BUG == "row_major":
        pid_m = pid // num_n
        pid_n = pid % num_n
    else:
        width = GROUP_M * num_n
        first = pid // width * GROUP_M
        size = min(tl.cdiv(M, BLOCK_M) - first, GROUP_M)
        pid_m = first + (pid % width) % size
        pid_n = (pid % width) // size
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None] * sam + rk[None, :] * sak
    b_ptrs = b_ptr + rk[:, None] * sbk + rn[None, :] * sbn
    if BUG == "acc_fp16":
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float16)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if BUG == "k_floor":  # BUG: K // BLOCK_K full steps, no K mask: the remainder is dropped
        for k in range(0, K // BLOCK_K):
            a = tl.load(a_ptrs, mask=rm[:, None] < M, other=0.0)
            b = tl.load(b_ptrs, mask=rn[None, :] < N, other=0.0)
            acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K * sak
            b_ptrs += BLOCK_K * sbk
    else:
        for k in range(0, K, BLOCK_K):
            a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < K - k), other=0.0)
            b = tl.load(b_ptrs, mask=(rk[:, None] < K - k) & (rn[None, :] < N), other=0.0)
            if BUG == "acc_fp16":  # BUG: the running sum is rounded to fp16
                acc = tl.dot(a, b, acc, out_dtype=tl.float16)
            else:
                acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K * sak
            b_ptrs += BLOCK_K * sbk
    c_ptrs = c_ptr + rm[:, None] * scm + rn[None, :] * scn
    if BUG == "no_store_mask":  # BUG: no mask on the store (the loads stay masked: safe to run)
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty))
    elif BUG == "no_col_mask":  # BUG: rows masked, columns not
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=rm[:, None] < M)
    else:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def _matmul_with(bug, contiguous_strides=False):
    def matmul(a, b, out=None, BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=8):
        (M, K), N = a.shape, b.shape[1]
        out = torch.empty((M, N), dtype=a.dtype) if out is None else out
        # BUG when contiguous_strides: strides computed from the shape, as if both were row-major
        sa = (K, 1) if contiguous_strides else a.stride()
        sb = (N, 1) if contiguous_strides else b.stride()
        grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
        _mm_variant[grid](a, b, out, M, N, K, *sa, *sb, out.stride(0), out.stride(1), BLOCK_M=BLOCK_M,
                          BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M, BUG=bug)
        return out
    return matmul


def test_the_variant_kernel_without_bug_passes(sol04):
    r = grade_some("matmul_tiled", with_answer(sol04, matmul=_matmul_with("none")), [ODD, CANCEL, A_T, ORDER])
    assert r.status == "passed", r.message


def test_k_loop_that_drops_the_remainder_fails(sol04):
    r = grade_some("matmul_tiled", with_answer(sol04, matmul=_matmul_with("k_floor")), [0, ODD])
    assert r.status == "failed" and "drops the last K % BLOCK_K" in r.message
    assert r.score == 2  # the (64, 64, 64) case has no remainder and passes


def test_store_without_masks_is_caught_by_the_guard(sol04):
    r = grade_some("matmul_tiled", with_answer(sol04, matmul=_matmul_with("no_store_mask")), [ODD])
    assert r.status == "failed" and "past the end" in r.message and "(rows < M) & (cols < N)" in r.message


def test_store_without_column_mask_fails(sol04):
    r = grade_some("matmul_tiled", with_answer(sol04, matmul=_matmul_with("no_col_mask")), [0, ODD])
    assert r.status == "failed" and 0 < r.score < r.points


def test_ignoring_strides_fails_on_transposed_inputs_only(sol04):
    r = grade_some("matmul_tiled", with_answer(sol04, matmul=_matmul_with("none", contiguous_strides=True)),
                   [0, FP16, A_T, BOTH_T, SLICED])
    assert r.status == "failed" and "stride" in r.message and "transposed" in r.message
    assert 0 < r.score < r.points


def test_fp16_accumulation_fails_with_an_fp32_hint(sol04):
    r = grade_some("matmul_tiled", with_answer(sol04, matmul=_matmul_with("acc_fp16")), [FP16, CANCEL])
    assert r.status == "failed" and "Accumulate in float32" in r.message


def test_kernel_that_ignores_grouped_pid_fails_the_order_case(sol04):
    r = grade_some("matmul_tiled", with_answer(sol04, matmul=_matmul_with("row_major")), [0, ORDER])
    assert r.status == "failed" and "row-major" in r.message and "grouped_pid_jit" in r.message


def test_pytorch_instead_of_a_kernel_earns_nothing(sol04):
    def matmul(a, b, out=None, **blocks):
        return torch.matmul(a, b, out=out)
    r = grade_some("matmul_tiled", with_answer(sol04, matmul=matmul), [0, ODD])
    assert r.status == "failed" and r.score == 0 and "no Triton kernel" in r.message


def test_a_token_kernel_next_to_torch_matmul_is_caught(sol04):
    real = sol04["matmul"]

    def matmul(a, b, out=None, **blocks):
        real(a[:1, :1], b[:1, :1])  # a Triton launch, for show
        return torch.matmul(a, b, out=out)
    r = grade_some("matmul_tiled", with_answer(sol04, matmul=matmul), [0])
    assert r.status == "failed" and "aten.mm" in r.message


def test_ignoring_out_is_caught(sol04):
    real = sol04["matmul"]
    r = grade_some("matmul_tiled", with_answer(sol04, matmul=lambda a, b, out=None, **kw: real(a, b, **kw)), [0])
    assert r.status == "failed" and "`out`" in r.message


def test_mutating_an_input_is_caught(sol04):
    real = sol04["matmul"]

    def matmul(a, b, out=None, **kw):
        res = real(a, b, out=out, **kw)
        a.zero_()
        return res
    r = grade_some("matmul_tiled", with_answer(sol04, matmul=matmul), [0])
    assert r.status == "failed" and "was modified" in r.message


# --- grouped order ---------------------------------------------------------------------------------

def test_swizzle_without_the_short_last_group_fails(sol04):
    def grouped_pid(pid, num_pid_m, num_pid_n, GROUP_M):
        width = GROUP_M * num_pid_n
        first = pid // width * GROUP_M
        return first + (pid % width) % GROUP_M, (pid % width) // GROUP_M  # BUG: last group assumed full
    r = grade(STEM, "grouped_order", with_answer(sol04, grouped_pid=grouped_pid), hidden=False)
    assert r.status == "failed" and "last group" in r.message


def test_swizzle_with_group_size_in_columns_fails(sol04):
    def grouped_pid(pid, num_pid_m, num_pid_n, GROUP_M):
        width = GROUP_M * num_pid_m  # BUG: a group counted as GROUP_M x num_pid_m programs
        first = pid // width * GROUP_M
        size = min(num_pid_m - first, GROUP_M)
        return first + (pid % width) % size, (pid % width) // size
    r = grade(STEM, "grouped_order", with_answer(sol04, grouped_pid=grouped_pid), hidden=False)
    assert r.status == "failed" and "expected" in r.message


def test_row_major_order_is_not_grouped(sol04):
    r = grade(STEM, "grouped_order", with_answer(
        sol04, grouped_pid=lambda pid, m, n, g: (pid // n, pid % n)), hidden=False)
    assert r.status == "failed" and 0 < r.score < r.points  # GROUP_M=1 and one-column grids still pass


# --- tile intensity ----------------------------------------------------------------------------------

def test_tile_intensity_without_reloads_fails(sol04):
    def tile_intensity(BLOCK_M, BLOCK_N, BLOCK_K, K, dtype_bytes):
        steps = triton.cdiv(K, BLOCK_K)
        flops = 2 * BLOCK_M * BLOCK_N * BLOCK_K * steps
        nbytes = (BLOCK_M * BLOCK_K + BLOCK_K * BLOCK_N) * dtype_bytes  # BUG: loaded once, not per step
        return flops, nbytes, flops / nbytes
    r = grade(STEM, "tile_intensity", with_answer(sol04, tile_intensity=tile_intensity), hidden=False)
    assert r.status == "failed" and "re-loaded" in r.message


def test_tile_intensity_with_floats_fails(sol04):
    real = sol04["tile_intensity"]

    def tile_intensity(*args):
        f, b, i = real(*args)
        return float(f), float(b), i
    r = grade(STEM, "tile_intensity", with_answer(sol04, tile_intensity=tile_intensity), hidden=False)
    assert r.status == "failed" and "exact integer" in r.message


# --- autotune ----------------------------------------------------------------------------------------

def _configs(cuda, cpu):
    def matmul_configs(device):
        return cuda if device == "cuda" else cpu
    return matmul_configs


def _cfg(bm, bn, bk, g=8, w=4, s=3):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": g}, num_warps=w, num_stages=s)


def test_autotune_rejects_bad_config_lists(sol04):
    good_cuda, good_cpu = [_cfg(128, 128, 64), _cfg(64, 64, 32)], [_cfg(32, 32, 32, s=1)]
    bad = {
        "power of two": ([_cfg(128, 96, 64), _cfg(64, 64, 32)], good_cpu),
        "empty list": ([], good_cpu),
        "exactly one": (good_cuda, [_cfg(32, 32, 32), _cfg(16, 16, 16)]),
        "shared memory": ([_cfg(256, 256, 128, s=4), _cfg(64, 64, 32)], good_cpu),
        "lacks GROUP_M": ([triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}), _cfg(64, 64, 32)], good_cpu),
        "triton.Config": ([{"BLOCK_M": 64}], good_cpu),
    }
    ex = exercises(STEM)["matmul_autotune"]
    first = ex.cases()[:1]
    for phrase, (cuda, cpu) in bad.items():
        r = evaluate(ex, with_answer(sol04, matmul_configs=_configs(cuda, cpu)), "cpu", first)
        assert r.status == "failed" and phrase in r.message, (phrase, r.message)
    r = evaluate(ex, with_answer(sol04, matmul_configs=_configs(good_cuda, good_cpu)), "cpu", first)
    assert r.status == "passed", r.message


def test_many_cpu_configs_are_never_benchmarked_in_the_interpreter(sol04):
    many = [_cfg(32, 32, 32), _cfg(16, 32, 32), _cfg(32, 16, 32)]
    r = grade(STEM, "matmul_autotune", with_answer(sol04, matmul_configs=_configs(many, many)), hidden=False)
    assert r.status == "failed" and r.score == 0 and "exactly one" in r.message


def test_autotuned_wrapper_that_launches_a_plain_kernel_fails(sol04):
    real = sol04["matmul"]
    r = grade(STEM, "matmul_autotune", with_answer(
        sol04, matmul_autotuned=lambda a, b, out=None: real(a, b, out=out)), hidden=False)
    assert r.status == "failed" and "plain kernel" in r.message


# --- epilogue -----------------------------------------------------------------------------------------

@triton.jit
def _bias_relu_kernel(c_ptr, bias_ptr, M, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    z = tl.load(c_ptr + offs, mask=mask).to(tl.float32) + tl.load(bias_ptr + offs % N, mask=mask).to(tl.float32)
    tl.store(c_ptr + offs, tl.maximum(z, 0.0).to(c_ptr.dtype.element_ty), mask=mask)


def test_epilogue_as_a_second_kernel_fails(sol04):
    real = sol04["matmul"]

    def matmul_bias_act(a, b, bias, activation="relu", out=None, **kw):
        out = real(a, b, out=out, **kw)
        M, N = out.shape
        _bias_relu_kernel[(triton.cdiv(M * N, 1024),)](out, bias, M, N, BLOCK=1024)
        return out
    ex = exercises(STEM)["matmul_epilogue"]
    r = evaluate(ex, with_answer(sol04, matmul_bias_act=matmul_bias_act), "cpu", ex.cases()[:1])
    assert r.status == "failed" and "2 Triton kernels" in r.message and "exactly 1 launch" in r.message


def test_epilogue_in_pytorch_fails(sol04):
    real = sol04["matmul"]

    def matmul_bias_act(a, b, bias, activation="relu", out=None, **kw):
        out = real(a, b, out=out, **kw)
        out.add_(bias)
        return torch.relu_(out) if activation == "relu" else out.copy_(torch.nn.functional.gelu(out))
    ex = exercises(STEM)["matmul_epilogue"]
    r = evaluate(ex, with_answer(sol04, matmul_bias_act=matmul_bias_act), "cpu", ex.cases()[:1])
    assert r.status == "failed" and "PyTorch arithmetic" in r.message and "aten.add_" in r.message


def test_epilogue_with_the_wrong_activation_says_so(sol04):
    real = sol04["matmul_bias_act"]
    ex = exercises(STEM)["matmul_epilogue"]
    r = evaluate(ex, with_answer(sol04, matmul_bias_act=lambda a, b, bias, activation="relu", out=None, **kw:
                                 real(a, b, bias, "gelu", out=out, **kw)), "cpu", ex.cases()[:1])
    assert r.status == "failed" and "activation='gelu' version" in r.message


# --- row-padded operands and non-square tiles --------------------------------------------------------

def _wrong(sol04, eid, old, new):
    """The solution with one piece of its answer to ``eid`` replaced (a plausible bug)."""
    return kit.mutant(sol04, STEM, eid, old, new)


def _hidden(eid, pick, seeds=(1, 2, 3)):
    """The hidden cases of ``eid``, for a few seeds, for which ``pick(inputs)`` is true."""
    ex = exercises(STEM)[eid]
    return [c for seed in seeds for c in ex.cases(seed=seed, public=False) if pick(c.inputs)]


def test_packed_row_strides_fail_on_row_padded_operands(sol04):
    # BUG: "a row-major operand has rows K apart" (right for contiguous and transposed inputs, wrong for
    # a row-padded view, whose rows are a.stride(0) > K apart)
    wrong = _wrong(sol04, "matmul_tiled", "M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1)",
                   "M, N, K, K if a.stride(1) == 1 else a.stride(0), a.stride(1), "
                   "N if b.stride(1) == 1 else b.stride(0), b.stride(1)")
    ex = exercises(STEM)["matmul_tiled"]
    r = grade_some("matmul_tiled", wrong, [0, A_T, BOTH_T, SLICED, A_ROWS, B_ROWS])
    assert [c.status for c in r.cases] == ["passed"] * 4 + ["failed"] * 2, r.message
    assert "strides (101, 1)" in r.cases[4].message or "strides (77, 1)" in r.cases[4].message
    hidden = evaluate(ex, wrong, "cpu", _hidden("matmul_tiled", lambda x: x["layout"] in ("a_rows", "b_rows")))
    assert len(hidden.cases) == 6 and all(c.status == "failed" for c in hidden.cases), hidden.message


@pytest.mark.parametrize("old, new", [
    ("grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)",
     "grid = (triton.cdiv(M, BLOCK_N) * triton.cdiv(N, BLOCK_M),)"),
    ("offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)", "offs_n = pid_n * BLOCK_M + tl.arange(0, BLOCK_N)"),
    ("grouped_pid_jit(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)",
     "grouped_pid_jit(pid, tl.cdiv(M, BLOCK_N), tl.cdiv(N, BLOCK_M), GROUP_M)"),
], ids=["grid", "tile offsets", "program mapping"])
def test_block_m_and_block_n_swapped_fail(sol04, old, new):
    wrong = _wrong(sol04, "matmul_tiled", old, new)
    assert grade_some("matmul_tiled", wrong, [ODD, A_ROWS, B_ROWS]).status == "failed"
    hidden = evaluate(exercises(STEM)["matmul_tiled"], wrong, "cpu", _hidden("matmul_tiled", lambda x: x.get("shape")))
    by_seed = [hidden.cases[i:i + 2] for i in range(0, 6, 2)]  # (tall, wide) per seed
    assert all(any(c.status == "failed" for c in pair) for pair in by_seed), hidden.message


def test_epilogue_with_block_m_and_block_n_swapped_fails(sol04):
    wrong = _wrong(sol04, "matmul_epilogue", "grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)",
                   "grid = (triton.cdiv(M, BLOCK_N) * triton.cdiv(N, BLOCK_M),)")
    r = grade(STEM, "matmul_epilogue", wrong, hidden=False)
    assert r.status == "failed", r.message
    ex = exercises(STEM)["matmul_epilogue"]
    for seed in (1, 2, 3):
        shaped = [c for c in ex.cases(seed=seed, public=False) if c.inputs.get("shape")]
        assert evaluate(ex, wrong, "cpu", shaped).status == "failed"


# --- hidden cases hold every rule, on every seed ---------------------------------------------------------

def _cdiv(a, b):
    return -(-a // b)


def _rules(eid, case) -> set:
    """The rules a case exercises, read from its inputs (not its name)."""
    x = case.inputs
    if eid == "tile_intensity":
        k = "K < BLOCK_K" if x["K"] < x["BLOCK_K"] else "K % BLOCK_K != 0" if x["K"] % x["BLOCK_K"] else "whole K steps"
        return {k, f"{x['dtype_bytes']} bytes", "BLOCK_M != BLOCK_N" if x["BLOCK_M"] != x["BLOCK_N"] else "square"}
    if eid == "grouped_order":
        m, n, g = x["num_pid_m"], x["num_pid_n"], x["GROUP_M"]
        return {r for r, on in (("short last group", m % g and m > g), ("whole groups", m % g == 0 and g > 1),
                                ("GROUP_M > num_pid_m", g > m), ("one column", n == 1), ("GROUP_M = 1", g == 1)) if on}
    if x.get("kind") == "configs":
        return {"configs"}
    a = x["a"]
    rules = {f"layout {x['layout']}", f"{a.dtype} {x['layout']}".replace("torch.", ""), f"data {x['kind']}"}
    if x.get("epilogue"):
        rules.add(f"{x['epilogue']} in {a.dtype}".replace("torch.", ""))
    if x["blocks"]:
        bm, bn, bk, _ = x["blocks"]
        M, N = case.name.split(")")[0].strip("(").split(", ")[:2]
        M, N = int(M), int(N)
        rules.add("BLOCK_M < BLOCK_N" if bm < bn else "BLOCK_M > BLOCK_N" if bm > bn else "square tiles")
        if x.get("shape") and _cdiv(M, bn) * _cdiv(N, bm) < _cdiv(M, bm) * _cdiv(N, bn):
            rules.add(f"fewer programs if BLOCK_M, BLOCK_N swapped ({x['shape']})")
        if M % bm and N % bn:
            rules.add("partial tiles")
    if x.get("order"):
        rules.add("grouped order observed")
    return rules


@pytest.mark.parametrize("eid", ["tile_intensity", "grouped_order", "matmul_tiled", "matmul_autotune",
                                 "matmul_epilogue"])
def test_every_seed_hides_cases_of_every_rule(eid):
    ex = exercises(STEM)[eid]
    seen = [set().union(*(_rules(eid, c) for c in ex.cases(seed=seed, public=False)))
            for seed in (1, 2, 3, 20261122, 4242)]
    assert all(s == seen[0] for s in seen), [s ^ seen[0] for s in seen]
    must = {"tile_intensity": {"K < BLOCK_K", "K % BLOCK_K != 0", "whole K steps", "BLOCK_M != BLOCK_N"},
            "grouped_order": {"short last group", "whole groups", "GROUP_M > num_pid_m", "one column"},
            "matmul_tiled": {"layout a_rows", "layout b_rows", "layout b_sliced", "data cancel", "partial tiles",
                             "fewer programs if BLOCK_M, BLOCK_N swapped (tall)",
                             "fewer programs if BLOCK_M, BLOCK_N swapped (wide)", "grouped order observed"},
            "matmul_autotune": {"configs", "layout a_t"},
            "matmul_epilogue": {"relu in float32", "relu in float16", "gelu in float32", "gelu in float16",
                                "layout b_rows", "BLOCK_M < BLOCK_N", "BLOCK_M > BLOCK_N",
                                "fewer programs if BLOCK_M, BLOCK_N swapped (tall)",
                                "fewer programs if BLOCK_M, BLOCK_N swapped (wide)"}}[eid]
    assert must <= seen[0], must - seen[0]


# --- the contract: do-nothing answers earn nothing; every hidden set holds the same rules ----------------

EIDS = ["tile_intensity", "grouped_order", "matmul_tiled", "matmul_autotune", "matmul_epilogue"]


def _rule(case) -> str:
    """The rule of a case, read from its inputs (names carry random sizes)."""
    x = case.inputs
    if "dtype_bytes" in x:  # tile_intensity
        k = "K < BLOCK_K" if x["K"] < x["BLOCK_K"] else "K % BLOCK_K != 0" if x["K"] % x["BLOCK_K"] else "whole K steps"
        return f"{k}, {x['dtype_bytes']} bytes"
    if x.get("kind") == "configs":
        return "configs"
    return " ".join(str(x.get(k)) for k in ("layout", "kind", "order", "epilogue", "shape")) + f" {x['a'].dtype}"


@pytest.mark.slow
@pytest.mark.parametrize("eid", EIDS)
def test_answers_that_compute_nothing_score_zero(eid):
    kit.assert_do_nothing_scores_zero(exercises(STEM)[eid], kernels=eid not in ("tile_intensity", "grouped_order"))


@pytest.mark.parametrize("eid", [e for e in EIDS if e != "grouped_order"])  # its random cases: see above
def test_every_hidden_set_covers_the_same_rules(eid):
    kit.assert_same_rules_every_seed(exercises(STEM)[eid], rule=_rule)


# --- more wrong answers, each failing on every seed ------------------------------------------------------

def _layouts(*layouts):
    return lambda c: c.inputs.get("layout") in layouts


@pytest.mark.parametrize("eid, old, new, text, pick", [
    ("grouped_order", "group_size_m = min(num_pid_m - first_pid_m, GROUP_M)",
     "group_size_m = min(num_pid_m - first_pid_m + 1, GROUP_M)", "in the last group", None),
    ("grouped_order", "pid_m = first_pid_m + (pid % width) % group_size_m",
     "pid_m = first_pid_m + pid % group_size_m", "in the last group", None),
    ("grouped_order", "width = GROUP_M * num_pid_n ", "width = GROUP_M * num_pid_m ", "", None),
    ("grouped_order", "group_id = pid // width", "group_id = pid // GROUP_M", "", None),
    ("tile_intensity", "steps = triton.cdiv(K, BLOCK_K)", "steps = K // BLOCK_K", "", None),
    ("tile_intensity", "bytes_loaded = (BLOCK_M * BLOCK_K + BLOCK_K * BLOCK_N) * dtype_bytes * steps",
     "bytes_loaded = (BLOCK_M * BLOCK_K + BLOCK_K * BLOCK_N + BLOCK_M * BLOCK_N) * dtype_bytes * steps",
     "bytes_loaded = ", None),
    ("tile_intensity", "flops = 2 * BLOCK_M * BLOCK_N * BLOCK_K * steps", "flops = 2 * BLOCK_M * BLOCK_N * K",
     "flops = ", None),
    ("matmul_tiled", "a_ptrs += BLOCK_K * stride_ak", "a_ptrs += BLOCK_K * stride_am", "elements differ",
     _layouts("a_t", "contiguous")),
    ("matmul_tiled", "(offs_k[None, :] < K - k)", "(offs_k[None, :] < K)", "elements differ",
     _layouts("contiguous", "b_t")),
    ("matmul_tiled", "GROUP_M=GROUP_M, num_warps", "GROUP_M=1, num_warps", "row-major order",
     lambda c: c.inputs.get("order")),
    ("matmul_epilogue", "bias = tl.load(bias_ptr + offs_n * stride_bias, mask=offs_n < N, other=0.0).to(tl.float32)"
     "  # (BLOCK_N,)\n    z = acc + bias[None, :]", "z = acc", "no bias", _layouts("contiguous")),
], ids=["swizzle group size + 1", "swizzle pid % size", "swizzle width from num_pid_m", "swizzle group of GROUP_M pids",
        "intensity floor steps", "intensity counts the output", "intensity flops over K",
        "A advanced by its row stride",
        "K mask without the step", "wrapper drops GROUP_M", "epilogue drops the bias"])
def test_wrong_answers_fail_on_every_seed(sol04, eid, old, new, text, pick):
    kit.assert_fails_every_seed(exercises(STEM)[eid], kit.mutant(sol04, STEM, eid, old, new), text, pick=pick)
