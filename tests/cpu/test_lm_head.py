"""Optional NVFP4 lm_head (``load_modelopt_checkpoint(quantize_lm_head=...)``): off by default, ModelOpt's
bytes, and logits / greedy tokens within NVFP4's error model against the checkpoint's bf16 head.

The error model (derived, not tuned). A quantized value ``v`` in a block with scale ``S`` (e4m3 block
scale times the global scale) is ``e2m1_rne(v / S) * S``; its error is at most half the e2m1 grid
spacing there: ``delta(v) = S * (0.25 if |v|/S < 2, 0.5 if < 4, else 1)`` (saturation above 6, possible
by e4m3 rounding of the block scale up to 6 * (1 + 2^-4), errs by <= 0.375 S). Treating the rounding
errors as independent and zero-mean, each logit's error ``sum_k h_k e_w[v,k] (+ W[v,k] e_x[k] + e_x e_w)``
is a sum of independent terms bounded by ``+-|h_k| delta_w`` etc., so Hoeffding's inequality gives
``P(|err_v| > t) <= 2 exp(-2 t^2 / sum_k (2 r_k)^2)`` with ``r_k`` each term's bound. With
``t = z * sqrt(sum_k r_k^2)`` that is ``2 exp(-z^2 / 2)``; z = 7 makes it 4.6e-11 per logit, below 1e-6 over
every logit the test checks (~2e4). Both logits are also rounded to bf16 once (<= 2^-8 relative each).
So each logit satisfies ``|got - want| <= 7 * sqrt(sum_k r_k^2) + 2^-8 (|got| + |want|)``.

Greedy tokens: where the bf16 head's top-1 beats its runner-up by more than the two logits' bounds,
the quantized head must pick the same token; elsewhere a flip is within the model and allowed.
Measured numbers (``python tests/cpu/test_lm_head.py`` prints them) are in docs/checkpoints.md.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("modelopt")
pytest.importorskip("transformers")

from nvgemm import NVFP4Linear  # noqa: E402
from nvgemm.core.formats import from_blocked, quantize_weight  # noqa: E402
from nvgemm.integrations.modelopt import CheckpointError, load_modelopt_checkpoint  # noqa: E402
from nvgemm.testing import make_tiny_checkpoint  # noqa: E402

Z = 7.0  # Hoeffding: P(one logit outside) <= 2 exp(-Z^2 / 2) = 4.6e-11
BF16_U = 2.0**-8  # one rounding of a logit to bf16, relative
STEPS = 16  # greedy decode steps per prompt
PROMPTS = 2
UNIFORM_RMS = 3**-0.5  # rms(err) / sqrt(sum_k r_k^2) when each term is uniform on +-r_k
RMS_SLACK = 1.15  # >= 5 sigma of the sampling spread of an rms over >= 512 independent weight rows (3% each)
DELTA = 1e-4  # the greedy check's false-alarm probability


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("lmhead") / "llama", "llama", "NVFP4")


def _half_gap(q: torch.Tensor) -> torch.Tensor:
    """Half the e2m1 grid spacing at |q| (q in units of the block scale)."""
    a = q.abs()
    return torch.where(a < 2, 0.25, torch.where(a < 4, 0.5, 1.0)).double()


def _block_step(x: torch.Tensor, gs: torch.Tensor) -> torch.Tensor:
    """S per element: e4m3(clamp(block_amax / (6 gs), 2^-9, 448)) * gs, written from the format spec
    (torch's own fp8 cast, not nvgemm's), repeated over the 16 elements of each block."""
    xb = x.float().reshape(*x.shape[:-1], -1, 16)
    sf = (xb.abs().amax(-1) / (6 * gs)).clamp(min=2.0**-9, max=448).to(torch.float8_e4m3fn).float()
    return (sf * gs).repeat_interleave(16, dim=-1).double()


def logit_bound(h: torch.Tensor, w: torch.Tensor, input_scale: torch.Tensor | None) -> torch.Tensor:
    """The per-logit error bound of the module docstring (without the bf16 roundings), [rows, V]."""
    h, w = h.double(), w.double()
    sw = _block_step(w, w.float().abs().max() / 2688)
    dw = _half_gap(w / sw) * sw  # [V, K]
    r2 = (h**2) @ (dw**2).t()  # sum_k r_k^2 over the weight-error terms |h_k| * delta_w
    if input_scale is not None:
        sx = _block_step(h, input_scale.float())
        dx = _half_gap(h / sx) * sx  # [rows, K]
        r2 = r2 + (dx**2) @ ((w.abs() + dw) ** 2).t()  # activation-error terms, |w_hat| <= |w| + delta_w
    return Z * r2.sqrt()


def _decode(model, prompt, steps):
    """Greedy decode (full forward per step, tiny model); returns the sequence and each step's logits."""
    ids, logits = prompt, []
    with torch.no_grad():
        for _ in range(steps):
            lg = model(ids).logits[:, -1].float()
            logits.append(lg)
            ids = torch.cat([ids, lg.argmax(-1, keepdim=True)], dim=1)
    return ids, torch.stack(logits, 1)


MUTANTS = {"global scale x1.25": lambda m: m.weight_scale_2.mul_(1.25),
           "nibbles swapped": lambda m: m.weight.copy_((m.weight >> 4) | (m.weight << 4))}


def agreement(ckpt, mode, input_scale=None, seed=0):
    """Teacher-forced comparison on the bf16 head's greedy sequence: logits, bound, top-1 per step; and the
    same logit checks for each of MUTANTS applied to a copy of the quantized head (same inputs)."""
    import copy

    ref = load_modelopt_checkpoint(ckpt)
    got = load_modelopt_checkpoint(ckpt, quantize_lm_head=mode, lm_head_input_scale=input_scale)
    prompt = torch.randint(0, ref.config.vocab_size, (PROMPTS, 8), generator=torch.Generator().manual_seed(seed))
    seq, _ = _decode(ref, prompt, STEPS)
    seen = {}

    def keep(key):
        def hook(mod, inp, out):
            seen[key] = inp[0].detach()
        return hook

    hooks = [m.lm_head.register_forward_hook(keep(key)) for key, m in (("got", got), ("ref", ref))]
    with torch.no_grad():  # teacher-forced: the logits that picked each greedy token, both heads, one forward
        have = got(seq[:, :-1]).logits[:, -STEPS:].float()
        want = ref(seq[:, :-1]).logits[:, -STEPS:].float()
    for hook in hooks:
        hook.remove()
    assert torch.equal(seen["got"], seen["ref"])  # same body, same input: the difference is the head alone
    h = seen["got"][:, -STEPS:].reshape(-1, seen["got"].shape[-1])
    spread = logit_bound(h, ref.lm_head.weight.detach(), got.lm_head.input_scale).reshape(have.shape) / Z
    out = _logit_checks(have, want, spread)
    out["mutants"] = {}
    for name, mutate in MUTANTS.items():
        head = copy.deepcopy(got.lm_head)
        mutate(head)
        with torch.no_grad():
            bad = head(seen["got"][:, -STEPS:]).float()
        out["mutants"][name] = _logit_checks(bad, want, spread)
    rounding = BF16_U * (have.abs() + want.abs())
    diff = (have - want).abs()
    # greedy: under the uniform model the head's error on logit v is ~ N(0, spread_v^2 / 3); a step flips when
    # some v overtakes the top-1; union bound over v of Phi(-(l_top - l_v) / sigma_(top, v)) per step
    top = want.argmax(-1, keepdim=True)
    gap = want.gather(-1, top) - want
    sigma = ((spread**2 + spread.gather(-1, top) ** 2) / 3).sqrt() + 1e-30
    p_flip = torch.special.ndtr(-(gap - rounding - rounding.gather(-1, top)).clamp_min(0) / sigma)
    p_flip = p_flip.scatter(-1, top, 0.0).sum(-1).clamp(max=1.0)
    flips = int((have.argmax(-1) != want.argmax(-1)).sum())
    expected, var = float(p_flip.sum()), float((p_flip * (1 - p_flip)).sum())
    # Bernstein: P(flips >= expected + t) <= exp(-t^2 / (2 (var + t / 3))) = DELTA
    ln = math.log(1 / DELTA)
    allowed = expected + ln / 3 + math.sqrt((ln / 3) ** 2 + 2 * var * ln)
    out.update(flips=flips, expected_flips=expected, allowed_flips=allowed, n=diff.shape[0] * diff.shape[1],
               model=got)
    with torch.no_grad():  # free-running greedy: tokens identical before the first divergence
        free, _ = _decode(got, prompt, STEPS)
    out["free_run"] = (free[:, 8:] == seq[:, 8:]).long().cumprod(1).sum(1).tolist()
    return out


def _logit_checks(have, want, spread):
    """Per-logit Hoeffding bound (``within``, ``worst`` = max diff / bound) and the rms error over the uniform
    model's sqrt(sum_k r_k^2) (``rms``; the model predicts 1 / sqrt(3))."""
    rounding = BF16_U * (have.abs() + want.abs())
    diff = (have - want).abs()
    return dict(rel=float(diff.max() / want.abs().max()), within=bool((diff <= Z * spread + rounding).all()),
                worst=float((diff / (Z * spread + rounding)).max()),
                rms=float(((diff - rounding).clamp_min(0) ** 2).mean().sqrt() / (spread**2).mean().sqrt()))


def test_off_by_default(ckpt):
    model = load_modelopt_checkpoint(ckpt)
    assert type(model.lm_head) is torch.nn.Linear and model.nvgemm_lm_head is None
    with pytest.raises(CheckpointError, match="quantize_lm_head is off"):
        load_modelopt_checkpoint(ckpt, lm_head_input_scale=0.01)
    with pytest.raises(CheckpointError, match="w4a16"):
        load_modelopt_checkpoint(ckpt, quantize_lm_head="w4a16", lm_head_input_scale=0.01)
    with pytest.raises(CheckpointError, match="expected True, False or one of"):
        load_modelopt_checkpoint(ckpt, quantize_lm_head="fp8")


def test_auto_is_w4a16_off_blackwell_and_bytes_are_modelopt(ckpt):
    nvfp4_tensor = pytest.importorskip("modelopt.torch.quantization.qtensor.nvfp4_tensor")
    ref = load_modelopt_checkpoint(ckpt)
    model = load_modelopt_checkpoint(ckpt, quantize_lm_head=True)
    head = model.lm_head
    assert isinstance(head, NVFP4Linear) and head.weight_only and model.nvgemm_lm_head == "w4a16"
    w = ref.lm_head.weight.detach()
    qt, scale, ws2 = nvfp4_tensor.NVFP4QTensor.quantize(w.float().clone(), 16)
    assert torch.equal(head.weight, qt._quantized_data)
    assert torch.equal(from_blocked(head.weight_scale, w.shape[0], w.shape[1] // 16).view(torch.uint8),
                       scale.view(torch.uint8).reshape(w.shape[0], -1))
    assert float(head.weight_scale_2) == float(ws2)
    assert torch.equal(head.weight, quantize_weight(w).packed)


def test_w4a4_input_scale_bounds_the_final_norm(ckpt):
    model = load_modelopt_checkpoint(ckpt, quantize_lm_head="w4a4")
    g = model.model.norm.weight.detach().float()
    k = g.numel()
    # RMSNorm output sup: sqrt(K) * max|g| (one-hot input); the probe returns it rounded to bf16
    want = torch.tensor(k**0.5 * float(g.abs().max())).to(torch.bfloat16).float() / 2688
    assert float(model.lm_head.input_scale) == pytest.approx(float(want), rel=2**-7)
    given = load_modelopt_checkpoint(ckpt, quantize_lm_head="w4a4", lm_head_input_scale=0.125)
    assert float(given.lm_head.input_scale) == 0.125


@pytest.mark.parametrize("mode", ["w4a16", "w4a4"])
def test_logits_and_greedy_within_nvfp4_error_model(ckpt, mode):
    r = agreement(ckpt, mode)
    assert r["model"].lm_head.last_path == "emulated"
    assert r["within"], r["worst"]  # every logit inside its Hoeffding bound
    assert r["rms"] <= UNIFORM_RMS * RMS_SLACK, r["rms"]  # the aggregate error is the uniform model's
    assert r["flips"] <= r["allowed_flips"], r  # greedy flips: no more than the error model predicts
    # the checks have teeth: a 1.25x global-scale error, or swapped nibbles, fails them
    for name, bad in r["mutants"].items():
        assert not bad["within"] or bad["rms"] > UNIFORM_RMS * RMS_SLACK, (name, bad)


if __name__ == "__main__":  # the numbers quoted in the docs
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        for kind, algo in (("llama", "NVFP4"), ("qwen2", "W4A16_NVFP4")):
            ck = make_tiny_checkpoint(Path(tmp) / kind, kind, algo)
            for mode in ("w4a16", "w4a4"):
                r = agreement(ck, mode)
                print(f"{kind} {algo} head={mode}: max|logit diff|/max|logit| {r['rel']:.3f}; worst diff/bound "
                      f"{r['worst']:.2f}; rms/model {r['rms'] / UNIFORM_RMS:.2f}; teacher-forced top-1 "
                      f"{1 - r['flips'] / r['n']:.3f} of {r['n']} steps ({r['flips']} flips, model expects "
                      f"{r['expected_flips']:.1f}, allows {r['allowed_flips']:.1f}); free-run identical tokens "
                      f"{r['free_run']} of {STEPS}")
                for name, bad in r["mutants"].items():
                    print(f"    mutant {name}: within {bad['within']} (worst {bad['worst']:.2f}), rms/model "
                          f"{bad['rms'] / UNIFORM_RMS:.2f}")
