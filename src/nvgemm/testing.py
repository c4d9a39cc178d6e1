"""Tiny ModelOpt-exported NVFP4 checkpoints, built on CPU in about a second (tests, demo, benches).

``make_tiny_checkpoint`` builds a small Llama- or Qwen2-style model, or a tiny MoE model (Qwen3-MoE,
Mixtral, DeepSeek-V3 with shared expert and dense layer, Llama-4, NemotronH non-gated; ``MOE_KINDS``) from an embedded config,
quantizes it with ModelOpt (``NVFP4_DEFAULT_CFG`` or ``W4A16_NVFP4_CFG``, random calibration)
and exports it with ModelOpt's own Hugging Face exporter. No network, no hub.
Facts it relies on: ModelOpt's calibration runs on CPU (its fake-quant *forward* asserts CUDA,
so nothing here runs the quantized model through ModelOpt), and the exporter needs
``config.architectures`` set on a model built from a config.

``sm90_stand_in`` lets CPU tests run the Hopper host path (the sm90 backend selected, weights
prepared or held in its layout) with the launch replaced by the emulated op.
``triton_recording_driver`` makes Triton's active driver a stand-in GPU: ``JITFunction.run`` and Triton's CUDA
launcher run their real code and the driver's launch entry records what it would hand ``cuLaunchKernelEx``.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
from pathlib import Path

import torch

from nvgemm import settings
from nvgemm.aot.abi import get_template
from nvgemm.aot.artifact import AotKernel
from nvgemm.core.backend import PREQUANT, REQUANT
from nvgemm.core.formats import NVFP4, blocked_numel
from nvgemm.dispatch import registry as B
from nvgemm.ops.linear import nvfp4_linear_emulated
from nvgemm.templates.common import occupancy
from nvgemm.templates.sm100_w4a4 import backend as sb
from nvgemm.templates.sm100_w4a4.occupancy import aot_max_active_clusters
from nvgemm.templates.sm90_w4a16 import backend as sm90_backend

TINY_CONFIGS = {
    "llama": dict(
        arch="LlamaForCausalLM",
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        tie_word_embeddings=False,
    ),
    "qwen2": dict(
        arch="Qwen2ForCausalLM",  # q/k/v projections carry biases
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        tie_word_embeddings=False,
    ),
    # MoE (ModelOpt 0.47 quantizes and exports each on CPU; shared/research/moe_nvfp4.md 3.3)
    "qwen3_moe": dict(
        arch="Qwen3MoeForCausalLM",  # fused experts, 8 experts top-2, router `mlp.gate`
        vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=True, max_position_embeddings=128, tie_word_embeddings=False,
    ),
    "mixtral": dict(
        arch="MixtralForCausalLM",  # exported under hub names block_sparse_moe.experts.E.w1/w2/w3
        vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=128,
        tie_word_embeddings=False,
    ),
    "deepseek_v3": dict(
        arch="DeepseekV3ForCausalLM",  # layer 0 dense MLP; layer 1: 8 routed + 1 shared expert, grouped top-2
        vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
        n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1, routed_scaling_factor=2.5,
        q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
        max_position_embeddings=128, tie_word_embeddings=False,
    ),
    "llama4": dict(
        arch="Llama4ForCausalLM",  # stacked transposed experts, top-1 weight on the input, shared expert
        vocab_size=256, hidden_size=64, intermediate_size=32, intermediate_size_mlp=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=1,
        interleave_moe_layer_step=1, max_position_embeddings=128, tie_word_embeddings=False,
    ),
    "nemotron_h": dict(
        arch="NemotronHForCausalLM",  # non-gated relu2 experts + shared expert; layers: attention, MoE
        vocab_size=256, hidden_size=64, num_hidden_layers=2, hybrid_override_pattern="*E", num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=32, n_shared_experts=1, intermediate_size=64,
        max_position_embeddings=128, tie_word_embeddings=False,
    ),
}
MOE_KINDS = ("qwen3_moe", "mixtral", "deepseek_v3", "llama4", "nemotron_h")
_MODEL_TYPES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3MoeForCausalLM": "qwen3_moe",
                "MixtralForCausalLM": "mixtral", "DeepseekV3ForCausalLM": "deepseek_v3",
                "Llama4ForCausalLM": "llama4_text", "NemotronHForCausalLM": "nemotron_h"}

QUANT_CFGS = {"NVFP4": "NVFP4_DEFAULT_CFG", "W4A16_NVFP4": "W4A16_NVFP4_CFG",
              # routed experts only (NVIDIA's Kimi-K2.x / MiniMax-M2.x recipe): the rest stays BF16
              "NVFP4_EXPERTS_ONLY": "NVFP4_EXPERTS_ONLY_CFG"}


def build_tiny_model(kind: str = "llama", seed: int = 0, dtype: torch.dtype = torch.bfloat16, **overrides):
    """A randomly initialised tiny HF causal LM (bf16, eval mode)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if kind not in TINY_CONFIGS:
        raise ValueError(f"unknown tiny model {kind!r}; have {sorted(TINY_CONFIGS)}")
    spec = dict(TINY_CONFIGS[kind], **overrides)
    arch = spec.pop("arch")
    model_type = _MODEL_TYPES[arch]
    config = AutoConfig.for_model(model_type, **spec)
    config.architectures = [arch]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    if kind == "qwen2":  # HF initialises biases to zero; make them matter
        with torch.no_grad():
            for name, mod in model.named_modules():
                if isinstance(mod, torch.nn.Linear) and mod.bias is not None:
                    mod.bias.normal_(0, 0.5)
    return model


def quantize_and_export(model, out_dir: str | Path, algo: str = "NVFP4", seed: int = 0,
                        calib_batches: int = 2, calib_len: int = 16) -> Path:
    """Quantize ``model`` in place with ModelOpt (random-token calibration) and export it."""
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint

    if algo not in QUANT_CFGS:
        raise ValueError(f"unknown algo {algo!r}; have {sorted(QUANT_CFGS)}")
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(seed)

    def forward_loop(m):
        for _ in range(calib_batches):
            m(torch.randint(0, vocab, (2, calib_len), generator=gen))

    with torch.no_grad():
        mtq.quantize(model, getattr(mtq, QUANT_CFGS[algo]), forward_loop)
    out_dir = Path(out_dir)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    export_hf_checkpoint(model, export_dir=str(out_dir))
    return out_dir


def make_tiny_checkpoint(out_dir: str | Path, kind: str = "llama", algo: str = "NVFP4", seed: int = 0) -> Path:
    """Build, quantize and export a tiny checkpoint into ``out_dir``; returns the folder."""
    return quantize_and_export(build_tiny_model(kind, seed), out_dir, algo, seed)


@contextlib.contextmanager
def sm90_stand_in():
    """The sm90 kernels' stand-in on CPU, for tests of what a Hopper GPU holds and computes.

    Inside the block, backend ``cutedsl_sm90`` takes CPU problems by the real rules of
    :func:`nvgemm.templates.sm90_w4a16.backend.supports` (read as if on an sm_90 GPU) and runs the real host
    path -- ``run_sm90`` derives and memoises the prepared copy of a checkpoint-layout weight,
    ``nvgemm::nvfp4_linear_sm90_prepared`` passes a held layer's own prepared tensors -- with only
    the launch replaced: the emulated op on the checkpoint layout re-encoded from the prepared
    tensors the kernel would read (:func:`nvgemm.templates.sm90_w4a16.operand.to_modelopt`, value-exact).
    Results are bit-identical to the emulated op exactly when the launch is handed the right
    prepared weight. Yields the list of prepared weights handed to the launch."""
    from dataclasses import replace

    # lazy: looked up at call time (tests patch operand.to_modelopt)
    from nvgemm.templates.sm90_w4a16.operand import to_modelopt

    B.load_builtin_backends()
    name = sm90_backend.BACKEND_NAME
    real, run_prepared, checked = B.registered("linear", name), sm90_backend.run_prepared, dict(B._CHECKED)
    bind_prepared = sm90_backend.bind_prepared
    launched: list = []

    def supports(p):
        return sm90_backend.supports(replace(p, device_type="cuda", capability=(9, 0)) if p.device_type == "cpu" else p)

    def launch(x, p, input_scale, bias, residual, activation, out_dtype, config=None):
        launched.append(p)
        w, s = to_modelopt(p)
        ws2 = p.weight_scale_2 if p.weight_scale_2.numel() > 1 else p.weight_scale_2.reshape(())
        return nvfp4_linear_emulated(x, w, s, ws2, input_scale, bias, residual, activation, out_dtype)

    B.register_backend(replace(real, supports=supports, bind=None))  # every call through the stand-in launch
    sm90_backend.run_prepared = launch
    sm90_backend.bind_prepared = lambda *a: None  # no bound launches: every call through the stand-in launch
    B._CHECKED.clear()
    try:
        yield launched
    finally:
        B.register_backend(real)
        sm90_backend.run_prepared = run_prepared
        sm90_backend.bind_prepared = bind_prepared
        B._CHECKED.clear()
        B._CHECKED.update(checked)


# --------------------------------------------------------------------------- host launchers on a fake device


class HostLaunches:
    """What one :func:`host_path_stand_in` block launched: ``events`` lists ``"quantize"`` (the activation
    quantizer a backend is given) and ``"gemm:<kernel>"`` (a kernel launch, its arguments packed by the
    real :class:`~nvgemm.aot.artifact.AotKernel` packer), in order."""

    def __init__(self) -> None:
        self.events: list[str] = []
        #: every torch op (``aten::<name>``) the backends' ``run`` executed, in order
        self.torch_ops: list[str] = []
        #: per launch, its arguments with each tensor replaced by its data pointer
        self.pointers: list[tuple] = []

    def clear(self) -> None:
        self.events.clear()
        self.torch_ops.clear()
        self.pointers.clear()

    def device_work(self) -> list[str]:
        """The launches (:attr:`events`) plus every recorded torch op that would run a kernel or a copy on a
        GPU: everything except allocations without a fill, views and metadata queries."""
        return self.events + [op for op in self.torch_ops if op not in NO_DEVICE_WORK]


#: aten ops that launch nothing on a GPU: uninitialised allocations, views, metadata
NO_DEVICE_WORK = frozenset({
    "empty", "empty_strided", "new_empty", "new_empty_strided", "view", "_unsafe_view", "reshape", "t",
    "transpose", "permute", "expand", "as_strided", "slice", "select", "alias", "detach", "unsqueeze",
    "squeeze", "view_as", "is_same_size", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
    "_local_scalar_dense_meta",
})


class _FakeStream:
    cuda_stream = 0


class _FakeProps:
    def __init__(self, major: int, minor: int, sms: int):
        self.major, self.minor, self.multi_processor_count = major, minor, sms
        self.name = f"nvgemm stand-in sm_{major}{minor}"


@contextlib.contextmanager
def host_path_stand_in(family: str, *, record_ops: bool = True, capability=None, sms: int | None = None):
    """The production host path of the ``cutedsl_sm100`` (``family="sm100"``: ``nvfp4_linear`` and the fused
    requant / prequant ops) or ``cutedsl_sm90`` (``"sm90"``) backend on CPU tensors, on a stand-in device
    (B200: sm_100a, 148 SMs; H200: sm_90a, 132 SMs). ``family="sm90"`` with another ``capability``
    (8.0, 8.6, 8.9, 12.0, 12.1; ``sms``: its SM count) is the ``cutedsl_mma_w4a16`` backend on that device. Inside the block the backend takes CPU problems and
    runs its real ``run`` -- per-problem plan, argument preparation, derived operands, workspaces,
    argument packing -- with only two things replaced: the kernel (its ``launch`` packs the arguments with
    the kernel's real ABI and records ``"gemm:<name>"``) and, for sm100, the activation quantizer (returns
    uninitialised buffers of the right shapes and records ``"quantize"``, as the Triton kernel writes every
    byte). Any other device work the host path does shows up as torch ops (count them with a
    ``TorchDispatchMode``; recorded into :attr:`HostLaunches.torch_ops` unless ``record_ops=False``, as a
    timing wants). Yields a :class:`HostLaunches`. Outputs hold no values: for counting launches,
    host work and host time (``bench/bench_host_overhead.py``), not for results."""
    from dataclasses import replace


    rec = HostLaunches()
    packers: dict = {}

    class NullKernel:
        def __init__(self, cspec):
            key = (cspec.template_id, cspec)
            if key not in packers:
                packers[key] = AotKernel.packer(tuple(get_template(cspec.template_id).abi(cspec)), cspec.name())
            self.packer, self.name = packers[key], cspec.template_id

        def launch(self, *values):
            self.packer.pack(*values, check_device=False)
            rec.events.append(f"gemm:{self.name}")
            if record_ops:
                rec.pointers.append(tuple(v.data_ptr() if isinstance(v, torch.Tensor) else v for v in values))

        def bind(self, values, per_call):
            bound = []
            # what launch() records for a value that is not a tensor (no reference to the layer's tensors)
            others = [None if isinstance(v, torch.Tensor) else v for v in values]

            def launch(slots, nargs):  # the packed array is complete here: record it, launch nothing
                rec.events.append(f"gemm:{self.name}")
                if record_ops:
                    ptrs = bound[0].pointers()
                    rec.pointers.append(tuple(p if v is None else v for v, p in zip(others, ptrs)))
                return 0
            bound.append(self.packer.bind(values, per_call, check_device=False, launch=launch))
            return bound[0]

    def quantize(x2, input_scale, swizzle=True):
        rec.events.append("quantize")
        m, k = x2.shape
        scales = (torch.empty(blocked_numel(m, k // NVFP4.block_size), dtype=torch.float8_e4m3fn) if swizzle else
                  torch.empty(m, k // NVFP4.block_size, dtype=torch.float8_e4m3fn))
        return torch.empty(m, k // 2, dtype=torch.uint8), scales

    saved: list = []

    def patch(obj, name, value):
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    B.load_builtin_backends()
    checked = dict(B._CHECKED)
    patch(torch.cuda, "current_stream", lambda device=None: _FakeStream())
    if family == "sm100":

        cap = (10, 0)
        patch(sb, "device_target", lambda index: ("sm_100a", 148))
        patch(sb, "_device_index", lambda dev: 0)
        patch(sb, "kernel_for", lambda cspec, cache=None: NullKernel(cspec))
        patch(sb, "quantize_nvfp4_cuda", quantize)
        patch(sb, "bind_quantize_nvfp4_cuda", lambda m, k, dtype, device, input_scale: quantize)
        patch(occupancy, "query_max_active_clusters",
              lambda index, cluster_size, *a: aot_max_active_clusters("sm_100a", 148, cluster_size))
        kinds = [("linear", sb.BACKEND), (REQUANT, sb.REQUANT_BACKEND), (PREQUANT, sb.PREQUANT_BACKEND)]
        caches = [sb.launch_plan]
    elif family == "sm90":
        cap = tuple(capability or (9, 0))
        if sm90_backend.arch_of(cap) is None:
            raise ValueError(f"host_path_stand_in: no W4A16 kernel arch for capability {cap}")
        props = _FakeProps(*cap, sms or 132)
        patch(torch.cuda, "get_device_properties", lambda device=None: props)
        # memoised like the production lookup it replaces
        patch(sm90_backend, "_kernel_for", functools.lru_cache(maxsize=None)(
            lambda config, spec, x_dtype, sms, arch=sm90_backend.ARCH: NullKernel(
                sm90_backend.compile_spec_for(config, spec, x_dtype, sms, arch))))
        kinds = [("linear", sm90_backend.BACKEND if cap == (9, 0) else sm90_backend.MMA_BACKEND)]
        caches = []
    else:
        raise ValueError(f"host_path_stand_in: family must be 'sm100' or 'sm90', got {family!r}")

    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            rec.torch_ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    def on_device(backend):
        def supports(p):
            return backend.supports(replace(p, device_type="cuda", capability=cap) if p.device_type == "cpu" else p)

        def run(*args, **kwargs):
            with Ops():
                return backend.run(*args, **kwargs)

        def bind(*args, **kwargs):  # the bound call's torch ops are recorded as run's are
            bound = backend.bind(*args, **kwargs) if backend.bind is not None else None
            if bound is None or not record_ops:
                return bound

            def run_bound(*a):
                with Ops():
                    return bound(*a)
            return run_bound
        return replace(backend, supports=supports, run=run if record_ops else backend.run, bind=bind)

    for kind, backend in kinds:
        B.register_backend(on_device(backend), kind)
    for c in caches:
        c.cache_clear()
    B._CHECKED.clear()
    try:
        with settings.override(NVGEMM_SELFCHECK=False):  # the stand-in kernels compute nothing to check
            yield rec
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)
        for kind, backend in kinds:
            B.register_backend(backend, kind)
        for c in caches:
            c.cache_clear()
        B._CHECKED.clear()
        B._CHECKED.update(checked)



class _RecordingTritonUtils:
    """The stand-in driver's ``utils``, one per process: Triton's launcher keeps the ``utils.launch`` it was built
    with inside the compiled kernel (cached across blocks), so launches go to the innermost open block's list."""

    _one = None

    @classmethod
    def instance(cls):
        if cls._one is None:
            cls._one = cls()
        return cls._one

    def __init__(self):
        self.sinks: list = []
        self.loads: list = []

    def launch(self, gx, gy, gz, stream_, function, coop, pdl, kernel_metadata, launch_metadata, enter, exit_,
               global_scratch, profile_scratch, arg_annotations, kernel_signature, args):
        if not self.sinks:
            raise RuntimeError("nvgemm triton_recording_driver: a launch outside the block (no GPU here)")
        launches, record = self.sinks[-1]
        if record:
            launches.append(TritonDriverLaunch(((gx, gy, gz), stream_, function, coop, pdl, kernel_metadata,
                                                launch_metadata, enter, exit_, global_scratch, profile_scratch,
                                                kernel_signature, tuple(args))))

    def build_signature_metadata(self, kernel_signature):
        return tuple(kernel_signature)  # the C launcher's argument-width table: here the type names

    def load_binary(self, name, kernel, shared, dev):
        # (module, function, n_regs, n_spills, n_max_threads): stand-in handles, one per loaded binary
        self.loads.append(name)
        return 0x1000 + 16 * len(self.loads), 0x100000 + 16 * len(self.loads), 32, 0, 1024

    def get_device_properties(self, dev):
        return {"max_shared_mem": 232448, "multiprocessor_count": 148, "max_num_regs": 65536,
                "warpSize": 32, "sm_clock_rate": 1, "mem_clock_rate": 1, "mem_bus_width": 1}

    def unload_module(self, module):
        pass


class TritonDriverLaunch(tuple):
    """One launch that reached the driver's ``launch`` entry (what Triton's CUDA launcher hands
    ``cuLaunchKernelEx``): ``(grid, stream, function, launch_cooperative_grid, launch_pdl, kernel_metadata,
    launch_metadata, enter_hook, exit_hook, global_scratch, profile_scratch, kernel_signature, args)``."""


@contextlib.contextmanager
def triton_recording_driver(capability: tuple[int, int] = (10, 0), *, device: int = 0, stream: int = 0x5A5A0,
                            record: bool = True):
    """Triton's active driver replaced by one for a stand-in GPU of ``capability`` on this host (no CUDA
    needed): ``JITFunction.run`` runs its real code -- binder, specialization, cache key, ``triton.compile``
    for the explicit target (real PTX and cubin), ``CompiledKernel`` handles, launch metadata -- and Triton's
    real CUDA launcher (``CudaLauncher``: scratch allocation, argument annotation, launch attributes from the
    kernel's metadata) calls this driver's ``utils.launch`` where a GPU's would enter ``cuLaunchKernelEx``.
    That entry records a :class:`TritonDriverLaunch` (``record=False``: does nothing, for timing) and runs
    nothing. Yields the list of records. Tensors are CPU tensors (only their pointers are read); the driver
    reports ``device`` as current and ``stream`` as its current stream (an int, as the CUDA driver's is)."""
    from collections import namedtuple

    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia import driver as nvdriver
    from triton.runtime.driver import driver as config

    launches: list = []
    utils = _RecordingTritonUtils.instance()

    class Driver:
        def __init__(self):
            self.utils = utils
            self.launcher_cls = nvdriver.CudaLauncher

        @staticmethod
        def is_active():
            return True

        def get_current_target(self):
            return GPUTarget("cuda", capability[0] * 10 + capability[1], 32)

        def get_device_capability(self, dev=None):
            return capability

        def get_current_device(self):
            return device

        def get_current_stream(self, dev=None):
            return stream

        def get_active_torch_device(self):
            return torch.device("cpu")

    # The launcher's argument annotations come from Triton's compiled cuda_utils module, which needs libcuda to
    # build; without it the four names are None. Stand-ins with the same fields (the annotations only travel
    # from the launcher to ``utils.launch``, recorded here) are put in place for the block.
    kernel_arg = namedtuple("PyKernelArg", "nested_tuple type")
    names = {"PyKernelArg": kernel_arg, "ARG_CONSTEXPR": "constexpr", "ARG_KERNEL": "kernel", "ARG_TUPLE": "tuple"}
    saved_names = {n: getattr(nvdriver, n) for n in names}
    saved = config._active
    config.set_active(Driver())
    for n, v in names.items():
        if saved_names[n] is None:
            setattr(nvdriver, n, v)
    utils.sinks.append((launches, record))
    try:
        yield launches
    finally:
        utils.sinks.pop()
        config._active = saved
        for n, v in saved_names.items():
            setattr(nvdriver, n, v)
