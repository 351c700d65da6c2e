#!/usr/bin/env python3
"""End-to-end recipe of models/kjv-moe: tokenizer, model, training, MLX export,
reference evaluation.  Runs on one CUDA GPU in a few minutes (README.md beside
this file has the commands and the numbers of the shipped run).

  python3 tools/train/prepare_data.py .train-data          # the corpus (no GPU)
  python3 tools/train/train.py --data .train-data --out models/kjv-moe

Steps:
 1. byte-level BPE tokenizer (HF `tokenizers`, Qwen2 structure: NFC, the
    Qwen2 split regex then ByteLevel, ByteLevel decoder) trained on train.txt;
    special tokens <|endoftext|> (EOS), <|im_start|>, <|im_end|>.
 2. a qwen2_moe model (model.py) trained on train.txt: random windows of
    --ctx tokens, AdamW, warmup + cosine, bf16 autocast, dropout, the
    Switch-Transformer load-balancing loss; the checkpoint with the lowest
    loss on valid.txt is kept (heldout.txt is only logged, never used to
    choose anything).
 3. MLX export (export_mlx.py): 4-bit group-64 affine quantization, routers
    at 8 bits, mlx-lm's names, config/tokenizer/generation configs.
 4. reference numbers on exactly the exported weights, dequantized to
    float32: held-out perplexity in llama-perplexity's manner (--eval-ctx
    chunks from an empty cache, the second half of each chunk scored) and
    the greedy continuation of "And God said".  Computed with transformers'
    Qwen2MoeForCausalLM when transformers is installed (and cross-checked
    against model.py), else with model.py.

--byte-tokenizer replaces step 1 by a plain byte-level vocabulary (no
merges, no `tokenizers` needed): for checking the pipeline on a CPU.
"""
import argparse
import json
import math
import os
import re
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_mlx as X  # noqa: E402
import model as M  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LOG = []
T0 = time.time()


def log(msg):
    line = f"[{time.time() - T0:7.1f}s] {msg}"
    print(line, flush=True)
    LOG.append(line)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


# --------------------------------------------------------------------------
# 1. tokenizer


def train_tokenizer(train_text, vocab_size, out_dir):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    chapters = [c + "\n\n" for c in train_text.split("\n\n")]
    tok.train_from_iterator(chapters, trainer=trainer)
    path = os.path.join(out_dir, "tokenizer.json")
    tok.save(path)
    return path


def hf_encoder(path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def bytes_to_unicode():
    """GPT-2's byte -> printable character table (byte-level BPE's alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def byte_tokenizer(out_dir):
    """A byte-level BPE tokenizer.json with no merges (ids = specials, then
    the 256 bytes): the same JSON structure as the trained one."""
    import unicodedata

    b2u = bytes_to_unicode()
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for b in range(256):
        vocab[b2u[b]] = len(SPECIALS) + b
    tj = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, s in enumerate(SPECIALS)],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": []},
    }
    path = os.path.join(out_dir, "tokenizer.json")
    X.write_json(path, tj)
    enc = lambda text: [len(SPECIALS) + b for b in unicodedata.normalize("NFC", text).encode()]
    return path, enc


def write_tokenizer_configs(out_dir, ctx_max):
    X.write_json(os.path.join(out_dir, "tokenizer_config.json"), {
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": ctx_max,
        "tokenizer_class": "Qwen2Tokenizer",
        "errors": "replace",
        "split_special_tokens": False,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {str(i): {"content": s, "special": True, "normalized": False,
                                          "lstrip": False, "rstrip": False, "single_word": False}
                                 for i, s in enumerate(SPECIALS)},
    })
    X.write_json(os.path.join(out_dir, "generation_config.json"),
                 {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0})


# --------------------------------------------------------------------------
# 2. model and training


def model_config(a, vocab):
    return {
        "architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe",
        "vocab_size": vocab,
        "hidden_size": a.hidden,
        "intermediate_size": a.shared_inter,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.heads,
        "rms_norm_eps": 1e-6,
        "rope_theta": a.rope_theta,
        "max_position_embeddings": a.max_pos,
        "tie_word_embeddings": False,
        "decoder_sparse_step": 1,
        "moe_intermediate_size": a.moe_inter,
        "shared_expert_intermediate_size": a.shared_inter,
        "num_experts_per_tok": a.topk,
        "num_experts": a.experts,
        "norm_topk_prob": False,
        "mlp_only_layers": [],
        "hidden_act": "silu",
        "qkv_bias": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": a.layers,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "router_aux_loss_coef": a.aux_coef,
        "output_router_logits": False,
        "use_cache": True,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "torch_dtype": "float16",
    }


def windows(ids, T):
    """Non-overlapping [n, T+1] windows (inputs and next-token targets)."""
    n = (len(ids) - 1) // T
    return torch.stack([ids[i * T:i * T + T + 1] for i in range(n)])


def batched_loss(model, wins, dev, amp, bs=32):
    """Mean next-token loss over all positions of the windows."""
    model.eval()
    tot, cnt = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(wins), bs):
            w = wins[i:i + bs].to(dev)
            with amp():
                logits, _ = model(w[:, :-1], dense=True)
            l = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1),
                                reduction="sum")
            tot += l.item()
            cnt += w[:, 1:].numel()
    model.train()
    return tot / max(cnt, 1)


def expert_usage(model, wins, dev, amp, E, k):
    """Share of routed slots per expert, per layer, on the given windows."""
    model.eval()
    counts = None
    with torch.no_grad():
        for i in range(0, len(wins), 32):
            with amp():
                _, routers = model(wins[i:i + 32, :-1].to(dev), dense=True)
            c = torch.stack([F.one_hot(r.float().topk(k, -1).indices, E).sum((0, 1)) for r in routers])
            counts = c if counts is None else counts + c
    model.train()
    return (counts.float() / counts.sum(1, keepdim=True)).cpu()


def train(a, cfg, data, dev):
    torch.manual_seed(a.seed)
    model = M.Qwen2Moe(M.Cfg(**cfg)).to(dev)
    model.init_weights()
    n_params = sum(p.numel() for p in model.parameters())
    E, k = cfg["num_experts"], cfg["num_experts_per_tok"]
    per_expert = 3 * cfg["hidden_size"] * cfg["moe_intermediate_size"] * cfg["num_hidden_layers"]
    active = n_params - per_expert * (E - k)
    log(f"model: {n_params / 1e6:.2f} M parameters, {active / 1e6:.2f} M active per token")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    extra = {"fused": True} if dev.type == "cuda" else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, **extra)
    use_amp = dev.type == "cuda"
    amp = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if use_amp else \
        (lambda: torch.autocast("cpu", enabled=False))

    train_ids = data["train"].to(dev)
    valid_w, held_w = windows(data["valid"], a.ctx), windows(data["heldout"], a.ctx)
    T, B = a.ctx, a.batch
    gen = torch.Generator(device="cpu").manual_seed(a.seed)
    offs = torch.arange(T + 1, device=dev)
    tokens_per_epoch = len(data["train"])
    log(f"train: {tokens_per_epoch} tokens, {B}x{T} tokens a step, {a.steps} steps = "
        f"{a.steps * B * T / tokens_per_epoch:.1f} epochs; valid {len(valid_w)} and held-out "
        f"{len(held_w)} windows")

    def lr_at(s):
        if s < a.warmup:
            return a.lr * (s + 1) / a.warmup
        p = (s - a.warmup) / max(1, a.steps - a.warmup)
        return a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))

    best = (float("inf"), -1, None)
    curve = []
    t_start = time.time()
    run_loss = run_aux = 0.0
    run_n = 0
    model.train()
    step = 0
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        starts = torch.randint(0, len(train_ids) - T - 1, (B,), generator=gen).to(dev)
        w = train_ids[starts[:, None] + offs]
        with amp():
            logits, routers = model(w[:, :-1], dense=True, dropout=a.dropout)
            ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1))
            aux = M.load_balancing_loss(routers, E, k)
            loss = ce + a.aux_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        run_loss = run_loss + ce.detach()   # summed on the device: no sync each step
        run_aux = run_aux + aux.detach()
        run_n += 1
        last = step == a.steps - 1
        elapsed = time.time() - t_start
        if (step + 1) % a.eval_every == 0 or last or elapsed > a.max_train_seconds:
            vl = batched_loss(model, valid_w, dev, amp)
            hl = batched_loss(model, held_w, dev, amp)
            tl = float(run_loss) / max(run_n, 1)
            ta = float(run_aux) / max(run_n, 1)
            tps = (step + 1) * B * T / elapsed
            curve.append({"step": step + 1, "train": round(tl, 4), "valid": round(vl, 4),
                          "heldout": round(hl, 4), "aux": round(ta, 4),
                          "lr": lr_at(step), "seconds": round(elapsed, 1)})
            mark = ""
            if vl < best[0]:
                best = (vl, step + 1, {n: t.detach().cpu().clone() for n, t in model.state_dict().items()})
                mark = " *"
            log(f"step {step + 1:5d}  train {tl:.4f}  aux {ta:.3f}  valid {vl:.4f}  "
                f"heldout {hl:.4f}  lr {lr_at(step):.2e}  {tps / 1e3:.0f}k tok/s{mark}")
            run_loss = run_aux = 0.0
            run_n = 0
            if elapsed > a.max_train_seconds and not last:
                log(f"stopping: the training time cap of {a.max_train_seconds} s is reached")
                break
    train_seconds = time.time() - t_start
    log(f"training: {step + 1} steps in {train_seconds:.1f} s; best valid {best[0]:.4f} at step {best[1]}")
    model.load_state_dict(best[2])
    usage = expert_usage(model, valid_w, dev, amp, E, k)
    log("expert usage on valid (share of routed slots, per layer): " +
        " | ".join(" ".join(f"{v:.2f}" for v in row) for row in usage.tolist()))
    summary = {"parameters": n_params, "active_parameters": active, "steps_run": step + 1,
               "train_seconds": round(train_seconds, 1), "best_step": best[1],
               "best_valid_loss": round(best[0], 4),
               "train_loss_at_best": next((c["train"] for c in curve if c["step"] == best[1]), None),
               "heldout_loss_at_best": next((c["heldout"] for c in curve if c["step"] == best[1]), None),
               "expert_usage_valid": [[round(v, 3) for v in row] for row in usage.tolist()],
               "curve": curve}
    return best[2], summary


# --------------------------------------------------------------------------
# 4. reference evaluation


def ppl_stats(nll):
    """llama-perplexity's numbers from the per-token NLLs (float64)."""
    nll = nll.double()
    N = nll.numel()
    mean = nll.mean().item()
    mean2 = (nll * nll).mean().item()
    s = math.sqrt(max(mean2 - mean * mean, 0.0) / (N - 1))
    ppl = math.exp(mean)
    return {"tokens_scored": N, "mean_nll": mean, "ppl": ppl, "ppl_err": ppl * s}


def chunk_nll(logits_fn, ids, C, dev, bs=8):
    """Per-token NLLs: chunks of C tokens from an empty cache, positions
    j in [C/2, C-1) scored against token j+1."""
    n_chunks = len(ids) // C
    first = C // 2
    out = []
    with torch.no_grad():
        for i in range(0, n_chunks, bs):
            c = torch.stack([ids[j * C:(j + 1) * C] for j in range(i, min(i + bs, n_chunks))]).to(dev)
            lg = logits_fn(c).float()
            lp = torch.log_softmax(lg[:, first:C - 1], dim=-1)
            tgt = c[:, first + 1:C]
            out.append(-lp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1).reshape(-1).cpu())
    return torch.cat(out), n_chunks


def greedy(logits_fn, prompt_ids, n, dev):
    """Greedy continuation by cacheless re-forward; with each step's margin."""
    seq, out, margins = list(prompt_ids), [], []
    with torch.no_grad():
        for _ in range(n):
            lg = logits_fn(torch.tensor([seq], device=dev))[0, -1].float()
            top = lg.topk(2)
            out.append(int(top.indices[0]))
            margins.append(float(top.values[0] - top.values[1]))
            seq.append(out[-1])
    return out, margins


def hf_model(cfg, state, dev):
    """transformers' Qwen2MoeForCausalLM with our state (float32), whatever
    expert layout the installed version uses."""
    import transformers
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    c = {k: v for k, v in cfg.items() if k not in ("quantization", "quantization_config", "architectures",
                                                    "model_type", "torch_dtype")}
    c["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg["rope_theta"]}
    hc = Qwen2MoeConfig(**c)
    for attr in ("_attn_implementation", "_experts_implementation"):
        try:   # the plain loops; any backend computes the same in float32
            setattr(hc, attr, "eager")
        except Exception:  # noqa: BLE001 - a version without the setting keeps its default
            pass
    m = Qwen2MoeForCausalLM(hc).float()
    new = {}
    for key, v in m.state_dict().items():
        if key in state:
            new[key] = state[key]
            continue
        mm = re.match(r"(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$", key)
        if mm:
            new[key] = state[f"{mm[1]}.{mm[3]}_proj"][int(mm[2])]
            continue
        mm = re.match(r"(.*\.mlp\.experts)\.(gate_up_proj|down_proj)(\.weight)?$", key)
        if mm:
            if mm[2] == "gate_up_proj":
                t = torch.cat([state[mm[1] + ".gate_proj"], state[mm[1] + ".up_proj"]], dim=1)
            else:
                t = state[mm[1] + ".down_proj"]
            if tuple(v.shape) == tuple(t.shape):
                new[key] = t
            elif tuple(v.shape) == tuple(t.transpose(1, 2).shape):
                new[key] = t.transpose(1, 2).contiguous()
            else:
                raise ValueError(f"{key}: shape {tuple(v.shape)} fits neither {tuple(t.shape)} nor its transpose")
            continue
        raise KeyError(f"no source for transformers parameter {key}")
    m.load_state_dict(new, strict=True)
    return m.to(dev).eval(), transformers.__version__


def evaluate(a, out_dir, heldout_ids, prompt_ids, dev):
    if dev.type == "cuda":   # true float32 matmuls for the reference
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    cfg, state = X.load_dequantized(out_dir)
    ours = M.Qwen2Moe(M.Cfg(**cfg))
    ours.load_state_dict(state, strict=True)
    ours = ours.float().to(dev).eval()
    ours_fn = lambda ids: ours(ids, exact=True)[0]
    nll_ours, n_chunks = chunk_nll(ours_fn, heldout_ids, a.eval_ctx, dev)
    st_ours = ppl_stats(nll_ours)
    g_ours, m_ours = greedy(ours_fn, prompt_ids, a.greedy_n, dev)
    log(f"reference (model.py, f32, dequantized): PPL {st_ours['ppl']:.4f} +/- {st_ours['ppl_err']:.4f} "
        f"over {st_ours['tokens_scored']} tokens in {n_chunks} chunks; greedy {g_ours}")
    by = f"PyTorch {torch.__version__} float32 on the dequantized exported weights (tools/train/model.py)"
    st, g, margins, hf_info = st_ours, g_ours, m_ours, {"used": False}
    if not a.no_hf:
        try:
            hf, tv = hf_model(cfg, state, dev)
            hf_fn = lambda ids: hf(input_ids=ids).logits
            nll_hf, _ = chunk_nll(hf_fn, heldout_ids, a.eval_ctx, dev)
            st_hf = ppl_stats(nll_hf)
            g_hf, m_hf = greedy(hf_fn, prompt_ids, a.greedy_n, dev)
            with torch.no_grad():
                c = heldout_ids[:a.eval_ctx][None].to(dev)
                dmax = (hf_fn(c).float() - ours_fn(c).float()).abs().max().item()
            rel = abs(st_hf["ppl"] - st_ours["ppl"]) / st_ours["ppl"]
            log(f"reference (transformers {tv} Qwen2MoeForCausalLM, f32): PPL {st_hf['ppl']:.4f} "
                f"+/- {st_hf['ppl_err']:.4f}; greedy {g_hf}; vs model.py: max |logit diff| {dmax:.2e} on "
                f"chunk 0, PPL rel diff {rel:.2e}, greedy {'equal' if g_hf == g_ours else 'DIFFERENT'}")
            hf_info = {"used": True, "transformers": tv, "max_abs_logit_diff_vs_model_py": dmax,
                       "ppl_rel_diff_vs_model_py": rel, "greedy_equal": g_hf == g_ours,
                       "ppl_model_py": st_ours["ppl"]}
            if dmax < 1e-3 and rel < 1e-4:
                st, g, margins = st_hf, g_hf, m_hf
                by = (f"PyTorch {torch.__version__} float32 on the dequantized exported weights "
                      f"(transformers {tv} Qwen2MoeForCausalLM; tools/train/model.py agrees)")
            else:
                log("WARNING: transformers and model.py disagree; the reference keeps model.py's numbers")
        except Exception as ex:  # noqa: BLE001 - the cross-check is optional, report why it was skipped
            log(f"transformers cross-check skipped: {type(ex).__name__}: {ex}")
            hf_info = {"used": False, "why": f"{type(ex).__name__}: {ex}"}
    ev = os.path.join(out_dir, "eval")
    os.makedirs(ev, exist_ok=True)
    X.write_json(os.path.join(ev, "reference_ppl.json"), {
        "text": "heldout.txt", "ctx": a.eval_ctx, "chunks": n_chunks,
        "tokens_scored": st["tokens_scored"], "mean_nll": st["mean_nll"], "ppl": st["ppl"],
        "ppl_err": st["ppl_err"], "computed_by": by})
    X.write_json(os.path.join(ev, "reference_greedy.json"), {
        "prompt": a.prompt, "prompt_ids": prompt_ids, "greedy_ids": g,
        "greedy_margin": [round(x, 5) for x in margins], "computed_by": by})
    return st, g, hf_info, cfg, state


def float_ppl(best_state, cfg, heldout_ids, C, dev):
    """The same held-out PPL on the trained (unquantized) weights."""
    m = M.Qwen2Moe(M.Cfg(**cfg))
    m.load_state_dict(best_state)
    m = m.float().to(dev).eval()
    nll, _ = chunk_nll(lambda ids: m(ids, exact=True)[0], heldout_ids, C, dev)
    return ppl_stats(nll)


# --------------------------------------------------------------------------


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=".train-data")
    p.add_argument("--out", default="models/kjv-moe")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--byte-tokenizer", action="store_true")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--moe-inter", type=int, default=192)
    p.add_argument("--shared-inter", type=int, default=384)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--max-pos", type=int, default=2048)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr-frac", type=float, default=0.1)
    p.add_argument("--wd", type=float, default=0.1)
    p.add_argument("--dropout", type=float, default=0.3)
    p.add_argument("--aux-coef", type=float, default=0.01)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--max-train-seconds", type=float, default=840,
                   help="stop training (keeping the best checkpoint so far) after this long")
    p.add_argument("--eval-ctx", type=int, default=256)
    p.add_argument("--prompt", default="And God said")
    p.add_argument("--greedy-n", type=int, default=16)
    p.add_argument("--no-hf", action="store_true", help="skip the transformers cross-check")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args()

    dev = torch.device(a.device)
    os.makedirs(a.out, exist_ok=True)
    log(f"torch {torch.__version__} on {dev}" +
        (f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else "") + f"; args {vars(a)}")
    texts = {k: read(os.path.join(a.data, f"{k}.txt")) for k in ("train", "valid", "heldout")}

    if a.byte_tokenizer:
        tok_path, enc = byte_tokenizer(a.out)
    else:
        tok_path = train_tokenizer(texts["train"], a.vocab, a.out)
        enc = hf_encoder(tok_path)
    with open(tok_path) as f:
        tj = json.load(f)
    vocab = max(max(tj["model"]["vocab"].values()), max(t["id"] for t in tj["added_tokens"])) + 1
    write_tokenizer_configs(a.out, a.max_pos)
    data = {k: torch.tensor(enc(v), dtype=torch.int64) for k, v in texts.items()}
    log(f"tokenizer: {vocab} ids; tokens: " + ", ".join(f"{k} {len(v)} ({len(texts[k]) / len(v):.2f} chars/token)"
                                                       for k, v in data.items()))
    prompt_ids = enc(a.prompt)

    cfg = model_config(a, vocab)
    best_state, summary = train(a, cfg, data, dev)

    full_cfg = X.export(best_state, cfg, a.out)
    size = sum(os.path.getsize(os.path.join(a.out, f)) for f in os.listdir(a.out)
               if os.path.isfile(os.path.join(a.out, f)))
    log(f"export: {a.out}, {size / 1e6:.2f} MB ({os.path.getsize(os.path.join(a.out, 'model.safetensors')) / 1e6:.2f}"
        f" MB of weights)")

    st_f = float_ppl(best_state, cfg, data["heldout"], a.eval_ctx, dev)
    log(f"held-out PPL of the unquantized trained weights: {st_f['ppl']:.4f}")
    st, g, hf_info, _, _ = evaluate(a, a.out, data["heldout"], prompt_ids, dev)
    with open(os.path.join(a.out, "eval", "heldout.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.write(texts["heldout"])   # the text the reference PPL is over, beside it
    try:
        from tokenizers import Tokenizer
        text = Tokenizer.from_file(tok_path).decode(prompt_ids + g)
    except ImportError:
        text = bytes(i - len(SPECIALS) for i in prompt_ids + g if i >= len(SPECIALS)).decode("utf-8", "replace")
    log(f"greedy: {text!r}")

    summary.update({"tokens": {k: len(v) for k, v in data.items()}, "vocab": vocab,
                    "bytes_on_disk": size, "heldout_ppl_quantized": st["ppl"],
                    "heldout_ppl_float": st_f["ppl"], "greedy_text": text, "hf_check": hf_info,
                    "args": vars(a), "torch": torch.__version__,
                    "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                    "total_seconds": round(time.time() - T0, 1), "log": LOG})
    X.write_json(os.path.join(a.out, "eval", "training.json"), summary)
    log(f"done in {time.time() - T0:.1f} s")


if __name__ == "__main__":
    main()
