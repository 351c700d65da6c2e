#!/usr/bin/env python3
"""CPU checks of the training recipe's parts that must be exact:

1. the vectorised torch quantizer gives byte-identical words, scales and
   biases to the pure-Python reference (float32 emulated), for 4 and 8 bits;
   dequantization inverts packing (pure-Python and torch unpackers agree);
2. the safetensors writer/reader round-trips;
3. model.py, loaded through export_mlx.load_dequantized, reproduces the
   logits, router logits and greedy ids that Hugging Face transformers
   computed for the reference fixtures (qwen2_moe_tiny_chat: per-expert
   layout, top-4 unnormalised, MHA, untied; qwen2_moe_gqa_mixed: stacked,
   GQA, top-4 renormalised, tied, 6-bit experts, bf16 scales), so the model
   trained and evaluated here is the qwen2_moe that mlxcel runs;
4. export -> load_dequantized returns the quantized weights of a random
   model, under mlx-lm's names and shapes.

Needs torch (any version >= 1.13) and numpy; the fixtures from
MLXCEL_FIXTURES (skipped with a message when unset).
Run: python3 tools/train/test_export.py
"""
import json
import os
import random
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_mlx as X  # noqa: E402
import model as M  # noqa: E402

FAILS = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        FAILS.append(what)


def test_quantizer():
    g = torch.Generator().manual_seed(1)
    rows = torch.randn(6, 256, generator=g) * 0.05
    rows[1] += 0.3                     # all positive: max dominates, negative scale
    rows[2] -= 0.3                     # all negative
    rows[3, :64] = 0.0                 # a zero group (q0 == 0 branch)
    rows[4, 64:128] = 0.125            # a constant group
    rows[5, ::7] *= 40                 # outliers
    for bits in (4, 8):
        wq, s, b = X.quantize_torch(rows, bits, 64)
        W, S, B = X.quantize_rows_py(rows.tolist(), bits, 64)
        same_w = wq.tolist() == W
        same_s = [[X.f16_bits(v) for v in r] for r in s.float().tolist()] == S
        same_b = [[X.f16_bits(v) for v in r] for r in b.float().tolist()] == B
        check(same_w and same_s and same_b, f"torch quantizer == pure-Python reference ({bits} bits)")
        deq = X.dequantize_torch(wq, s, b, bits, 64)
        ref = torch.tensor([X.dequantize_row_py(W[i], S[i], B[i], bits, 64, 256) for i in range(6)])
        check(torch.equal(deq, ref.float()), f"torch and pure-Python dequantization agree ({bits} bits)")
        err = (deq - rows).abs().reshape(6, 4, 64).amax(-1)
        step = s.float().abs()
        # within one step: half a step of rounding, and MLX's rescaling that
        # makes 0.0 exact can clip the far extreme by up to about a step
        check(bool((err <= step * 1.0 + 1e-6).all()),
              f"dequantized within one step of the original ({bits} bits)")
        check(bool((s.float() < 0).any()) and bool((s.float() > 0).any()),
              f"both signs of scale occur ({bits} bits)")
    # any-width unpacking (6 bits straddles words)
    rnd = random.Random(3)
    q = [rnd.randrange(64) for _ in range(64)]
    words, acc, nbits = [], 0, 0
    for v in q:
        acc |= v << nbits
        nbits += 6
    words = [(acc >> (32 * i)) & 0xFFFFFFFF for i in range(6 * 64 // 32)]
    check(X.unpack_row_py(words, 6, 64) == q, "pure-Python 6-bit unpack")
    t = X.dequantize_torch(torch.tensor([words]), torch.ones(1, 1), torch.zeros(1, 1), 6, 64)
    check(t[0].tolist() == [float(v) for v in q], "torch 6-bit unpack")


def test_safetensors():
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "t.safetensors")
        t = {"b": ("F16", (3,), b"\x00\x3c" * 3), "a": ("U32", (2, 2), bytes(range(16))),
             "c": ("F32", (1,), b"\x00\x00\x80\x3f")}
        X.write_safetensors(p, t, {"format": "mlx"})
        r, meta = X.read_safetensors(p)
        check(r == t and meta == {"format": "mlx"}, "safetensors round trip")
        with open(p, "rb") as f:
            hl = int.from_bytes(f.read(8), "little")
        check(hl % 8 == 0, "safetensors header padded to 8 bytes")


def run_fixture(fx_dir):
    cfg_dict, state = X.load_dequantized(fx_dir)
    cfg = M.Cfg(**cfg_dict)
    model = M.Qwen2Moe(cfg)
    missing, unexpected = model.load_state_dict(state, strict=False)
    check(not missing and not unexpected,
          f"{os.path.basename(fx_dir)}: every tensor maps (missing {missing[:3]}, unexpected {unexpected[:3]})")
    model.eval()
    ref, _ = X.read_safetensors(os.path.join(fx_dir, "reference.safetensors"))
    T = lambda n: X.raw_to_torch(*ref[n]) if ref[n][0] != "I32" else torch.tensor(
        list(memoryview(ref[n][2]).cast("i")), dtype=torch.int64).reshape(ref[n][1])
    ids = T("prompt_ids")
    with torch.no_grad():
        logits, routers = model(ids[None], exact=True)
    logits = logits[0]
    last = T("prefill_last_logits")
    d_last = (logits[-1] - last).abs().max().item()
    top_ids, top_lg = T("prefill_top32_ids"), T("prefill_top32_logits")
    d_top = (logits.gather(1, top_ids) - top_lg).abs().max().item()
    d_rt = max((routers[l] - T(f"router_logits.{l}")).abs().max().item() for l in range(len(routers)))
    name = os.path.basename(fx_dir)
    check(d_last < 1e-3 and d_top < 1e-3, f"{name}: prefill logits within 1e-3 (last {d_last:.2e}, top32 {d_top:.2e})")
    check(d_rt < 1e-4, f"{name}: router logits within 1e-4 ({d_rt:.2e})")
    # greedy by cacheless re-forward, compared where HF's margin is clear
    greedy, margin = T("greedy_ids"), T("greedy_margin")
    seq = ids.tolist()
    ok = True
    with torch.no_grad():
        for i in range(len(greedy)):
            nxt = int(model(torch.tensor([seq]), exact=True)[0][0, -1].argmax())
            if nxt != int(greedy[i]):
                ok = margin[i].item() < 1e-3
                break
            seq.append(nxt)
    check(ok, f"{name}: greedy ids equal HF's ({len(greedy)} steps)")


def test_fixtures():
    root = os.environ.get("MLXCEL_FIXTURES")
    if not root:
        print("skip fixtures: MLXCEL_FIXTURES is unset (set it to the reference fixtures folder)")
        return
    for name in ("qwen2_moe_tiny_chat", "qwen2_moe_gqa_mixed"):
        run_fixture(os.path.join(root, name))


def test_export_roundtrip():
    cfg_dict = dict(vocab_size=320, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                    moe_intermediate_size=64, shared_expert_intermediate_size=128,
                    intermediate_size=128, norm_topk_prob=False, rms_norm_eps=1e-6,
                    rope_theta=10000.0, tie_word_embeddings=False)
    torch.manual_seed(0)
    m = M.Qwen2Moe(M.Cfg(**cfg_dict))
    m.init_weights()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("norm.weight") or n.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)
    sd = m.state_dict()
    with tempfile.TemporaryDirectory() as d:
        X.export(sd, cfg_dict, d)
        raw, meta = X.read_safetensors(os.path.join(d, "model.safetensors"))
        check(meta == {"format": "mlx"}, "export: mlx metadata")
        e = raw["model.layers.1.mlp.switch_mlp.down_proj.weight"]
        check(e[0] == "U32" and e[1] == (4, 128, 64 * 4 // 32), f"export: stacked down_proj {e[:2]}")
        g = raw["model.layers.0.mlp.gate.weight"]
        check(g[1] == (4, 128 * 8 // 32), f"export: router at 8 bits {g[1]}")
        sg = raw["model.layers.0.mlp.shared_expert_gate.scales"]
        check(sg[0] == "F16" and sg[1] == (1, 2), f"export: shared_expert_gate scales {sg[:2]}")
        check(raw["model.norm.weight"][0] == "F16", "export: norms f16")
        with open(os.path.join(d, "config.json")) as f:
            c = json.load(f)
        check(c["quantization"] == c["quantization_config"]
              and c["quantization"]["model.layers.1.mlp.shared_expert_gate"] == {"group_size": 64, "bits": 8},
              "export: quantization block with router overrides")
        _, st = X.load_dequantized(d)
        worst = 0.0
        for n, t in sd.items():
            bits = 8 if n.endswith(("mlp.gate.weight", "shared_expert_gate.weight")) else 4
            if t.dim() >= 2:
                wq, s, b = X.quantize_torch(t, bits, 64)
                want = X.dequantize_torch(wq, s, b, bits, 64)
            else:
                want = t.half().float()
            worst = max(worst, (st[n] - want).abs().max().item())
        check(worst == 0.0 and set(st) == set(sd), "export -> load_dequantized is exact, all names")


def main():
    test_quantizer()
    test_safetensors()
    test_export_roundtrip()
    test_fixtures()
    print(f"{len(FAILS)} failed")
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
