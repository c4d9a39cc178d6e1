"""Serve a checkpoint with SGLang's Python engine on CPU and write the generated tokens and log-probs.

Run as a script (SGLang spawns processes, so this must not be imported by pytest):
    python tests/sglang_engine/_serve.py CKPT TP OUT.json [ep]
(``ep``: expert parallelism over the TP ranks, SGLang's ``ep_size = TP``.)
The caller sets the environment: NVGEMM_SGLANG=1 (the opt-in) and NVGEMM_SGLANG_DUMP (every nvgemm
linear call is saved), SGLANG_USE_CPU_ENGINE=1, and PYTHONPATH with the test stubs (stubs/).
"""

import json
import sys

PROMPTS = [[1, 5, 9, 33, 100, 7, 250, 42], [17, 250, 3]]
MAX_TOKENS = 4
LOGPROBS = 5


def main() -> None:
    ckpt, tp, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    ep = tp if sys.argv[4:] == ["ep"] else 1
    import sglang as sgl

    engine = sgl.Engine(model_path=ckpt, device="cpu", attention_backend="torch_native", skip_tokenizer_init=True,
                        disable_overlap_schedule=True, max_total_tokens=1024, max_running_requests=4,
                        dtype="bfloat16", tp_size=tp, ep_size=ep, random_seed=0, log_level="info")
    try:
        results = engine.generate(input_ids=PROMPTS,
                                  sampling_params={"temperature": 0.0, "max_new_tokens": MAX_TOKENS},
                                  return_logprob=True, top_logprobs_num=LOGPROBS)
    finally:
        engine.shutdown()
    doc = []
    for prompt, r in zip(PROMPTS, results):
        meta = r["meta_info"]
        tokens = [int(t) for t in r["output_ids"]]
        steps = [{str(int(tok)): float(lp) for lp, tok, *_ in step} for step in meta["output_top_logprobs"]]
        chosen = [[float(lp), int(tok)] for lp, tok, *_ in meta["output_token_logprobs"]]
        doc.append({"prompt": prompt, "token_ids": tokens, "logprobs": steps, "chosen": chosen})
    with open(out, "w") as f:
        json.dump(doc, f)


if __name__ == "__main__":
    main()
