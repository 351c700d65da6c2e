"""Export of a trained Qwen2-MoE (model.py) as an MLX-format checkpoint, the
way mlx-lm writes a quantized qwen2_moe: what mlxcel and mlx-lm both load.

MLX affine quantization (mlx `quantize`, as the fixtures README documents):
each row is cut into groups of `gs` values; per group
    wmax, wmin = max, min;  m = |wmin| > |wmax|
    s = max((wmax - wmin) / (2^bits - 1), 1e-7), negated unless m
    edge = wmin if m else wmax;  q0 = round(edge / s)
    if q0 != 0: s = edge / q0, b = edge   (so that 0.0 is exactly representable)
    else:       b = 0
    q = clip(round((w - b) / s), 0, 2^bits - 1)
All in float32; s and b are stored as float16 and q is computed against the
stored (rounded) s and b, so that dequantization `w' = s * q + b` is as close
to w as the stored numbers allow.  Scales are negative whenever the group's
larger-magnitude extreme is its maximum.  q values are packed little-endian
into uint32 words: element k of a row occupies bits [k*bits, (k+1)*bits).

Two implementations of the same thing: `quantize_rows_py` (pure Python, the
reference, float32 emulated by rounding after every operation) and
`quantize_torch` (vectorised, used for real); test_export.py checks they give
identical bytes.  The safetensors reader/writer is pure Python too.

Tensor names follow mlx-lm's qwen2_moe after sanitize: routed experts stacked
as `model.layers.{l}.mlp.switch_mlp.{gate,up,down}_proj` [E, out, in/pack];
the router `mlp.gate` and `mlp.shared_expert_gate` at 8 bits (per-path
entries in config.json's `quantization`, as mlx-lm's quant_predicate does);
embeddings and lm_head quantized like any linear; norms and q/k/v biases
unquantized float16.
"""
import json
import math
import os
import struct

# --------------------------------------------------------------------------
# float helpers (pure Python)


def f32(x):
    """Rounds a Python float to the nearest float32 (round to nearest even)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f16_bits(x):
    return struct.unpack("<H", struct.pack("<e", x))[0]


def f16_value(bits):
    return struct.unpack("<e", struct.pack("<H", bits))[0]


# --------------------------------------------------------------------------
# pure-Python reference quantizer


def quantize_group_py(g, bits):
    """One group (a list of float32 values) -> (q list, scale f16 bits, bias f16 bits)."""
    nbins = float((1 << bits) - 1)
    wmax, wmin = max(g), min(g)
    m = abs(wmin) > abs(wmax)
    s = max(f32(f32(wmax - wmin) / nbins), f32(1e-7))
    s = s if m else -s
    edge = wmin if m else wmax
    q0 = round(f32(edge / s))
    if q0 != 0:
        s = f32(edge / q0)
        b = edge
    else:
        b = 0.0
    sb, bb = f16_bits(s), f16_bits(b)
    s16, b16 = f16_value(sb), f16_value(bb)
    q = []
    for w in g:
        v = round(f32(f32(w - b16) / s16)) if s16 != 0 else 0
        q.append(min(max(v, 0), int(nbins)))
    return q, sb, bb


def pack_row_py(q, bits):
    """Little-endian bit stream of q values in uint32 words (bits dividing 32)."""
    epw = 32 // bits
    if len(q) % epw:
        raise ValueError(f"row of {len(q)} values does not fill {bits}-bit words")
    words = []
    for i in range(0, len(q), epw):
        w = 0
        for j in range(epw):
            w |= q[i + j] << (bits * j)
        words.append(w)
    return words


def unpack_row_py(words, bits, n):
    """Inverse of pack_row_py, valid for any 1..8 bits (values may straddle words)."""
    mask = (1 << bits) - 1
    out = []
    for k in range(n):
        bit = k * bits
        wi, off = divmod(bit, 32)
        v = words[wi] >> off
        if off + bits > 32:
            v |= words[wi + 1] << (32 - off)
        out.append(v & mask)
    return out


def quantize_rows_py(rows, bits, gs):
    """rows: list of lists of floats (float32 values).  Returns
    (words per row, scale f16 bits per row, bias f16 bits per row)."""
    W, S, B = [], [], []
    for r in rows:
        if len(r) % gs:
            raise ValueError(f"row length {len(r)} is not a multiple of the group size {gs}")
        r = [f32(v) for v in r]
        qs, ss, bs = [], [], []
        for i in range(0, len(r), gs):
            q, s, b = quantize_group_py(r[i:i + gs], bits)
            qs += q
            ss.append(s)
            bs.append(b)
        W.append(pack_row_py(qs, bits))
        S.append(ss)
        B.append(bs)
    return W, S, B


def dequantize_row_py(words, scale_bits, bias_bits, bits, gs, n):
    q = unpack_row_py(words, bits, n)
    return [f16_value(scale_bits[k // gs]) * q[k] + f16_value(bias_bits[k // gs]) for k in range(n)]


# --------------------------------------------------------------------------
# safetensors (pure Python)

DTYPE_SIZE = {"U32": 4, "F32": 4, "F16": 2, "BF16": 2, "I32": 4, "U8": 1}


def write_safetensors(path, tensors, metadata=None):
    """tensors: name -> (dtype, shape, raw little-endian bytes).  4-byte
    dtypes first, then 2- and 1-byte ones (each sorted by name), so every
    tensor sits at an offset aligned to its element size."""
    order = sorted(tensors, key=lambda n: (-DTYPE_SIZE[tensors[n][0]], n))
    header, off = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for n in order:
        dt, shape, raw = tensors[n]
        want = DTYPE_SIZE[dt] * math.prod(shape)
        if len(raw) != want:
            raise ValueError(f"{n}: {len(raw)} bytes for {dt}{list(shape)}, expected {want}")
        header[n] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for n in order:
            f.write(tensors[n][2])
    os.replace(tmp, path)


def read_safetensors(path):
    """-> (name -> (dtype, shape, raw bytes), metadata)."""
    with open(path, "rb") as f:
        data = f.read()
    (hl,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hl])
    meta = header.pop("__metadata__", None)
    base = 8 + hl
    out = {}
    for n, v in header.items():
        a, b = v["data_offsets"]
        out[n] = (v["dtype"], tuple(v["shape"]), data[base + a:base + b])
    return out, meta


# --------------------------------------------------------------------------
# torch implementation (imported lazily: the pure-Python parts need no torch)


def quantize_torch(w, bits, gs):
    """w: float tensor [..., n].  Returns (packed uint32 words as int64
    [..., n*bits/32], scales f16 [..., n/gs], biases f16 [..., n/gs])."""
    import torch

    if 32 % bits:
        raise ValueError("only bit widths dividing 32 are packed here")
    *lead, n = w.shape
    if n % gs:
        raise ValueError(f"last dimension {n} is not a multiple of the group size {gs}")
    nbins = float((1 << bits) - 1)
    W = w.detach().float().reshape(-1, n // gs, gs)
    wmax = W.amax(-1, keepdim=True)
    wmin = W.amin(-1, keepdim=True)
    m = wmin.abs() > wmax.abs()
    s = torch.clamp((wmax - wmin) / nbins, min=1e-7)
    s = torch.where(m, s, -s)
    edge = torch.where(m, wmin, wmax)
    q0 = torch.round(edge / s)
    s = torch.where(q0 != 0, edge / q0, s)
    b = torch.where(q0 == 0, torch.zeros_like(edge), edge)
    s16, b16 = s.half(), b.half()
    sf, bf = s16.float(), b16.float()
    q = torch.round((W - bf) / torch.where(sf == 0, torch.ones_like(sf), sf))
    q = torch.where(sf == 0, torch.zeros_like(q), q).clamp(0, nbins).to(torch.int64)
    epw = 32 // bits
    q = q.reshape(-1, n // epw, epw)
    shifts = torch.arange(epw, dtype=torch.int64, device=q.device) * bits
    words = (q << shifts).sum(-1)
    return (words.reshape(*lead, n * bits // 32), s16.reshape(*lead, n // gs),
            b16.reshape(*lead, n // gs))


def dequantize_torch(words, scales, biases, bits, gs):
    """Inverse: words (int64 holding uint32) [..., n*bits/32] -> float32 [..., n].
    Any width 1..8: a value may straddle two words (3, 5, 6 bits)."""
    import torch

    *lead, nw = words.shape
    n = nw * 32 // bits
    k = torch.arange(n, dtype=torch.int64, device=words.device)
    wi, off = (k * bits) // 32, (k * bits) % 32
    lo = words[..., wi] >> off
    nxt = torch.clamp(wi + 1, max=nw - 1)
    hi = torch.where(off + bits > 32, words[..., nxt] << (32 - off), torch.zeros_like(lo))
    q = ((lo | hi) & ((1 << bits) - 1)).reshape(*lead, n // gs, gs).float()
    w = scales.float().unsqueeze(-1) * q + biases.float().unsqueeze(-1)
    return w.reshape(*lead, n)


def torch_to_raw(t, dtype):
    """-> safetensors raw bytes for dtype U32 (from int64 words), F16 or F32."""
    import numpy as np

    a = t.detach().cpu()
    if dtype == "U32":
        return a.numpy().astype("<u4").tobytes()
    if dtype == "F16":
        return a.half().numpy().astype("<f2").tobytes()
    if dtype == "F32":
        return a.float().numpy().astype("<f4").tobytes()
    raise ValueError(dtype)


def raw_to_torch(dtype, shape, raw):
    import numpy as np
    import torch

    np_dt = {"U32": "<u4", "F16": "<f2", "BF16": "<u2", "F32": "<f4"}[dtype]
    a = np.frombuffer(raw, dtype=np_dt).reshape(shape)
    if dtype == "U32":
        return torch.from_numpy(a.astype(np.int64))
    if dtype == "BF16":
        return torch.from_numpy((a.astype(np.int32) << 16).view(np.float32).copy())
    return torch.from_numpy(a.astype(np.float32))


# --------------------------------------------------------------------------
# the checkpoint


def quantized_modules(cfg):
    """(our state-dict name, MLX module path, bits) of every quantized weight."""
    out = [("model.embed_tokens.weight", "model.embed_tokens", None)]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}"
        for x in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out.append((f"{p}.self_attn.{x}.weight", f"{p}.self_attn.{x}", None))
        out.append((f"{p}.mlp.gate.weight", f"{p}.mlp.gate", 8))
        for x in ("gate_proj", "up_proj", "down_proj"):
            out.append((f"{p}.mlp.experts.{x}", f"{p}.mlp.switch_mlp.{x}", None))
            out.append((f"{p}.mlp.shared_expert.{x}.weight", f"{p}.mlp.shared_expert.{x}", None))
        out.append((f"{p}.mlp.shared_expert_gate.weight", f"{p}.mlp.shared_expert_gate", 8))
    if not cfg.get("tie_word_embeddings"):
        out.append(("lm_head.weight", "lm_head", None))
    return out


def plain_tensors(cfg):
    """(our name, MLX name) of the tensors stored unquantized (float16)."""
    out = []
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}"
        out.append((f"{p}.input_layernorm.weight",) * 2)
        out.append((f"{p}.post_attention_layernorm.weight",) * 2)
        for x in ("q_proj", "k_proj", "v_proj"):
            out.append((f"{p}.self_attn.{x}.bias",) * 2)
    out.append(("model.norm.weight",) * 2)
    return out


def quantization_block(cfg, bits, gs, router_bits):
    q = {"group_size": gs, "bits": bits}
    for l in range(cfg["num_hidden_layers"]):
        for x in ("mlp.gate", "mlp.shared_expert_gate"):
            q[f"model.layers.{l}.{x}"] = {"group_size": 64, "bits": router_bits}
    return q


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def export(state, cfg, out_dir, bits=4, gs=64, router_bits=8):
    """state: our model's state dict (any float dtype, any device);
    cfg: the config.json dict (architecture fields).  Writes
    model.safetensors and config.json into out_dir; returns the config."""
    os.makedirs(out_dir, exist_ok=True)
    tensors = {}
    for name, mod, b in quantized_modules(cfg):
        nb = b or bits
        w = state[name]
        wq, s, bz = quantize_torch(w, nb, 64 if b else gs)
        tensors[mod + ".weight"] = ("U32", tuple(wq.shape), torch_to_raw(wq, "U32"))
        tensors[mod + ".scales"] = ("F16", tuple(s.shape), torch_to_raw(s, "F16"))
        tensors[mod + ".biases"] = ("F16", tuple(bz.shape), torch_to_raw(bz, "F16"))
    for name, mlx_name in plain_tensors(cfg):
        t = state[name]
        tensors[mlx_name] = ("F16", tuple(t.shape), torch_to_raw(t, "F16"))
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, {"format": "mlx"})
    full = dict(cfg)
    q = quantization_block(cfg, bits, gs, router_bits)
    full["quantization"] = q
    full["quantization_config"] = q
    write_json(os.path.join(out_dir, "config.json"), full)
    return full


def read_checkpoint(model_dir):
    """config.json and every tensor of the checkpoint (one file or shards)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    files = sorted(fn for fn in os.listdir(model_dir)
                   if fn.endswith(".safetensors") and fn != "reference.safetensors")
    raw = {}
    for fn in files:
        raw.update(read_safetensors(os.path.join(model_dir, fn))[0])
    return cfg, raw


def our_name(mlx_name):
    """MLX tensor name -> our state-dict name (stacked experts have no .weight)."""
    return mlx_name.replace(".mlp.switch_mlp.", ".mlp.experts.").replace(
        ".mlp.experts.gate_proj.weight", ".mlp.experts.gate_proj").replace(
        ".mlp.experts.up_proj.weight", ".mlp.experts.up_proj").replace(
        ".mlp.experts.down_proj.weight", ".mlp.experts.down_proj")


def load_dequantized(model_dir):
    """Reads a qwen2_moe MLX checkpoint (ours, or any mlx-community-style one:
    stacked or per-expert experts, shards, mixed bits, f16/bf16 scales, tied
    embeddings) into our model's state-dict names, every quantized weight as
    float32 exactly `scale * q + bias` of the stored numbers and every other
    tensor as its stored value in float32.  Bits are inferred from the
    shapes and checked against config.json's `quantization`."""
    import torch

    cfg, raw = read_checkpoint(model_dir)
    qcfg = cfg.get("quantization") or {}
    dense = {}
    for name in raw:
        if name.endswith((".scales", ".biases")):
            continue
        mod = name[:-len(".weight")] if name.endswith(".weight") else None
        if mod and mod + ".scales" in raw:
            ov = qcfg.get(mod, {}) if isinstance(qcfg.get(mod), dict) else {}
            gs = ov.get("group_size", qcfg.get("group_size", 64))
            w = raw_to_torch(*raw[name])
            s = raw_to_torch(*raw[mod + ".scales"])
            b = raw_to_torch(*raw[mod + ".biases"])
            bits, rem = divmod(32 * w.shape[-1], s.shape[-1] * gs)
            want = ov.get("bits", qcfg.get("bits"))
            if rem or (want is not None and bits != want):
                raise ValueError(f"{mod}: shapes {tuple(w.shape)}/{tuple(s.shape)} do not give "
                                 f"{want} bits at group size {gs}")
            dense[name] = dequantize_torch(w, s, b, bits, gs)
        else:
            dense[name] = raw_to_torch(*raw[name])
    state, per_expert = {}, {}
    for name, t in dense.items():
        parts = name.split(".")
        if ".mlp.experts." in name and parts[-3].isdigit():   # ...experts.{e}.{proj}.weight
            key = ".".join(parts[:-3] + [parts[-2]])
            per_expert.setdefault(key, {})[int(parts[-3])] = t
        else:
            state[our_name(name)] = t
    for key, d in per_expert.items():
        state[key] = torch.stack([d[e] for e in range(len(d))])
    if "lm_head.weight" not in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return cfg, state
