"""vLLM's own scheduler with the cxltier connector on its scheduler side, in
this process, with no workers: what an EngineCore builds before its first
step (VllmConfig from EngineArgs, the KV cache layout resolved for the
platform's attention backends, KVCacheConfig from vLLM's own sizing, the
block hasher), then vLLM's Scheduler. A step is schedule() and
update_from_output() with the token a model would sample, so requests move
through chunked prefill, finish and free their blocks as in an engine.

What it exercises is the connector's answers to vLLM's real objects
(Request, SchedulerOutput, KVCacheBlocks): how many tokens match, which
blocks a load fills and a store covers, when a consumer waits. The bytes
moved are the worker side's, tested in an engine (test_vllm_real.py).
"""

import os

import torch

from vllm_engine import LLAMA, write_model

LAYERS = LLAMA["num_hidden_layers"]


class Engine:
    """One engine's scheduler. device: the tier; extra: more of the
    connector's kv_connector_extra_config."""

    def __init__(self, device, tmp, role="kv_both", block_size=16, batched_tokens=1024, prefix_caching=True,
                 kv_cache_bytes=16 << 20, policy="recompute", **extra):
        from vllm.config import KVTransferConfig, set_current_vllm_config
        from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
        from vllm.engine.arg_utils import EngineArgs
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
        from vllm.v1.core.kv_cache_utils import get_kv_cache_configs, get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec
        from vllm.v1.structured_output import StructuredOutputManager

        model = write_model(os.path.join(tmp, "model"), weights=False)
        kv = KVTransferConfig(kv_connector="CxlTierConnector", kv_connector_module_path="cxltier.vllm", kv_role=role,
                              kv_load_failure_policy=policy,
                              kv_connector_extra_config={"device": device, "index_bytes": 4 << 20, **extra})
        args = EngineArgs(model=model, load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
                          max_model_len=1024, max_num_seqs=4, max_num_batched_tokens=batched_tokens,
                          enable_chunked_prefill=True, long_prefill_token_threshold=0, dtype="bfloat16",
                          block_size=block_size, enable_prefix_caching=prefix_caching, kv_transfer_config=kv)
        self.config = config = args.create_engine_config()
        spec = {f"model.layers.{i}.self_attn.attn": FullAttentionSpec(
            block_size=block_size, num_kv_heads=LLAMA["num_key_value_heads"], head_size=LLAMA["head_dim"],
            dtype=torch.bfloat16) for i in range(LAYERS)}
        with set_current_vllm_config(config):
            layouts = [l.name for l in get_supported_kv_cache_layouts(get_current_attn_backends(config))]
        resolve_kv_cache_layout(config, [layouts], list(spec.values()))
        kcc = get_kv_cache_configs(config, [spec], [kv_cache_bytes])[0]
        kcc.kv_cache_layout = config.cache_config.kv_cache_layout
        config.cache_config.num_gpu_blocks = kcc.num_blocks
        hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(block_size, hash_fn)
        self.block_size = block_size
        self.scheduler = Scheduler(config, kcc, StructuredOutputManager(config), block_size=block_size)
        self.connector = self.scheduler.connector
        self.requests = {}
        self.outputs = []  # the last step's EngineCoreOutput of each request

    def add(self, name, tokens, max_tokens=2, params=None, salt=None):
        from vllm import SamplingParams
        from vllm.v1.request import Request

        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                            extra_args={"kv_transfer_params": params} if params else None)
        req = Request(name, list(tokens), sp, None, cache_salt=salt, block_hasher=self.hasher)
        if params:
            req.kv_transfer_params = params
        self.scheduler.add_request(req)
        self.requests[name] = req
        return req

    def step(self, fail=None, landed=()):
        """One step: (SchedulerOutput, the connector's metadata). Every
        request whose prompt is done samples token 7; fail(metadata), when
        given, names the block ids the workers report as failed to load,
        and landed the requests whose asynchronous loads they report done."""
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        out = self.scheduler.schedule()
        meta = out.kv_connector_metadata
        ids = list(out.num_scheduled_tokens)
        sampled = [[7] if self.requests[r].num_computed_tokens >= self.requests[r].num_prompt_tokens else []
                   for r in ids]
        result = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                   sampled_token_ids=sampled,
                                   kv_connector_output=KVConnectorOutput(invalid_block_ids=set(fail(meta) if fail else ()),
                                                                     finished_recving=set(landed) or None))
        outputs = self.scheduler.update_from_output(out, result)
        self.outputs = [o for eco in outputs.values() for o in eco.outputs]
        return out, meta

    def block_ids(self, name):
        return list(self.scheduler.kv_cache_manager.get_block_ids(name)[0])

    def keys(self, tokens, salt=None):
        """The chain keys (32 bytes each) of tokens' whole blocks, as this
        engine's connector names them for rank 0."""
        from types import SimpleNamespace

        from cxltier.vllm import connector as cv

        c = self.connector
        req = SimpleNamespace(cache_salt=salt, lora_request=None, mm_features=None)
        raw = cv.block_keys(list(tokens), c._geom.block_size, cv.key_seed(c._model_id, c._geom, 0, req))
        return [raw[i:i + 32] for i in range(0, len(raw), 32)]

    def put(self, keys):
        """Stores blocks under keys as another engine would have (the
        payload is not read on this side)."""
        payload = bytes(self.connector._geom.page_bytes)
        return self.connector.index.set(list(keys), [payload] * len(keys))

    def close(self):
        self.connector.shutdown()
