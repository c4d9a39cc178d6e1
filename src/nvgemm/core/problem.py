"""GEMM problem descriptor and target description used by the candidate policy.

A :class:`GemmProblem` is ``out[M, N] = epilogue(A[M, K] @ B[N, K]^T)`` where

* ``M`` is the token count: exact (``m=8``) or a range for dynamic batch (``m_range=(9, 16)``,
  inclusive). A kernel chosen for a range must be correct for every M in it.
* ``N`` is the weight's output features and ``K`` the **logical** reduction length (FP4 elements,
  not the packed byte count K/2 of the ``uint8``/``float4_e2m1fn_x2`` storage).
* ``a_format``/``b_format`` are the operand formats: ``"nvfp4"`` x ``"nvfp4"`` is W4A4,
  ``"bf16"|"fp16"`` x ``"nvfp4"`` is weight-only W4A16.
* ``out_dtype`` is ``"bf16" | "fp16" | "fp32"`` (a ``torch.dtype`` is accepted and normalised).
* ``epilogue`` is the activation of the layer's ``EpilogueSpec`` (``none|silu|gelu_tanh|silu_mul``),
  the only epilogue part that constrains tiling (``silu_mul`` pairs column halves).
* ``target`` names the arch and SM count. It comes from a GPU name table (:data:`GPUS`); a live
  device is read only when asked (:meth:`Target.from_device`), never at import.

Pure Python: importing this module touches no GPU and imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

from nvgemm.core.status import Status

OUT_DTYPES = ("bf16", "fp16", "fp32")
OPERAND_FORMATS = ("nvfp4", "bf16", "fp16")
EPILOGUES = ("none", "silu", "gelu_tanh", "silu_mul")

# Output element sizes in bytes.
OUT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class GpuSpec:
    name: str
    arch: str  # the CuTeDSL target arch string
    sm_count: int
    nvmmh_gpu: str  # member name of nvMatmulHeuristics.NvMatmulHeuristicsNvidiaGpu
    note: str = ""


# Named GPUs (per-GPU values; GB200/GB300 superchips are counted per Blackwell GPU).
GPUS: dict[str, GpuSpec] = {
    "B200": GpuSpec("B200", "sm_100a", 148, "B200"),
    "GB200": GpuSpec("GB200", "sm_100a", 148, "GB200_NVL"),
    "B300": GpuSpec(
        "B300", "sm_103a", 148, "GB300_NVL",
        note="SM count as published for B200-class parts; pass sm_count= or Target.from_device() to override",
    ),
    "H100": GpuSpec("H100", "sm_90a", 132, "H100_SXM"),
    "H200": GpuSpec("H200", "sm_90a", 132, "H200_SXM"),
    # sm_120a / sm_121a (GeForce / workstation Blackwell, DGX Spark), sm_89 (Ada), sm_86 / sm_80 (Ampere):
    # the W4A16 mma kernel's targets (nvMatmulHeuristics is not asked for W4A16: no GPU name)
    "RTX5090": GpuSpec("RTX5090", "sm_120a", 170, ""),
    "RTX5080": GpuSpec("RTX5080", "sm_120a", 84, ""),
    "RTXPRO6000": GpuSpec("RTXPRO6000", "sm_120a", 188, "", note="RTX PRO 6000 Blackwell Workstation Edition"),
    "GB10": GpuSpec("GB10", "sm_121a", 48, "", note="DGX Spark"),
    "L40S": GpuSpec("L40S", "sm_89", 142, ""),
    "RTX4090": GpuSpec("RTX4090", "sm_89", 128, ""),
    "A10": GpuSpec("A10", "sm_86", 72, ""),
    "RTX3090": GpuSpec("RTX3090", "sm_86", 82, ""),
    "A100": GpuSpec("A100", "sm_80", 108, "", note="A100 SXM 80GB"),
}

_GPU_ALIASES = {"GB300": "B300", "H100_SXM": "H100", "H200_SXM": "H200", "B200_SXM": "B200",
                "RTX_5090": "RTX5090", "RTX_5080": "RTX5080", "RTX_PRO_6000": "RTXPRO6000", "DGX_SPARK": "GB10",
                "DGXSPARK": "GB10", "SPARK": "GB10", "RTX_4090": "RTX4090", "RTX_3090": "RTX3090", "A100_SXM": "A100",
                "A100_80GB": "A100"}


@dataclass(frozen=True)
class Target:
    """Where the kernel runs: CuTeDSL arch string, SM count and (optionally) the GPU name."""

    arch: str
    sm_count: int
    gpu: str | None = None

    @staticmethod
    def from_gpu(name: str, sm_count: int | None = None) -> "Target":
        key = _GPU_ALIASES.get(name.upper(), name.upper())
        if key not in GPUS:
            raise ValueError(f"nvgemm_cutedsl: unknown GPU {name!r}; known: {', '.join(GPUS)}")
        spec = GPUS[key]
        return Target(spec.arch, sm_count if sm_count is not None else spec.sm_count, spec.name)

    @staticmethod
    def from_device(index: int = 0) -> "Target":
        """Read arch and SM count from a live CUDA device. Only called when explicitly asked."""
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("nvgemm_cutedsl: Target.from_device() needs a CUDA device; none is visible")
        props = torch.cuda.get_device_properties(index)
        major, minor = props.major, props.minor
        arch = f"sm_{major}{minor}a" if major in (9, 10, 12) else f"sm_{major}{minor}"
        gpu = None
        for name in sorted(GPUS, key=len, reverse=True):  # "GB200" before "B200"
            if GPUS[name].arch == arch and name in props.name.upper():
                gpu = name
                break
        return Target(arch, int(props.multi_processor_count), gpu)

    @property
    def family(self) -> str:
        """``"sm100"`` (datacenter Blackwell: sm_100/103/110), ``"sm90"`` or ``"other"``."""
        if self.arch.startswith(("sm_100", "sm_103", "sm_110")):
            return "sm100"
        if self.arch.startswith("sm_90"):
            return "sm90"
        return "other"


def _norm_dtype(d) -> str:
    if isinstance(d, str):
        s = d.lower().replace("torch.", "")
        return {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}.get(s, s)
    return _norm_dtype(str(d))


@dataclass(frozen=True)
class GemmProblem:
    n: int
    k: int
    m: int | None = None
    m_range: tuple[int, int] | None = None
    a_format: str = "nvfp4"
    b_format: str = "nvfp4"
    out_dtype: str = "bf16"
    epilogue: str = "none"
    target: Target = field(default_factory=lambda: Target.from_gpu("B200"))

    def __post_init__(self):
        object.__setattr__(self, "out_dtype", _norm_dtype(self.out_dtype))
        object.__setattr__(self, "a_format", _norm_dtype(self.a_format))
        object.__setattr__(self, "b_format", _norm_dtype(self.b_format))
        if self.m_range is not None:
            try:
                lo, hi = self.m_range
                object.__setattr__(self, "m_range", (int(lo), int(hi)))
            except (TypeError, ValueError):
                pass  # left as given; validate_problem names the problem

    # ---- views -------------------------------------------------------------------------------
    @property
    def m_lo(self) -> int:
        return self.m if self.m is not None else self.m_range[0]

    @property
    def m_hi(self) -> int:
        """Largest token count the kernel must serve (the exact M, or the range's upper bound)."""
        return self.m if self.m is not None else self.m_range[1]

    @property
    def is_dynamic(self) -> bool:
        return self.m is None

    @property
    def kind(self) -> str:
        """``"w4a4"`` (NVFP4 x NVFP4), ``"w4a16"`` (bf16/fp16 x NVFP4) or ``"unsupported"``."""
        if self.b_format != "nvfp4":
            return "unsupported"
        if self.a_format == "nvfp4":
            return "w4a4"
        if self.a_format in ("bf16", "fp16"):
            return "w4a16"
        return "unsupported"

    def with_m(self, m: int) -> "GemmProblem":
        return replace(self, m=m, m_range=None)

    def with_m_range(self, lo: int, hi: int) -> "GemmProblem":
        return replace(self, m=None, m_range=(lo, hi))

    def describe(self) -> str:
        mm = str(self.m) if self.m is not None else f"{self.m_range[0]}..{self.m_range[1]}"
        return (
            f"M={mm} N={self.n} K={self.k} {self.kind} out={self.out_dtype} epilogue={self.epilogue} "
            f"{self.target.arch}x{self.target.sm_count}SM"
        )


def validate_problem(p: GemmProblem) -> Status:
    """Problem-only checks shared by every family (no config involved). Never raises."""
    try:
        return _validate_problem_cached(p)
    except TypeError:  # unhashable field values (e.g. a list for m_range): check uncached
        return _validate_problem(p)


@lru_cache(maxsize=8192)
def _validate_problem_cached(p: GemmProblem) -> Status:
    return _validate_problem(p)


def _validate_problem(p: GemmProblem) -> Status:
    if (p.m is None) == (p.m_range is None):
        return Status.fail("give exactly one of m (exact token count) or m_range=(lo, hi)")
    if p.m is not None and (not isinstance(p.m, int) or p.m <= 0):
        return Status.fail(f"M must be a positive int, got M={p.m!r}")
    if p.m_range is not None:
        if not (isinstance(p.m_range, tuple) and len(p.m_range) == 2 and all(isinstance(v, int) for v in p.m_range)):
            return Status.fail(f"m_range must be a (lo, hi) pair of ints, got {p.m_range!r}")
        lo, hi = p.m_range
        if lo <= 0 or hi < lo:
            return Status.fail(f"m_range must satisfy 1 <= lo <= hi, got {p.m_range}")
    if not isinstance(p.n, int) or p.n <= 0:
        return Status.fail(f"N must be a positive int, got N={p.n!r}")
    if not isinstance(p.k, int) or p.k <= 0:
        return Status.fail(f"K must be a positive int, got K={p.k!r}")
    if p.a_format not in OPERAND_FORMATS or p.b_format not in OPERAND_FORMATS:
        return Status.fail(f"operand formats must be in {OPERAND_FORMATS}, got A={p.a_format} B={p.b_format}")
    if p.kind == "unsupported":
        return Status.fail(
            f"unsupported operand formats A={p.a_format} x B={p.b_format} (nvgemm: nvfp4 x nvfp4, or bf16/fp16 x nvfp4)"
        )
    if p.out_dtype not in OUT_DTYPES:
        return Status.fail(f"out_dtype must be one of {OUT_DTYPES}, got {p.out_dtype!r}")
    if p.epilogue not in EPILOGUES:
        return Status.fail(f"epilogue must be one of {EPILOGUES}, got {p.epilogue!r}")
    if p.epilogue == "silu_mul" and p.n % 2:
        return Status.fail(f"silu_mul needs an even number of GEMM output columns, got N={p.n}")
    if p.target.sm_count <= 0:
        return Status.fail(f"target SM count must be positive, got {p.target.sm_count}")
    return Status.success()


@dataclass(frozen=True)
class Candidate:
    """One policy answer: a config, why it was included, and nvMatmulHeuristics' estimate if any."""

    config: object
    reason: str
    est_runtime_us: float | None = None
    #: the target arch the policy ranked the config for (``heuristics.candidates`` sets it); a config type
    #: compiled for several archs is run by a different backend on some (:data:`BACKEND_OF_CONFIG_ARCH`)
    arch: str | None = None

    @property
    def name(self) -> str:
        return self.config.name()

    @property
    def backend(self) -> str:
        """The ``nvgemm.dispatch.registry`` backend that runs this config on its target arch."""
        kind = type(self.config).__name__
        return BACKEND_OF_CONFIG_ARCH.get((kind, self.arch)) or BACKEND_OF_CONFIG.get(kind, "unknown")


BACKEND_OF_CONFIG = {"Sm100Nvfp4GemmConfig": "cutedsl_sm100", "Sm90W4A16Config": "cutedsl_sm90",
                     "Sm120W4A4Config": "cutedsl_sm120"}
#: (config type, target arch) -> backend where it is not the type's own: the W4A16 ``mma`` kernel off
#: Hopper is ``cutedsl_mma_w4a16`` (``templates.sm90_w4a16.backend.ARCH_OF_CAPABILITY``).
BACKEND_OF_CONFIG_ARCH = {("Sm90W4A16Config", a): "cutedsl_mma_w4a16"
                          for a in ("sm_80", "sm_86", "sm_89", "sm_120a", "sm_121a")}

# Default named GPU per CUDA capability (used when a problem comes with a capability only).
GPU_OF_CAPABILITY = {(10, 0): "B200", (10, 3): "B300", (9, 0): "H100", (12, 0): "RTX5090", (12, 1): "GB10",
                     (8, 9): "L40S", (8, 6): "A10", (8, 0): "A100"}


def as_gemm_problem(obj, target: Target | None = None) -> GemmProblem | None:
    """A :class:`GemmProblem` from a GemmProblem or a ``nvgemm.dispatch.registry.LinearProblem``
    (duck-typed: ``m, n, k, capability, weight_only, x_dtype, out_dtype, activation``).

    The target is ``target`` if given, else the named GPU of the capability (:data:`GPU_OF_CAPABILITY`:
    B200 for (10, 0), B300 for (10, 3), H100 for (9, 0), RTX 5090 for (12, 0), ...); None when neither
    is known (e.g. a CPU problem).
    """
    if isinstance(obj, GemmProblem):
        return obj if target is None else replace(obj, target=target)
    if target is None:
        cap = getattr(obj, "capability", None)
        gpu = GPU_OF_CAPABILITY.get(tuple(cap)) if cap is not None else None
        if gpu is None:
            return None
        target = Target.from_gpu(gpu)
    weight_only = bool(getattr(obj, "weight_only", False))
    return GemmProblem(
        n=int(obj.n),
        k=int(obj.k),
        m=int(obj.m),
        a_format=_norm_dtype(getattr(obj, "x_dtype", "bf16")) if weight_only else "nvfp4",
        b_format="nvfp4",
        out_dtype=_norm_dtype(getattr(obj, "out_dtype", "bf16")),
        epilogue=getattr(obj, "activation", "none") or "none",
        target=target,
    )


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


SPLIT_K_CHOICES = (2, 4, 8, 16)
MIN_K_TILES_PER_SLICE = 2


def choose_split_k(ctas: int, k: int, tile_k: int, sm_count: int, allowed=SPLIT_K_CHOICES) -> int:
    """Split-K factor for an output of ``ctas`` tiles when they would leave most SMs idle, else 1.

    "Most SMs idle" means ctas * 2 <= sm_count. Candidates are the factors that split the
    ceil(K/tile_k) K tiles into equal whole-tile slices of at least MIN_K_TILES_PER_SLICE tiles.
    Cost model (persistent kernel, one work unit per CTA slot): waves * (K tiles per slice + 1),
    where waves = ceil(ctas * s / sm_count) and the +1 charges each work unit one K-tile
    equivalent for pipeline fill/drain, the fp32 partial store and the reduction. The cheapest
    factor wins; ties go to the smaller factor.
    """
    if ctas * 2 > sm_count:
        return 1
    k_tiles = ceil_div(k, tile_k)
    best_cost, best_s = ceil_div(ctas, sm_count) * (k_tiles + 1), 1
    for s in allowed:
        if k_tiles % s or k_tiles // s < MIN_K_TILES_PER_SLICE:
            continue
        cost = ceil_div(ctas * s, sm_count) * (k_tiles // s + 1)
        if cost < best_cost:
            best_cost, best_s = cost, s
    return best_s
