# SPDX-License-Identifier: Apache-2.0
"""A small Llama written to a local folder: config.json and seeded weights (safetensors).

Nothing is downloaded. vLLM loads the folder like any checkpoint (load_format="safetensors",
skip_tokenizer_init=True, prompts as token ids). The weights are random but scaled so that the
next token depends on the whole context: with vLLM's dummy weights every prompt decodes the same
two tokens, which would make "identical tokens" prove nothing. Every rank and every run of the
same size gets the same bytes (one torch.Generator, fixed seed).
"""
import json
import math
import os

import torch
from safetensors.torch import save_file


def write_model(path, layers=2, hidden=256, heads=4, kv_heads=2, ffn=512, vocab=2048,
                max_positions=8192, seed=1234):
    """Writes the model to path (created) unless the same one is already there; returns path."""
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": hidden, "intermediate_size": ffn, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "num_hidden_layers": layers, "vocab_size": vocab,
        "max_position_embeddings": max_positions, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "torch_dtype": "float32", "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2, "kvtier_seed": seed,
    }
    os.makedirs(path, exist_ok=True)
    cfg_path = os.path.join(path, "config.json")
    weights = os.path.join(path, "model.safetensors")
    if os.path.exists(weights) and os.path.exists(cfg_path):
        with open(cfg_path) as f:
            if json.load(f) == cfg:
                return path
    g = torch.Generator().manual_seed(seed)
    head = hidden // heads

    def mat(rows, cols, scale=1.0):
        return (torch.randn(rows, cols, generator=g) * (scale / math.sqrt(cols))).contiguous()

    sd = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=g),
          "model.norm.weight": torch.ones(hidden),
          "lm_head.weight": mat(vocab, hidden, 4.0)}
    for i in range(layers):
        p = "model.layers.%d." % i
        sd[p + "self_attn.q_proj.weight"] = mat(heads * head, hidden, 2.0)
        sd[p + "self_attn.k_proj.weight"] = mat(kv_heads * head, hidden, 2.0)
        sd[p + "self_attn.v_proj.weight"] = mat(kv_heads * head, hidden)
        sd[p + "self_attn.o_proj.weight"] = mat(hidden, heads * head)
        sd[p + "mlp.gate_proj.weight"] = mat(ffn, hidden)
        sd[p + "mlp.up_proj.weight"] = mat(ffn, hidden)
        sd[p + "mlp.down_proj.weight"] = mat(hidden, ffn)
        sd[p + "input_layernorm.weight"] = torch.ones(hidden)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(hidden)
    save_file(sd, weights + ".tmp")
    os.replace(weights + ".tmp", weights)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=1)
    return path
