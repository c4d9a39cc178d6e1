"""Serve a checkpoint with a real vLLM engine (CPU build) and write the generated tokens and logprobs.

Run as a script (vLLM spawns processes, so this must not be imported by pytest):
    python tests/vllm_engine/_serve.py CKPT TP OUT.json [ep] [compile] [short]
(``ep``: expert parallelism, vLLM's ``enable_expert_parallel``: each rank holds a subset of the experts;
``compile``: vLLM's torch.compile instead of eager, with nvgemm's fused requant pass named in the compilation
config, ``inductor_passes``; ``short``: the first prompt only, :data:`SHORT_TOKENS` tokens, a 16-token model
length and batch budget -- for kernels on the PTX emulator, whose calls take seconds)
The caller sets NVGEMM_VLLM=1 (the opt-in) and NVGEMM_VLLM_DUMP (every nvgemm linear call is saved). With
``compile``, nvgemm's Inductor counters go to OUT.json.counters.
"""

import json
import sys

PROMPTS = [[1, 5, 9, 33, 100, 7, 250, 42], [17, 250, 3]]
MAX_TOKENS = 4
SHORT_TOKENS = 2
LOGPROBS = 5


def main() -> None:
    ckpt, tp, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    ep, compiled, short = "ep" in sys.argv[4:], "compile" in sys.argv[4:], "short" in sys.argv[4:]
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    extra = {"max_num_seqs": 4}
    prompts, max_tokens, max_len = PROMPTS, MAX_TOKENS, 64
    if short:
        prompts, max_tokens, max_len = PROMPTS[:1], SHORT_TOKENS, 16
        extra.update(max_num_batched_tokens=16, max_num_seqs=1)
    if compiled:
        extra["compilation_config"] = {"inductor_passes": {"post_grad_custom_pre_pass": "nvgemm.fused_requant_pass"}}
    llm = LLM(model=ckpt, skip_tokenizer_init=True, enforce_eager=not compiled,
              tensor_parallel_size=tp, dtype="bfloat16", max_model_len=max_len, seed=0,
              distributed_executor_backend="uni" if tp == 1 else "mp", enable_expert_parallel=ep, **extra)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=LOGPROBS, detokenize=False)
    results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params)
    doc = []
    for prompt, r in zip(prompts, results):
        o = r.outputs[0]
        doc.append({"prompt": prompt, "token_ids": list(o.token_ids),
                    "logprobs": [{str(t): lp.logprob for t, lp in step.items()} for step in o.logprobs]})
    with open(out, "w") as f:
        json.dump(doc, f)
    if compiled:  # what nvgemm's pass did in this process (the engine runs in it: TP=1, no multiprocessing)
        from nvgemm.integrations.inductor.compat import nvgemm_counters

        with open(out + ".counters", "w") as f:
            json.dump(dict(nvgemm_counters()), f)


if __name__ == "__main__":
    main()
