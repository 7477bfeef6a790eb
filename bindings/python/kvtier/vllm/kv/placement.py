# SPDX-License-Identifier: Apache-2.0
"""What vLLM chose that kvtier must follow: where each rank's KV cache lies (the
regions), the cache groups and their hashes, how many host blocks the configured bytes hold, and
the digest instances sharing blocks must agree on."""
import ctypes

from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec

from ... import _lib as L
from ...offload import OffloadManager
from .._config import ConfigError

_lib = L.lib


def _tokens_per_step(vllm_config):
    """The most tokens a decoding request computes in one step: one, plus the speculative
    tokens checked with it."""
    spec = getattr(vllm_config, "speculative_config", None)
    return 1 + int(getattr(spec, "num_speculative_tokens", 0) or 0)


def kv_regions(kv_cache_config):
    """[(layer_name, byte offset into its backing storage, block_bytes)] of every distinct
    region of equally strided blocks, from KVCacheConfig.kv_cache_tensors (vLLM places all of a
    rank's tensors in one backing allocation; layer-outermost tensors give a region per layer,
    block-outermost ones a single region whose block spans all layers)."""
    nb = kv_cache_config.num_blocks
    seen, out = set(), []
    # a tensor that only layers of groups that are not prefix-cacheable use (scratch, ring)
    # never moves: the host tier's bytes per block exclude it
    skip = _uncacheable_layers(kv_cache_config)
    for t in kv_cache_config.kv_cache_tensors:
        if not t.layers or all(name in skip for name in t.layers):
            continue
        bb = t.block_stride
        span_blocks = nb * bb
        if bb <= 0:
            raise ConfigError("kvtier: KV cache tensor of %s has block_stride %d" % (t.layers, bb))
        if t.layer_stride >= span_blocks:
            start, span = t.offset, len(t.layers) * t.layer_stride
        else:
            start, span = 0, span_blocks
        n = span // span_blocks
        per_layer = max(1, n // len(t.layers)) if t.layer_stride >= span_blocks else n
        for i in range(n):
            off = start + i * span_blocks
            if off in seen:
                continue
            seen.add(off)
            layer = t.layers[min(i // per_layer, len(t.layers) - 1)]
            out.append((layer, off, bb))
    return out


def _cacheable_group_ids(kv_cache_config):
    groups = kv_cache_config.kv_cache_groups
    return set(getattr(kv_cache_config, "prefix_cacheable_group_ids", range(len(groups))))


def _uncacheable_layers(kv_cache_config):
    ids = _cacheable_group_ids(kv_cache_config)
    return {name for g, grp in enumerate(kv_cache_config.kv_cache_groups) if g not in ids
            for name in grp.layer_names}


def block_bytes_per_rank(kv_cache_config):
    """Bytes one block occupies on a rank, over all its regions."""
    return sum(bb for _, _, bb in kv_regions(kv_cache_config))


def _hash_len(vllm_config):
    algo = getattr(vllm_config.cache_config, "prefix_caching_hash_algo", "sha256")
    if algo.startswith("sha256"):
        return 32
    if algo.startswith("xxhash"):
        return 16
    raise ConfigError("kvtier: prefix_caching_hash_algo %r is not supported" % algo)


def _group_kind(g, spec, cacheable):
    """(kvt_group_kind, sliding window) of vLLM KV cache group g with spec `spec`."""
    if not cacheable:  # never stored, loaded or searched (spec §2.14)
        ring = type(spec).__name__ == "CircularBufferSpec"
        return (L.GROUP_RING if ring else L.GROUP_SCRATCH), 0
    if isinstance(spec, SlidingWindowSpec):
        return L.GROUP_SLIDING, spec.sliding_window
    if isinstance(spec, MambaSpec):
        # "all": a state in every block, stored by position. "align" (vLLM's default with
        # prefix caching): states only at boundaries, in blocks whose table position is not
        # stable, so never stored by position (kvt_offload_boundary_states hands them over;
        # vLLM has no hook for that yet, so such a group is not offloaded: no wrong state)
        all_mode = getattr(spec, "mamba_cache_mode", "all") == "all"
        return (L.GROUP_MAMBA if all_mode else L.GROUP_MAMBA_ALIGN), 0
    if isinstance(spec, FullAttentionSpec):
        return L.GROUP_FULL, 0
    raise ConfigError("kvtier: KV cache group %d has spec %s, which is not supported"
                      % (g, type(spec).__name__))


def _group_specs(kv_cache_config, vllm_config):
    """kvt_pool_config for vLLM's GPU pool: groups, block sizes, hash block size."""
    from vllm.v1.core.kv_cache_utils import (resolve_dcp_kv_block_size,
                                             resolve_kv_cache_block_sizes)
    sched_bs, hash_bs = resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    par = vllm_config.parallel_config
    dcp = par.decode_context_parallel_size
    cfg = L.kvt_pool_config()
    _lib.kvt_pool_config_init(ctypes.byref(cfg))
    groups = kv_cache_config.kv_cache_groups
    if not groups or len(groups) > L.MAX_GROUPS:
        raise ConfigError("kvtier: %d KV cache groups (1..%d supported)"
                          % (len(groups), L.MAX_GROUPS))
    cacheable = _cacheable_group_ids(kv_cache_config)
    for g, grp in enumerate(groups):
        spec = grp.kv_cache_spec
        gs = cfg.groups[g]
        # as the scheduler sees it: attention blocks spread over the decode context-parallel
        # ranks are dcp times larger, Mamba states are whole on every rank
        gs.block_size = resolve_dcp_kv_block_size(spec, dcp)
        gs.kind, gs.sliding_window = _group_kind(g, spec, g in cacheable)
    cfg.n_groups = len(groups)
    cfg.dcp_world_size = dcp
    cfg.pcp_world_size = getattr(par, "prefill_context_parallel_size", 1)
    cfg.num_blocks = kv_cache_config.num_blocks
    cfg.hash_len = _hash_len(vllm_config)
    cfg.hash_block_size = hash_bs
    cfg.scheduler_block_size = sched_bs
    got = L.c_u32()
    rc = _lib.kvt_pool_config_validate(ctypes.byref(cfg), ctypes.byref(got))
    if rc < 0:
        raise ConfigError("kvtier: vLLM's KV cache layout: %s"
                          % _lib.kvt_last_error().decode(errors="replace"))
    return cfg


def host_blocks_for(cfg, kv_cache_config):
    """Host-tier (or disk-only) blocks per rank: the same number on the scheduler and every
    worker, from the configured bytes and the bytes one block occupies on a rank."""
    bpr = block_bytes_per_rank(kv_cache_config)
    n = cfg.tier_bytes_per_rank // bpr if bpr else 0
    if n < 2:
        key = "disk_capacity_bytes" if cfg.backend == "disk" else "cpu_bytes_to_use(_per_rank)"
        raise ConfigError("kvtier: %s gives %d bytes per rank, %d host_blocks of %d bytes; at "
                          "least 2 are needed (block 0 is the null block)"
                          % (key, cfg.tier_bytes_per_rank, n, bpr))
    return OffloadManager.size_host(cfg.tier_bytes_per_rank, bpr)


def _signature(vllm_config, gcfg):
    """Digest of what instances sharing KV blocks must agree on besides the hash seed."""
    import hashlib
    v = vllm_config
    groups = tuple((gcfg.groups[g].kind, gcfg.groups[g].block_size)
                   for g in range(gcfg.n_groups))
    return hashlib.sha256(repr((str(v.model_config.model), str(v.model_config.dtype),
                                str(v.cache_config.prefix_caching_hash_algo), groups,
                                gcfg.hash_block_size)).encode()).digest()


def _hash_seed(vllm_config=None):
    """vLLM's hash seed as a fingerprint: the first 8 bytes of its root hash (NONE_HASH). In a
    worker process, where vLLM does not set NONE_HASH, it is derived as the engine core derives
    it (the same value whenever it is reproducible across processes: PYTHONHASHSEED set, or a
    cryptographic hash)."""
    from vllm.v1.core import kv_cache_utils
    h = getattr(kv_cache_utils, "NONE_HASH", None)
    if h is None and vllm_config is not None:
        from vllm.utils.hashing import get_hash_fn_by_name
        fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
        h = fn(kv_cache_utils.resolve_none_hash_seed(fn))
    return int.from_bytes(bytes(h)[:8], "little")
