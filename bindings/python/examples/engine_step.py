#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""One engine, two turns of the same prompt, driven the way a vLLM connector drives kvtier.

Turn 1 computes the prompt and offloads its KV to the host tier; the GPU prefix cache is then
reset, so turn 2 finds the prompt in the host tier and loads it back instead of recomputing.
The "GPU" here is a bytearray and the worker uses the CPU copy engine; with a CUDA KV cache,
give Layout the device tensors (torch tensors work) and pass the compute stream to
get_finished. Every comment names the connector hook the call stands for.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kvtier  # noqa: E402

BS, GPU_BLOCKS, HOST_BLOCKS, BLOCK_BYTES = 16, 64, 32, 4096


def kv_bytes(block_hash):
    """What computing a block writes: a function of its hash (so loads can be checked)."""
    return (block_hash * (BLOCK_BYTES // len(block_hash) + 1))[:BLOCK_BYTES]


class Engine:
    def __init__(self, node=None, node_name=None, remote=None):
        """node: a kvtier.Node of tier node_name; the host tier is then this replica's part of
        the tier the replicas on the node share. remote: kvtier.Remote's arguments (a dict:
        directory, space, instance, listen_host, credential, ...); the engine then joins that
        remote tier, serving its host mirror, and finds what other instances stored."""
        host = node.num_slots if node else HOST_BLOCKS
        # scheduler side
        self.gpu = kvtier.Pool(GPU_BLOCKS, block_size=BS)
        self.mgr = kvtier.OffloadManager(self.gpu, host, block_bytes=BLOCK_BYTES)
        if node:
            self.mgr.attach_node(node)
        # worker side (one rank): its KV cache, host tier and worker
        self.device = bytearray(GPU_BLOCKS * BLOCK_BYTES)
        self.layout = kvtier.Layout(GPU_BLOCKS)
        self.layout.add_buffer(self.device, BLOCK_BYTES)
        self.mirror = kvtier.Mirror(self.layout, host, node_name=node_name)
        self.worker = kvtier.Worker(self.layout, self.mirror, threads=2)
        self.remote = None
        if remote:
            self.remote = kvtier.Remote(block_bytes=0, mirror=self.mirror, **remote)
            self.mgr.attach_remote(self.remote)
            self.worker.attach_remote(self.remote, self.mgr.remote_tier)

    def step(self, preempted=False):
        meta = self.mgr.build_meta(preempted)      # build_connector_meta -> every worker
        w = self.worker
        w.bind(meta)                               # bind_connector_metadata
        w.handle_preemptions()                     # handle_preemptions
        # (the forward runs here)
        finished = w.get_finished()                # get_finished: launch copies, poll
        w.flush()                                  # (this demo waits for them)
        finished += w.get_finished()
        report = w.build_meta()                    # build_connector_worker_meta
        invalid = w.take_invalid_blocks()          # get_block_ids_with_load_errors
        w.clear()                                  # clear_connector_metadata
        self.mgr.apply_output(finished, report)    # update_connector_output
        return finished, invalid

    def turn(self, req_id, tokens):
        hashes = kvtier.hash_prompt(7, tokens, BS)
        n = len(tokens)
        gpu_hit, hit_ids = self.gpu.find_longest_hit(hashes, n - 1)
        self.gpu.touch(hit_ids)
        ext = self.mgr.match(req_id, hashes, n, gpu_hit)   # get_num_new_matched_tokens
        blocks = hit_ids + self.gpu.alloc(-(-n // BS) - len(hit_ids))
        self.mgr.after_alloc(req_id, blocks, ext)          # update_state_after_alloc
        self.mgr.schedule(req_id, blocks, gpu_hit, n - gpu_hit)
        loaded = []
        finished, invalid = self.step()
        while ext and req_id not in finished:              # async load: keep stepping
            finished, invalid = self.step()
        assert not invalid
        for b in range(gpu_hit // BS, (gpu_hit + ext) // BS):  # check what came back
            off = blocks[b] * BLOCK_BYTES
            assert self.device[off:off + BLOCK_BYTES] == kv_bytes(hashes[b]), "load corrupt"
            loaded.append(blocks[b])
        computed = gpu_hit + ext
        for b in range(computed // BS, n // BS):               # prefill the rest
            off = blocks[b] * BLOCK_BYTES
            self.device[off:off + BLOCK_BYTES] = kv_bytes(hashes[b])
            self.gpu.insert(blocks[b], hashes[b])
        self.mgr.schedule(req_id, blocks, n, 1)            # confirmed: stores go out
        self.step()
        self.mgr.request_finished(req_id, blocks, n)       # request_finished
        self.gpu.free(list(reversed(blocks)))
        while self.mgr.has_pending:
            self.step()
        return {"gpu_hit": gpu_hit, "host_hit": ext, "recomputed": n - computed,
                "loaded_blocks": len(loaded)}


def main():
    e = Engine()
    tokens = list(range(5 * BS + 3))
    first = e.turn("turn-1", tokens)
    e.gpu.reset_prefix_cache()                 # the GPU forgets the prompt
    second = e.turn("turn-2", tokens)
    stats = e.mgr.stats()
    print("turn 1:", first)
    print("turn 2:", second)
    print("stored %d blocks, loaded %d" % (stats["stores_completed"], stats["load_blocks"]))
    return first, second, stats


if __name__ == "__main__":
    main()
