"""Property test: any valid problem on any named GPU gets 1..cap distinct, implementable,
deterministic candidates (hypothesis; the CI profile in tests/conftest.py is derandomized)."""

from __future__ import annotations

import pytest

from nvgemm.heuristics import GemmProblem, Target, can_implement, candidates, problem_status

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies


@hypothesis.given(
    n=st.integers(1, 8192).map(lambda v: 8 * v),
    k=st.integers(1, 1024).map(lambda v: 32 * v),
    m=st.integers(1, 20000),
    gpu=st.sampled_from(["B200", "GB200", "B300", "H100"]),
    cap=st.integers(1, 10),
)
def test_any_valid_problem_gets_implementable_capped_candidates(n, k, m, gpu, cap):
    target = Target.from_gpu(gpu)
    p = GemmProblem(n=n, k=k, m=m, a_format="bf16" if target.family == "sm90" else "nvfp4", target=target)
    assert problem_status(p)
    cands = candidates(p, max_candidates=cap)
    assert 1 <= len(cands) <= cap
    assert len({c.config for c in cands}) == len(cands)
    for c in cands:
        assert can_implement(p, c.config), (p.describe(), c.name, can_implement(p, c.config).reason)
    assert [c.config for c in candidates(p, max_candidates=cap)] == [c.config for c in cands]
