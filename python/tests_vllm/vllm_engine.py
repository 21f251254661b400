"""One real vLLM engine (CPU) for the connector's tests and bench/vllm: it
starts an engine with a tiny model (random weights from write_model), runs the requests of
a spec one generate() at a time, in order, and writes what each returned.

    python vllm_engine.py SPEC.json OUT.json

SPEC: {"model_dir", "connector": {kv_transfer_config} or null,
       "kv_cache_bytes", "max_model_len", "prefix_caching" (false: off),
       "stats" (true: vLLM's per-request stats, for "ttft"), "max_num_seqs" (4),
       "tp" (tensor-parallel size, 1), "attention_backend" (vLLM's choice
       unless given),
       "requests": [{"name", "tokens", "salt", "max_tokens", "params",
                     "wait_for": a file to wait for first (a gate)}
                    or {"batch": [requests as above], "wait_for"}: one
                    generate() of them all]}
OUT:  {"start_s", "block_size" (the engine's, which vLLM picks by CPU and
       backend), name: {"tokens", "cached", "top" (each step's 5 likeliest
       tokens and their logprobs), "params", "seconds" (of its generate()),
       "ttft" (with stats: from its arrival to its first token)}}
"""

import json
import os
import sys
import time

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
         "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 1024,
         "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 1,
         "eos_token_id": 2, "torch_dtype": "bfloat16"}


# A dense DeepSeek-V2 (MLA: a 512-wide latent and 64 rope dims per token,
# the geometry vLLM's CPU MLA backend runs).
DEEPSEEK = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 256,
            "intermediate_size": 512, "moe_intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 512, "q_lora_rank": None,
            "qk_rope_head_dim": 64, "qk_nope_head_dim": 64, "v_head_dim": 64, "n_routed_experts": 4,
            "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 2, "moe_layer_freq": 1,
            "topk_method": "greedy", "n_group": 1, "topk_group": 1, "vocab_size": 1024,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None,
            "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
            "torch_dtype": "bfloat16"}


def write_model(directory, base=LLAMA, weights=True, init=0.2, **overrides):
    """A model in directory: its config.json and, with weights, random
    weights (transformers' own initialisation, seed 0, std init) in
    safetensors. vLLM's dummy weights (uniform within 1e-3) give every
    token about the same logit whatever the context: an engine's tokens
    then do not depend on its KV, and no comparison of outputs could catch
    wrong KV. These weights make the next token depend on the context."""
    os.makedirs(directory, exist_ok=True)
    cfg = {**base, "initializer_range": init, **overrides}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f)
    if weights:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory), dtype=torch.bfloat16)
        model.save_pretrained(directory)
    return directory


def wait_for(path, timeout=600):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {path} after {timeout} s")
        time.sleep(0.05)


def main():
    spec = json.load(open(sys.argv[1]))
    from vllm import LLM, SamplingParams

    started = time.monotonic()
    weights = os.path.exists(os.path.join(spec["model_dir"], "model.safetensors"))
    kwargs = dict(model=spec["model_dir"], load_format="safetensors" if weights else "dummy", skip_tokenizer_init=True, enforce_eager=True,
                  max_model_len=spec.get("max_model_len", 1024), max_num_seqs=spec.get("max_num_seqs", 4),
                  max_num_batched_tokens=spec.get("max_model_len", 1024), dtype="bfloat16", seed=0,
                  kv_cache_memory_bytes=spec.get("kv_cache_bytes", 64 << 20))
    if spec.get("connector"):
        kwargs["kv_transfer_config"] = spec["connector"]
    if spec.get("stats"):
        kwargs["disable_log_stats"] = False
    tp = spec.get("tp", 1)
    if tp > 1:  # worker processes on this host, as vLLM's CPU engine runs tensor parallel
        kwargs["tensor_parallel_size"] = tp
        kwargs["distributed_executor_backend"] = "mp"
    # Every engine's ranks get the same cores, a share each: left to itself,
    # vLLM's CPU platform binds a rank's threads to what it leaves after
    # reserving cores, and it reserves one more when a KV connector is
    # configured (for NIXL's threads). On 2 cores an engine without the
    # connector then computed with 1 thread and one with it with 2, and the
    # sums of bf16 GEMMs split another way differed by 0.03 in a logprob.
    cpus = sorted(os.sched_getaffinity(0))
    share = [cpus[i::tp] or cpus[:1] for i in range(tp)]
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(",".join(map(str, c)) for c in share))
    if spec.get("prefix_caching") is False:  # every hit then comes from the connector
        kwargs["enable_prefix_caching"] = False
    if spec.get("attention_backend"):
        kwargs["attention_backend"] = spec["attention_backend"]
    llm = LLM(**kwargs)
    out = {"start_s": time.monotonic() - started, "block_size": llm.llm_engine.vllm_config.cache_config.block_size}
    for r in spec["requests"]:
        if r.get("wait_for"):
            wait_for(r["wait_for"])
        batch = r.get("batch") or [r]
        prompts, params = [], []
        for b in batch:
            prompt = {"prompt_token_ids": b["tokens"]}
            if b.get("salt"):
                prompt["cache_salt"] = b["salt"]
            extra = {"kv_transfer_params": b["params"]} if b.get("params") else None
            prompts.append(prompt)
            params.append(SamplingParams(max_tokens=b.get("max_tokens", 4), temperature=0.0, ignore_eos=True,
                                         detokenize=False, extra_args=extra, logprobs=5))
        t0 = time.monotonic()
        results = llm.generate(prompts, params, use_tqdm=False)
        took = time.monotonic() - t0
        for b, res in zip(batch, results):
            top = [sorted(((int(t), float(lp.logprob)) for t, lp in step.items()), key=lambda x: -x[1])
                   for step in (res.outputs[0].logprobs or [])]
            m = getattr(res, "metrics", None)
            out[b["name"]] = {"tokens": list(res.outputs[0].token_ids), "cached": res.num_cached_tokens, "top": top,
                              "params": res.kv_transfer_params, "seconds": took,
                              "ttft": getattr(m, "first_token_latency", None) if m is not None else None}
        with open(sys.argv[2], "w") as f:  # what ran so far, for a test that reads it while the engine runs
            json.dump(out, f)
    del llm


if __name__ == "__main__":
    main()
