"""The check kit's own parts: seeded cases, closeness, variant diagnosis, and the rank policy that
reads gpulab.dist's structured failure kinds (stub, error, hang) instead of its prose."""
import time

import pytest
import torch

from grader.kit import cases, close, variants
from grader.runs import ranks


def test_randint_includes_both_ends_and_follows_the_seed():
    gen = torch.Generator().manual_seed(0)
    seen = {cases.randint(gen, 1, 3) for _ in range(200)}
    assert seen == {1, 2, 3}
    draws = [cases.randint(torch.Generator().manual_seed(5), 0, 10**6) for _ in range(2)]
    assert draws[0] == draws[1]


def test_close_rejects_what_is_not_a_number():
    assert close.close(1.0 + 1e-12, 1.0) and not close.close(1.001, 1.0)
    assert not close.close("1.0x", 1.0) and not close.close(None, 1.0)


def test_matching_variant_names_the_first_match_and_skips_what_cannot_compare():
    same = variants.tensor_match(torch.float32)
    want, wrong = torch.ones(4), torch.full((4,), 2.0)
    label = variants.matching_variant(wrong, [("another shape", torch.ones(3)), ("doubled", lambda: 2 * want)], same)
    assert label == "doubled"
    assert variants.diagnose("mismatch", wrong, [("doubled", 2 * want)], same) == \
        "mismatch\n  Your output matches doubled instead."
    assert variants.diagnose(None, want, [("doubled", 2 * want)], same) is None


def _stub(rank, world_size):
    raise NotImplementedError("write the ring first")


def _raises(rank, world_size):
    import torch.distributed as dist

    dist.barrier()  # both ranks are up: rank 0 ending early must not take the store down under rank 1
    if rank == 1:
        raise ValueError("shapes differ")
    dist.barrier()  # rank 0 waits here until rank 1's error ends the launch
    return rank


def _hangs(rank, world_size):
    import torch.distributed as dist

    if rank == 0:
        dist.recv(torch.zeros(1), src=1)  # rank 1 never sends
    return rank


def test_a_stub_on_the_ranks_is_not_attempted_and_remembered():
    key = ("kit test stub", _stub)
    with pytest.raises(NotImplementedError, match="write the ring first"):
        ranks.launch_ranks(key, _stub, 2, timeout_s=10)
    start = time.monotonic()
    with pytest.raises(NotImplementedError):
        ranks.launch_ranks(key, _stub, 2, timeout_s=10)
    assert time.monotonic() - start < 1.0  # remembered: no second launch


def test_a_probe_finds_a_stub_before_any_rank_starts():
    with pytest.raises(NotImplementedError, match="write the ring first"):
        ranks.launch_ranks(("kit test probe", _stub), _stub, 2, timeout_s=10,
                           probe=lambda: ranks.probe_on_one_rank(_stub))


def test_a_rank_error_carries_its_kind_and_the_ranks_traceback():
    from gpulab.dist import RankFailure, launch

    with pytest.raises(RankFailure) as info:
        launch(_raises, 2, timeout_s=10)
    assert info.value.kind == "error" and info.value.exc_type == "ValueError" and info.value.rank == 1
    with pytest.raises(RuntimeError, match="shapes differ"):
        ranks.launch_ranks(("kit test error", _raises), _raises, 2, timeout_s=10)


def test_a_hang_costs_one_timeout_then_answers_at_once():
    key = ("kit test hang", _hangs)
    with pytest.raises(ranks.RanksHung) as first:
        ranks.launch_ranks(key, _hangs, 2, timeout_s=3)
    assert "a rank hung and was stopped after 3 s" in str(first.value) and ranks.HANG_ADVICE in str(first.value)
    start = time.monotonic()
    with pytest.raises(ranks.RanksHung) as again:
        ranks.launch_ranks(key, _hangs, 2, timeout_s=3)
    assert time.monotonic() - start < 1.0
    assert again.value.summary.startswith(ranks.RanksHung.REPEATED)


def test_the_probes_alarm_waits_until_an_import_is_over(tmp_path, monkeypatch):
    """The probe's alarm stops a learner's endless loop, but never in the middle of an import: a slow first
    import of a torch submodule, interrupted, would leave a half-imported module in the process for good."""
    import sys

    (tmp_path / "slow_module_for_the_probe.py").write_text("import sys\nFRAME = sys._getframe()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import slow_module_for_the_probe

    assert ranks._importing(slow_module_for_the_probe.FRAME)
    assert not ranks._importing(sys._getframe())
