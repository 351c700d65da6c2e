"""A Qwen2-MoE causal language model in plain PyTorch (torch >= 1.13).

It computes exactly what Hugging Face's `Qwen2MoeForCausalLM` computes (and so
what mlxcel's qwen2_moe family reproduces); `test_export.py` checks that on the
reference fixture `qwen2_moe_tiny_chat`, whose expected logits HF produced:

  h = embed(ids)
  per layer:  h += o_proj(attn(rope(q), rope(k), v))  on rmsnorm(h)
              h += moe(rmsnorm(h))
  logits = lm_head(rmsnorm(h))

  attn: q/k/v projections with bias, o without; rotate-half RoPE; causal
        softmax(q k^T / sqrt(d)) v per head (GQA by repeating kv heads).
  moe:  p = softmax(gate(x)) over E experts; the top-k (renormalised only if
        norm_topk_prob); out = sum_k p_k * down(silu(gate_k x) * up_k x)
        + sigmoid(shared_expert_gate(x)) * shared_expert(x).

Why our own module rather than transformers' class: it runs (and is tested)
on a CPU-only machine with an old torch, keeps the routed experts stacked as
[E, out, in] tensors, which is the layout mlx-lm's sanitize produces
(`switch_mlp`), and offers a dense expert path that trains fast on a GPU.
Parameter names match HF's (with stacked experts), so `train.py` can also
cross-check against `Qwen2MoeForCausalLM` where transformers is installed.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Cfg:
    """The subset of a qwen2_moe config.json this model uses."""

    def __init__(self, **kw):
        self.vocab_size = kw["vocab_size"]
        self.hidden_size = kw["hidden_size"]
        self.num_hidden_layers = kw["num_hidden_layers"]
        self.num_attention_heads = kw["num_attention_heads"]
        self.num_key_value_heads = kw.get("num_key_value_heads", self.num_attention_heads)
        self.head_dim = kw.get("head_dim") or self.hidden_size // self.num_attention_heads
        self.num_experts = kw["num_experts"]
        self.num_experts_per_tok = kw["num_experts_per_tok"]
        self.moe_intermediate_size = kw["moe_intermediate_size"]
        self.shared_expert_intermediate_size = kw["shared_expert_intermediate_size"]
        self.norm_topk_prob = bool(kw.get("norm_topk_prob", False))
        self.rms_norm_eps = kw.get("rms_norm_eps", 1e-6)
        rp = kw.get("rope_parameters") or {}
        self.rope_theta = kw.get("rope_theta") or rp.get("rope_theta", 10000.0)
        if rp.get("rope_type", "default") != "default":
            raise ValueError("only the default rope is supported")
        self.tie_word_embeddings = bool(kw.get("tie_word_embeddings", False))
        for k in ("decoder_sparse_step",):
            if kw.get(k, 1) != 1:
                raise ValueError(f"{k} != 1 is not supported")
        if kw.get("mlp_only_layers"):
            raise ValueError("mlp_only_layers is not supported")


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rope_tables(cfg, T, device):
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d))
    t = torch.arange(T, device=device).float()
    f = torch.outer(t, inv)
    emb = torch.cat((f, f), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, d = cfg.hidden_size, cfg.head_dim
        self.nh, self.nkv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(H, self.nh * d, bias=True)
        self.k_proj = nn.Linear(H, self.nkv * d, bias=True)
        self.v_proj = nn.Linear(H, self.nkv * d, bias=True)
        self.o_proj = nn.Linear(self.nh * d, H, bias=False)

    def forward(self, x, cos, sin, dropout=0.0, exact=False):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.d).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.d).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.nkv != self.nh:
            rep = self.nh // self.nkv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        sdpa = getattr(F, "scaled_dot_product_attention", None)
        if sdpa is not None and not exact:
            o = sdpa(q, k, v, dropout_p=dropout, is_causal=True)
        else:
            # eager attention as HF's: scores in the working dtype, softmax in f32
            s = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.d)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            s = s.masked_fill(mask, float("-inf"))
            p = torch.softmax(s.float(), dim=-1).to(q.dtype)
            if dropout:
                p = F.dropout(p, dropout)
            o = torch.matmul(p, v)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.nh * self.d))


class MLP(nn.Module):
    def __init__(self, H, I):
        super().__init__()
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Experts(nn.Module):
    """E SwiGLU experts stacked as [E, out, in] (nn.Linear's orientation)."""

    def __init__(self, E, H, I):
        super().__init__()
        self.gate_proj = nn.Parameter(torch.empty(E, I, H))
        self.up_proj = nn.Parameter(torch.empty(E, I, H))
        self.down_proj = nn.Parameter(torch.empty(E, H, I))


class SparseMoe(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, E = cfg.hidden_size, cfg.num_experts
        self.E, self.k, self.norm_topk = E, cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.gate = nn.Linear(H, E, bias=False)
        self.experts = Experts(E, H, cfg.moe_intermediate_size)
        self.shared_expert = MLP(H, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(H, 1, bias=False)

    def route(self, x):
        logits = self.gate(x)
        p = torch.softmax(logits, dim=-1, dtype=torch.float)
        w, idx = torch.topk(p, self.k, dim=-1)
        if self.norm_topk:
            w = w / w.sum(dim=-1, keepdim=True)
        return logits, w.to(x.dtype), idx

    def forward(self, x, dense=False):
        """x: [N, H].  dense=True computes every expert on every token and
        weights the unchosen ones by zero: the same function and gradients,
        in a few large matmuls (fast on a GPU for small E).  dense=False
        runs each expert on its tokens only, accumulating in expert order
        as HF does (used for the reference numbers)."""
        logits, w, idx = self.route(x)
        ex = self.experts
        if dense:
            wfull = torch.zeros(x.shape[0], self.E, dtype=w.dtype, device=x.device).scatter(1, idx, w)
            g = torch.einsum("nh,eih->eni", x, ex.gate_proj)
            u = torch.einsum("nh,eih->eni", x, ex.up_proj)
            a = F.silu(g) * u * wfull.t().unsqueeze(-1)
            out = torch.einsum("eni,ehi->nh", a, ex.down_proj)
        else:
            out = torch.zeros_like(x)
            for e in range(self.E):
                tok, slot = torch.where(idx == e)
                if tok.numel() == 0:
                    continue
                xe = x[tok]
                h = F.silu(xe @ ex.gate_proj[e].t()) * (xe @ ex.up_proj[e].t())
                y = (h @ ex.down_proj[e].t()) * w[tok, slot, None]
                out.index_add_(0, tok, y.to(out.dtype))
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out + shared, logits


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SparseMoe(cfg)


class Backbone(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Qwen2Moe(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def init_weights(self, std=0.02):
        """GPT-2 style: N(0, std); the projections that write into the
        residual stream scaled by 1/sqrt(2 L); norms 1, biases 0."""
        out_std = std / math.sqrt(2 * self.cfg.num_hidden_layers)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            elif name.endswith(("o_proj.weight", "down_proj.weight", "experts.down_proj")):
                nn.init.normal_(p, 0.0, out_std)
            else:
                nn.init.normal_(p, 0.0, std)

    def forward(self, ids, dense=False, dropout=0.0, exact=False):
        """Returns (logits [B, T, V], router logits: one [B*T, E] per layer)."""
        B, T = ids.shape
        h = self.model.embed_tokens(ids)
        cos, sin = rope_tables(self.cfg, T, ids.device)
        routers = []
        drop = dropout if self.training else 0.0
        for layer in self.model.layers:
            a = layer.self_attn(layer.input_layernorm(h), cos, sin, dropout=drop, exact=exact)
            h = h + (F.dropout(a, drop) if drop else a)
            x = layer.post_attention_layernorm(h)
            m, r = layer.mlp(x.reshape(B * T, -1), dense=dense)
            m = m.view(B, T, -1)
            h = h + (F.dropout(m, drop) if drop else m)
            routers.append(r)
        return self.lm_head(self.model.norm(h)), routers


def load_balancing_loss(router_logits, E, k):
    """Switch-Transformer auxiliary loss as HF computes it for qwen2_moe
    (equal to k for perfectly balanced routing)."""
    logits = torch.cat(router_logits, dim=0)
    p = torch.softmax(logits.float(), dim=-1)
    _, sel = torch.topk(p, k, dim=-1)
    mask = F.one_hot(sel, E).float()            # [N, k, E]
    tokens_per_expert = mask.mean(dim=0)        # [k, E]
    prob_per_expert = p.mean(dim=0)             # [E]
    return (tokens_per_expert * prob_per_expert.unsqueeze(0)).sum() * E
