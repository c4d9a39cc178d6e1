"""The GEMM side of PDL in a decode layer: every nvgemm kernel that Inductor's generated code launches right
after a Triton kernel producing its activation (tests/cpu/test_inductor_pdl.py finds those edges in the code
generated for a fake H200, layers held in the sm90 layout) is compiled for sm_90a, and its PTX waits
(``griddepcontrol.wait``) before its first activation read -- the weights, which no kernel of the step writes,
are streamed before the wait (that is what PDL buys) -- and lets its own dependents launch.

Activation reads of the sm90 mma kernels are the zero-filling ``cp.async.ca`` copies with no L2 policy; weights
(``cp.async.cg``) and block-scale words (8-byte ``cp.async.ca``) go under the L2 evict-first policy
(tests/compile/test_sm90_compile.py). A few seconds per kernel.
"""

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # compiles also pass the arch explicitly
import re  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

pytest.importorskip("cutlass")

import nvgemm.integrations.inductor as ni  # noqa: E402
from nvgemm.aot.abi import check_spec, get_template  # noqa: E402
from nvgemm.aot.compile_spec import make_spec  # noqa: E402
from nvgemm.epilogues import EpilogueSpec  # noqa: E402
from nvgemm.integrations.inductor import compat  # noqa: E402
from nvgemm.templates.sm90_w4a16.config import template_id_of  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cpu"))
import test_inductor_pdl as P  # noqa: E402

pytestmark = [pytest.mark.compile_only,
              pytest.mark.skipif(not compat.available("pdl_hook"), reason="selective PDL needs torch >= 2.15")]


def _gemm_consumers_of_triton_producers():
    ni.enable()
    try:
        code, _bench = P._decode_layer_code((9, 0))
    finally:
        ni.disable()
    launches = P._launches(code)
    cfgs = set()
    for a, b in zip(launches, launches[1:]):
        if a["kind"] == "triton" and b["kind"] == "gemm" and a["writes"] & b["reads"]:
            cfgs.add(P._launch_config(b["op"], b["choice"], b["m"]))
    return cfgs


def test_gemm_waits_before_reading_its_triton_producers_output():
    cfgs = _gemm_consumers_of_triton_producers()
    assert len(cfgs) >= 1 and None not in cfgs, cfgs
    for cfg in sorted(cfgs, key=lambda c: c.name()):
        spec = make_spec(template_id_of(cfg), cfg, "sm_90a", epilogue=EpilogueSpec(alpha="scalar"), a_format="bf16")
        st = check_spec(spec)
        assert st, st.reason
        ptx = get_template(template_id_of(cfg)).compile(spec, keep_ptx=True).__ptx__
        assert ".target sm_90a" in ptx
        wait = ptx.index("griddepcontrol.wait")
        # activation copies: zero-filling (a source-size operand), no L2 policy; the 8-byte block-scale words are
        # cp.async.ca too, but under the weights' evict-first policy (cp.async.ca...L2::cache_hint)
        activation_reads = [m.start() for m in re.finditer(r"\bcp\.async\.ca\.shared\.global \[", ptx)]
        assert activation_reads and min(activation_reads) > wait, cfg.name()  # no activation read before the wait
        assert ptx.index("cp.async.cg") < wait, cfg.name()  # the weight stream starts before it
        assert "griddepcontrol.launch_dependents" in ptx[wait:], cfg.name()
