#!/usr/bin/python3
"""Random-weight Q4_0 GGUF with the shape of an mlxcel checkpoint, for
tools/vs_llamacpp.sh (llama.cpp / ik_llama.cpp side by side).

    PYTHONPATH=LLAMA_SRC/gguf-py /usr/bin/python3 tools/gguf_synth.py \
        --model MLX_DIR --out MODEL.gguf

MLX_DIR is a checkpoint written by `mlxcel synth` (or any qwen2_moe /
qwen3_moe checkpoint): its config.json gives the shape (including a
--layers cut) and its tokenizer.json the vocabulary.  Quantized matrices
become Q4_0 (18 bytes per 32 weights = 4.5 bits, the bytes per weight of
MLX 4-bit with group 64 and f16 scale and bias); routers and norms F32.
Weights are random but valid (finite positive block scales); the point is
the bytes read and the arithmetic done per token, not the text.  Tensors
are generated and written one at a time, so memory stays small.  Needs
python3-numpy and the `gguf` package of the llama.cpp / ik_llama.cpp
source tree the bench binary comes from (qwen3moe needs a tree that knows
the architecture: ik_llama.cpp's, or a llama.cpp newer than April 2025).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

try:
    import gguf
except ImportError:
    sys.exit("gguf_synth: the gguf package is not importable: set PYTHONPATH=<llama.cpp tree>/gguf-py")

ARCHS = {"qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe"}
QBLOCK, QBYTES = 32, 18          # Q4_0: 32 weights in an f16 scale + 16 bytes of nibbles


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="mlxcel checkpoint folder (config.json, tokenizer.json)")
    ap.add_argument("--out", required=True, help="GGUF file to write")
    ap.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    return ap.parse_args()


def tensor_plan(c, arch):
    """(name, shape in numpy order, 'q' | 'one' | 'zero' | 'rand')."""
    d, L = c["hidden_size"], c["num_hidden_layers"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or d // nh
    ne, ff = c["num_experts"], c["moe_intermediate_size"]
    sh = c.get("shared_expert_intermediate_size", 0) if arch == "qwen2moe" else 0
    v = c["vocab_size"]
    plan = [("token_embd.weight", (v, d), "q")]
    for i in range(L):
        p = f"blk.{i}."
        plan += [(p + "attn_norm.weight", (d,), "one"),
                 (p + "attn_q.weight", (nh * hd, d), "q"),
                 (p + "attn_k.weight", (nkv * hd, d), "q"),
                 (p + "attn_v.weight", (nkv * hd, d), "q"),
                 (p + "attn_output.weight", (d, nh * hd), "q")]
        if arch == "qwen2moe":   # q/k/v carry biases
            plan += [(p + "attn_q.bias", (nh * hd,), "zero"),
                     (p + "attn_k.bias", (nkv * hd,), "zero"),
                     (p + "attn_v.bias", (nkv * hd,), "zero")]
        else:                    # per-head q/k RMS norms
            plan += [(p + "attn_q_norm.weight", (hd,), "one"),
                     (p + "attn_k_norm.weight", (hd,), "one")]
        plan += [(p + "ffn_norm.weight", (d,), "one"),
                 (p + "ffn_gate_inp.weight", (ne, d), "rand"),
                 (p + "ffn_gate_exps.weight", (ne, ff, d), "q"),
                 (p + "ffn_up_exps.weight", (ne, ff, d), "q"),
                 (p + "ffn_down_exps.weight", (ne, d, ff), "q")]
        if sh:
            plan += [(p + "ffn_gate_inp_shexp.weight", (d,), "rand"),
                     (p + "ffn_gate_shexp.weight", (sh, d), "q"),
                     (p + "ffn_up_shexp.weight", (sh, d), "q"),
                     (p + "ffn_down_shexp.weight", (d, sh), "q")]
    plan += [("output_norm.weight", (d,), "one")]
    if not c.get("tie_word_embeddings", False):
        plan += [("output.weight", (v, d), "q")]
    return plan


def nbytes(shape, kind):
    n = int(np.prod(shape))
    if kind == "q":
        if shape[-1] % QBLOCK:
            sys.exit(f"gguf_synth: a row of {shape[-1]} values is not a whole number of Q4_0 blocks")
        return n // QBLOCK * QBYTES
    return 4 * n


def make(rng, shape, kind):
    n = int(np.prod(shape))
    if kind == "q":
        nb = n // QBLOCK
        blocks = np.frombuffer(rng.bytes(nb * QBYTES), dtype=np.uint8).reshape(nb, QBYTES).copy()
        scale = rng.uniform(0.004, 0.016, size=nb).astype(np.float16)
        blocks[:, :2] = scale.view(np.uint8).reshape(nb, 2)
        return blocks.reshape(-1)
    if kind == "one":
        return np.ones(n, dtype=np.float32)
    if kind == "zero":
        return np.zeros(n, dtype=np.float32)
    return rng.normal(0.0, 0.02, size=n).astype(np.float32)


def add_tokenizer(w, tok_path, vocab_size, c):
    tj = json.load(open(tok_path, encoding="utf-8"))
    byid = {i: s for s, i in tj["model"]["vocab"].items()}
    special = set()
    for t in tj.get("added_tokens", []):
        byid[t["id"]] = t["content"]
        if t.get("special"):
            special.add(t["id"])
    tokens, types = [], []
    for i in range(vocab_size):
        if i in byid:
            tokens.append(byid[i])
            types.append(gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"].get("merges", [])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id),
                     ("pad_token_id", w.add_pad_token_id)):
        if isinstance(c.get(key), int):
            add(c[key])
    w.add_add_bos_token(False)


def main():
    a = parse()
    cfg_path = os.path.join(a.model, "config.json")
    try:
        c = json.load(open(cfg_path, encoding="utf-8"))
    except (OSError, ValueError) as e:
        sys.exit(f"gguf_synth: {cfg_path}: {e}")
    c = c.get("text_config", c)
    arch = ARCHS.get(c.get("model_type"))
    if arch is None:
        sys.exit(f"gguf_synth: {cfg_path}: model_type {c.get('model_type')!r} not supported "
                 f"(supported: {', '.join(ARCHS)})")
    plan = tensor_plan(c, arch)
    rng = np.random.default_rng(a.seed)

    w = gguf.GGUFWriter(a.out, arch)
    w.add_name(f"random Q4_0 with the shape of {os.path.basename(os.path.abspath(a.model))}")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    d, nh = c["hidden_size"], c["num_attention_heads"]
    hd = c.get("head_dim") or d // nh
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(min(int(c.get("max_position_embeddings", 4096)), 32768))
    w.add_embedding_length(d)
    w.add_feed_forward_length(c.get("intermediate_size", c["moe_intermediate_size"]))
    w.add_head_count(nh)
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(float(c.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(c.get("rms_norm_eps", 1e-6)))
    w.add_expert_count(c["num_experts"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    if arch == "qwen2moe":
        w.add_expert_shared_feed_forward_length(c.get("shared_expert_intermediate_size", 0))
    add_tokenizer(w, os.path.join(a.model, "tokenizer.json"), c["vocab_size"], c)

    for name, shape, kind in plan:
        w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes(shape, kind),
                          raw_dtype=gguf.GGMLQuantizationType.Q4_0 if kind == "q"
                          else gguf.GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    total, t0 = 0, time.time()
    for k, (name, shape, kind) in enumerate(plan):
        data = make(rng, shape, kind)
        w.write_tensor_data(data)
        total += data.nbytes
        if sys.stderr.isatty() or k % 25 == 0 or k + 1 == len(plan):
            print(f"\rgguf_synth: {k + 1}/{len(plan)} tensors, {total / 1e9:.2f} GB, "
                  f"{time.time() - t0:.0f} s", end="\n" if not sys.stderr.isatty() else "",
                  file=sys.stderr, flush=True)
    w.close()
    print(f"\ngguf_synth: wrote {a.out}: {len(plan)} tensors, {total} bytes of tensor data",
          file=sys.stderr)


if __name__ == "__main__":
    main()
