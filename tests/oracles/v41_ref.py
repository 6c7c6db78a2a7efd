#!/usr/bin/env python3
"""tests/oracles/v41_ref.py - NumPy oracle for DeepSeek-V4.1 (issue #34), independent of tokenmill's C.

A transliteration of the semantics of DeepSeek's V4.1 reference inference code (HF
deepseek-ai/DeepSeek-V4.1-Flash, revision dba1be0a, files inference/model.py, inference/engram.py and
the kernel module's act_quant, fp4_act_quant, fp8_gemm, fp4_gemm, hc_split_sinkhorn, sparse_attn),
written in our own code. Every function names, in a "mirrors:" comment, the reference function whose
semantics it follows. It reads a checkpoint folder (config.json, *.safetensors through its own reader,
tokenizer.json for the Engram compressed token map) and runs Transformer.forward incrementally: a
prefill from start_pos 0, then decode steps (and, beyond the reference, prefill chunks at any
start_pos, which the reference's state formulas define the same way: used as a self-check).

Numerics:
- Activations are float32 between ops (the reference runs with torch's default dtype bf16, so its
  intermediate tensors are rounded to bf16; tokenmill's CPU engine keeps float32, so the oracle
  does too). Matrix products and reductions are accumulated in float64 and rounded to float32.
- The reference's activation quantization is applied exactly, quantize-then-dequantize in float32:
  act_quant (32-value blocks, ue8m0 scale 2^ceil(log2(amax * fp32(1/448))), amax floored at 1e-4,
  e4m3fn round-to-nearest-even of clamp(x/s, +-448)) before every FP8/FP4 GEMM and on the window KV;
  fp4_act_quant (e2m1 round-to-nearest-even of clamp(x/s, +-6); ue8m0 scales in 32-blocks for the
  indexer's query and keys, e4m3 scales amax/6 in 16-blocks for the compressed KV).
- Top-k selections (indexer, candidate blocks, MoE) break exact score ties toward the lower index;
  the reference's torch.topk leaves tie order unspecified, so the oracle COUNTS ties at the selection
  boundary and picks of masked (-inf) entries that the reference would still attend; fixture makers
  choose seeds where both counts are 0.

DSpark: Model.forward_spec (the mtp.* draft stages, greedy) and run_spec (issue #37; no fixture yet).

Usage:
  python3 tests/oracles/v41_ref.py MODEL_DIR --prompt 1,2,3 [--decode N] [--chunk C]
prints the greedy continuation and the last logits' top entries;
  python3 tests/oracles/v41_ref.py --token-map TOKENIZER_JSON [-v]
prints the compressed vocab size (and with -v the map, one id per line). Library use: see
tests/oracles/make_v41_fixtures.py. Needs NumPy only (Debian python3-numpy).
"""
import json
import math
import os
import re
import struct
import sys
import unicodedata

import numpy as np

F32 = np.float32
F64 = np.float64

# The reference's Indexer republishes shared_attn.index_k only when its kv source wrote keys in this
# forward (latent not None). In a decode step that completes no group of a ratio > 1, that layer's
# indexer then reads the keys last published in the PREVIOUS forward - by the last kv source in the
# stack (e.g. a ratio-1 layer), whose keys are not this ratio's: decode would differ from prefill.
# By default the oracle follows the evident intent (index keys shared along with the compressed KV,
# as Attention._compress_kv publishes compress_kv on every forward); True reproduces the literal
# pointer behaviour (`--literal-index-k`). See tests/oracles/README.md.
LITERAL_INDEX_K = False

# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------

# mirrors: model.py ModelArgs (field = config.json key: default). Values of the reference's dataclass.
MODEL_ARGS_DEFAULTS = {
    "max_batch_size": 4, "max_seq_len": 4096, "temperature": 1.0, "dtype": "fp8",
    "expert_dtype": "fp4", "vocab_size": 129280, "dim": 1024, "moe_inter_dim": 1024,
    "n_layers": 5, "n_mtp_layers": 1, "n_heads": 16, "n_routed_experts": 8,
    "n_shared_experts": 1, "n_activated_experts": 2, "score_func": "sqrtsoftplus",
    "gate_temp": 1.0, "norm_topk_prob": True, "route_scale": 1.0, "swiglu_limit": 0.0,
    "q_lora_rank": 256, "head_dim": 128, "rope_head_dim": 32, "norm_eps": 1e-20,
    "o_groups": 8, "o_lora_rank": 256, "window_size": 128,
    "compress_ratios": [0, 2, 2, 1, 1, 0], "kv_source_layers": [1, 3],
    "index_source_layers": [1, 3], "compress_rope_theta": 40000.0, "original_seq_len": 0,
    "rope_theta": 10000.0, "rope_factor": 40, "beta_fast": 32, "beta_slow": 1,
    "index_n_heads": 16, "index_head_dim": 64, "index_topk": 64,
    "candidate_source_layer": -1, "candidate_topk_blocks": 0, "candidate_block_size": 0,
    "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
    "engram_layer_ids": [], "engram_num_embeddings": [], "engram_max_ngram_size": 1,
    "engram_vocab_size": 0, "engram_n_heads": 0, "engram_head_dim": 0, "engram_pad_id": 2,
    "engram_compressed_vocab_size": 0,
    "vision_n_layers": 0, "vision_dim": 1024, "vision_n_heads": 16, "vision_inter_dim": 2816,
    "vision_patch_size": 14, "vision_rope_theta": 10000.0, "vision_downsample_ratio": 3,
    "vision_max_n_token": 1024, "vision_min_pixels": 544 * 544, "vision_max_wh_ratio": None,
    "image_token_id": 129264,
    "dspark_block_size": 0, "dspark_noise_token_id": 0, "dspark_target_layer_ids": [],
    "dspark_markov_rank": 256, "dspark_n_routed_experts": 0, "dspark_n_activated_experts": 0,
}
# keys a HF config.json carries that are not model arguments
CONFIG_IGNORED = {"model_type", "architectures", "torch_dtype", "transformers_version",
                  "bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings",
                  "quantization_config", "auto_map", "tokenizer_class"}


# released config.json text_config key -> ModelArgs key (the rest keep their names)
TEXT_CONFIG_KEYS = {
    "hidden_size": "dim", "moe_intermediate_size": "moe_inter_dim", "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads", "qk_rope_head_dim": "rope_head_dim", "rms_norm_eps": "norm_eps",
    "num_experts_per_tok": "n_activated_experts", "scoring_func": "score_func",
    "routed_scaling_factor": "route_scale", "sliding_window": "window_size",
    "kv_source_layer_ids": "kv_source_layers", "index_source_layer_ids": "index_source_layers",
    "candidate_source_layer_id": "candidate_source_layer", "engram_pad_token_id": "engram_pad_id",
    "num_nextn_predict_layers": "n_mtp_layers", "dspark_num_experts_per_tok": "dspark_n_activated_experts",
    "max_position_embeddings": "max_seq_len",
}


def model_args_from_config(cfg):
    """The ModelArgs dict of a released config.json (top level + text_config, HF key names), as the
    release's inference/config.json spells it."""
    tc = cfg.get("text_config", cfg)
    out = {}
    for k, v in tc.items():
        if k == "rope_scaling":
            out.update(rope_factor=v["factor"], beta_fast=v["beta_fast"], beta_slow=v["beta_slow"],
                       original_seq_len=v.get("original_max_position_embeddings", 0))
        elif k in TEXT_CONFIG_KEYS:
            out[TEXT_CONFIG_KEYS[k]] = v
        elif k in MODEL_ARGS_DEFAULTS:
            out[k] = v
    q = cfg.get("quantization_config")
    out["dtype"] = "fp8" if q and q.get("quant_method") == "fp8" else "bf16"
    out["expert_dtype"] = q.get("expert_dtype") if q else None
    return out


def load_model_args(folder):
    """mirrors: generate.py reading inference/config.json into ModelArgs; without that file the
    released config.json (text_config) is mapped to the same keys. With both, every ModelArgs key
    the released config.json states must agree."""
    inf = os.path.join(folder, "inference", "config.json")
    with open(os.path.join(folder, "config.json")) as f:
        top = json.load(f)
    if not os.path.exists(inf):
        return top if "text_config" not in top else model_args_from_config(top)
    with open(inf) as f:
        cfg = json.load(f)
    if "text_config" in top:
        for k, v in model_args_from_config(top).items():
            if k in cfg and k != "max_seq_len" and cfg[k] != v and not (
                    isinstance(v, (int, float)) and isinstance(cfg[k], (int, float)) and float(v) == float(cfg[k])):
                raise ValueError(f"{folder}: config.json gives {k} = {v!r}, inference/config.json {cfg[k]!r}")
    return cfg


class Args:
    """mirrors: model.py ModelArgs (read from config.json; unknown keys are reported)."""

    def __init__(self, cfg):
        self.unknown = sorted(k for k in cfg if k not in MODEL_ARGS_DEFAULTS and k not in CONFIG_IGNORED)
        for k, v in MODEL_ARGS_DEFAULTS.items():
            setattr(self, k, cfg.get(k, v))
        for k in ("compress_ratios", "kv_source_layers", "index_source_layers", "engram_layer_ids",
                  "engram_num_embeddings", "dspark_target_layer_ids"):
            setattr(self, k, tuple(int(x) for x in getattr(self, k)))


# --------------------------------------------------------------------------------------------
# Number formats (by their definitions)
# --------------------------------------------------------------------------------------------

def _e4m3_table():
    """float8_e4m3fn byte -> value: 1 sign, 4 exponent (bias 7), 3 mantissa bits, subnormals m*2^-9,
    no infinities, 0x7f/0xff NaN."""
    t = np.zeros(256, dtype=F64)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            v = math.nan
        elif e == 0:
            v = m * 2.0 ** -9
        else:
            v = (1 + m / 8) * 2.0 ** (e - 7)
        t[b] = -v if s else v
    return t.astype(F32)


def _e8m0_table():
    """float8_e8m0fnu byte -> 2^(b-127); 0xff NaN."""
    t = np.array([2.0 ** (b - 127) for b in range(256)], dtype=F64)
    t[255] = math.nan
    return t.astype(F32)


E4M3 = _e4m3_table()
E8M0 = _e8m0_table()
# e2m1 code -> value (bit 3 = sign); in a byte the even element is the low nibble
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=F32)


def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(F32)


def round_e4m3(v):
    """float -> nearest float8_e4m3fn value (ties to even), saturating at +-448 as the kernels'
    satfinite cast (clamp then cast). Returns float32."""
    v = np.clip(np.asarray(v, dtype=F64), -448.0, 448.0)
    a = np.abs(v)
    _, ex = np.frexp(a)  # a = m * 2^ex, m in [0.5, 1)
    e = np.maximum(ex - 1, -6)  # below 2^-6 the quantum stays 2^-9 (subnormals)
    q = np.ldexp(1.0, e - 3)
    r = np.round(a / q) * q  # np.round: half to even
    return np.copysign(r, v).astype(F32)


def round_e2m1(v):
    """float in [-6, 6] -> nearest e2m1 value (ties to the even code). Returns float32."""
    v = np.asarray(v, dtype=F64)
    a = np.abs(v)
    q = np.where(a < 2, 0.5, np.where(a < 4, 1.0, 2.0))
    r = np.minimum(np.round(a / q) * q, 6.0)
    return np.copysign(r, v).astype(F32)


def pow2_ceil(t):
    """2^ceil(log2(t)) for float32 t > 0, from its bits: exponent - 127 + (mantissa != 0), as the
    kernels' fast_round_scale does."""
    bits = np.asarray(t, dtype=F32).view(np.int32)
    e = (bits >> 23) & 0xFF
    lg = e - 127 + ((bits & 0x7FFFFF) != 0).astype(np.int32)
    return ((lg + 127) << 23).astype(np.int32).view(F32)


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------

def act_quant(x, block=32):
    """mirrors: kernel act_quant(x, 32, "ue8m0", float8_e8m0fnu, inplace=True) - FP8 e4m3 with a
    power-of-two scale per `block` values along the last dim; returns the dequantized float32."""
    x = np.asarray(x, dtype=F32)
    shp = x.shape
    g = x.reshape(shp[:-1] + (shp[-1] // block, block))
    amax = np.maximum(np.abs(g).max(axis=-1), F32(1e-4)).astype(F32)
    s = pow2_ceil((amax * F32(1.0 / 448.0)).astype(F32))[..., None]
    q = round_e4m3(g / s)
    return (q * s).astype(F32).reshape(shp)


def fp4_act_quant(x, block=32, e4m3_scale=False):
    """mirrors: kernel fp4_act_quant(x, block, inplace=True, scale_dtype) - e2m1 values with one scale
    per `block`: ue8m0 2^ceil(log2(amax * fp32(1/6))) (the indexer, block 32) or, with e4m3_scale,
    e4m3(amax / 6) (the compressed KV, block 16). Returns the dequantized float32."""
    x = np.asarray(x, dtype=F32)
    shp = x.shape
    g = x.reshape(shp[:-1] + (shp[-1] // block, block))
    amax = np.abs(g).max(axis=-1).astype(F32)
    if e4m3_scale:
        amax = np.maximum(amax, F32(6 * 2.0 ** -9))
        s = round_e4m3((amax / F32(6.0)).astype(F32))
    else:
        amax = np.maximum(amax, F32(6 * 2.0 ** -126))
        s = pow2_ceil((amax * F32(1.0 / 6.0)).astype(F32))
    s = s[..., None]
    v = np.clip((g / s).astype(F32), -6.0, 6.0)
    return (round_e2m1(v) * s).astype(F32).reshape(shp)


def matmul(x, wt):
    """x [..., K] float32 times wt [K, N] (float64, pre-transposed), accumulated in float64."""
    return (np.asarray(x, dtype=F64) @ wt).astype(F32)


class Linear:
    """mirrors: model.py linear() / Linear with kernel fp8_gemm and fp4_gemm. Quantized weights
    (FP8 e4m3 with 32x32 ue8m0 block scales, or packed e2m1 with per-32 ue8m0 scales) take an
    act_quant'ed activation; the block-scaled GEMM equals the product of the dequantized operands
    (each 32-block product is exact in fp32; only the summation order differs). bf16/fp32 weights:
    F.linear, no activation quantization."""

    def __init__(self, w, quantized):
        self.wt = np.ascontiguousarray(np.asarray(w, dtype=F64).T)  # [in, out]
        self.quantized = quantized
        self.out_features = w.shape[0]

    def __call__(self, x):
        if self.quantized:
            x = act_quant(x, 32)
        return matmul(x, self.wt)


def hc_split_sinkhorn(mixes, scale, base, hc, iters, eps):
    """mirrors: kernel hc_split_sinkhorn - pre = sigmoid(.) + eps, post = 2 sigmoid(.),
    comb = row softmax + eps, then column-normalised, then iters-1 rounds of row and column
    normalisation (each dividing by sum + eps). Computed in float64, returned float32."""
    m = np.asarray(mixes, dtype=F64)
    scale = np.asarray(scale, dtype=F64)
    base = np.asarray(base, dtype=F64)
    sig = lambda z: 1.0 / (1.0 + np.exp(-z))
    pre = sig(m[..., :hc] * scale[0] + base[:hc]) + eps
    post = 2.0 * sig(m[..., hc:2 * hc] * scale[1] + base[hc:2 * hc])
    comb = (m[..., 2 * hc:] * scale[2] + base[2 * hc:]).reshape(m.shape[:-1] + (hc, hc))
    comb = np.exp(comb - comb.max(axis=-1, keepdims=True))
    comb = comb / comb.sum(axis=-1, keepdims=True) + eps
    comb = comb / (comb.sum(axis=-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(axis=-1, keepdims=True) + eps)
        comb = comb / (comb.sum(axis=-2, keepdims=True) + eps)
    return pre.astype(F32), post.astype(F32), comb.astype(F32)


def sparse_attn(q, kv, sink, scale):
    """mirrors: kernel sparse_attn for one query - q [H, D], kv [n, D] (the gathered rows, K = V),
    sink [H]: softmax over the n scores with exp(sink) added to the denominator only (the sink logit
    is not scaled). Returns [H, D] float32."""
    s = (np.asarray(q, dtype=F64) @ np.asarray(kv, dtype=F64).T) * scale  # [H, n]
    mx = np.maximum(s.max(axis=-1), sink.astype(F64))
    p = np.exp(s - mx[:, None])
    den = p.sum(axis=-1) + np.exp(sink.astype(F64) - mx)
    return ((p @ np.asarray(kv, dtype=F64)) / den[:, None]).astype(F32)


# --------------------------------------------------------------------------------------------
# Small modules
# --------------------------------------------------------------------------------------------

def rms_norm(x, w, eps):
    """mirrors: model.py RMSNorm.forward - x * rsqrt(mean(x^2) + eps) * weight."""
    x64 = np.asarray(x, dtype=F64)
    r = 1.0 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + eps)
    return (x64 * r * np.asarray(w, dtype=F64)).astype(F32)


def precompute_freqs(dim, original_seq_len, base, factor, beta_fast, beta_slow):
    """mirrors: model.py precompute_freqs_cis (the frequencies; angles are pos * freq in float32).
    YaRN when original_seq_len > 0: a linear ramp between the corrected dims of beta_fast and
    beta_slow blends freq/factor (long wavelengths) into freq (short ones)."""
    ar = np.arange(0, dim, 2, dtype=F32)
    freqs = (F32(1.0) / (F32(base) ** (ar / F32(dim)))).astype(F32)
    if original_seq_len > 0:
        def corrected_dim(rot):
            return dim * math.log(original_seq_len / (rot * 2 * math.pi)) / (2 * math.log(base))
        low = max(math.floor(corrected_dim(beta_fast)), 0)
        high = min(math.ceil(corrected_dim(beta_slow)), dim - 1)
        ramp = np.clip((np.arange(dim // 2, dtype=F32) - F32(low)) / F32(max(high - low, 1e-3)), 0, 1)
        smooth = (F32(1) - ramp).astype(F32)
        freqs = (freqs / F32(factor) * (F32(1) - smooth) + freqs * smooth).astype(F32)
    return freqs


class Rope:
    """mirrors: model.py precompute_freqs_cis + apply_rotary_emb - the last rd dims of a vector as
    adjacent (re, im) pairs, rotated by pos * freq (angle rounded to float32 like torch.outer)."""

    def __init__(self, freqs):
        self.freqs = freqs

    def cos_sin(self, pos):
        ang = (np.asarray(pos, dtype=F32)[:, None] * self.freqs[None, :]).astype(F32)
        a64 = ang.astype(F64)
        return np.cos(a64).astype(F32), np.sin(a64).astype(F32)

    def apply(self, x, pos, rd, inverse=False):
        """x [S, ..., D]; rotates x[..., -rd:] at positions pos [S]; returns a new float32 array."""
        x = np.array(x, dtype=F32, copy=True)
        c, s = self.cos_sin(pos)
        if inverse:
            s = -s
        shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (rd // 2,)
        c, s = c.reshape(shape).astype(F64), s.reshape(shape).astype(F64)
        tail = x[..., -rd:].astype(F64)
        re_, im = tail[..., 0::2], tail[..., 1::2]
        out = np.empty_like(tail)
        out[..., 0::2] = re_ * c - im * s
        out[..., 1::2] = re_ * s + im * c
        x[..., -rd:] = out.astype(F32)
        return x


def softplus(z):
    """torch.nn.functional.softplus (beta 1, threshold 20)."""
    z = np.asarray(z, dtype=F64)
    return np.where(z > 20, z, np.log1p(np.exp(np.minimum(z, 20))))


def topk_lowest_index_ties(scores, k):
    """Indices of the k largest scores (descending; equal scores: lower index first)."""
    order = np.argsort(-np.asarray(scores, dtype=F64), kind="stable")
    return order[:k]


# --------------------------------------------------------------------------------------------
# Engram hashing (inference/engram.py)
# --------------------------------------------------------------------------------------------

def is_prime(n):
    """Deterministic Miller-Rabin (bases below 41 cover n < 3.3e24)."""
    if n < 2:
        return False
    small = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
    for p in small:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d //= 2
        r += 1
    for a in small:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def find_next_prime(start, seen):
    """mirrors: engram.py find_next_prime - smallest prime > start not handed out yet."""
    c = start + 1
    while not is_prime(c) or c in seen:
        c += 1
    return c


def engram_primes(args):
    """mirrors: engram.py EngramLayout.from_args - primes[layer][ngram-2][head]; per (layer, n-gram
    size) the search restarts at engram_vocab_size - 1, never reusing a prime."""
    primes, seen = [], set()
    for _ in args.engram_layer_ids:
        per_ngram = []
        for _ in range(args.engram_max_ngram_size - 1):
            cur, sizes = args.engram_vocab_size - 1, []
            for _ in range(args.engram_n_heads):
                cur = find_next_prime(cur, seen)
                seen.add(cur)
                sizes.append(cur)
            per_ngram.append(sizes)
        primes.append(per_ngram)
    return primes


def compute_hash_multipliers(layer_ids, max_ngram_size, vocab_size):
    """mirrors: engram.py compute_hash_multipliers - NumPy's own default_rng(10007 * layer_id)
    .integers(0, bound, size=max_ngram_size, dtype=int64) * 2 + 1, bound = max(1, (int64 max //
    vocab_size) // 2)."""
    bound = max(1, (np.iinfo(np.int64).max // vocab_size) // 2)
    rows = []
    for lid in layer_ids:
        g = np.random.default_rng(10007 * lid)
        rows.append(g.integers(low=0, high=bound, size=(max_ngram_size,), dtype=np.int64) * 2 + 1)
    return np.stack(rows).astype(np.int64)


def _bytes_to_unicode():
    """The GPT-2 byte-level alphabet: printable latin-1 bytes map to themselves, the rest to
    U+0100 upwards in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


# Rust char::is_whitespace (Unicode White_Space), used by the tokenizers Strip normalizer
_WHITE_SPACE = set(map(chr, list(range(0x09, 0x0E)) + [0x20, 0x85, 0xA0, 0x1680] +
                       list(range(0x2000, 0x200B)) + [0x2028, 0x2029, 0x202F, 0x205F, 0x3000]))


def normalize_token_text(text):
    """mirrors: the normalizer sequence of engram.py build_compressed_token_map: NFKC, NFD, strip
    accents (tokenizers' StripAccents drops is_combining_mark chars, General_Category Mark: Mn, Mc
    and Me; V3's tokenizer then has 98627 keys, and V3's 128815 ids + V4.1's 465 more give the
    released 99092), lowercase (per char, no final-sigma context, as the Rust
    normalizer), runs of [ \\t\\r\\n] -> one space, a lone " " kept (via the sentinel), strip Unicode
    White_Space at both ends."""
    s = unicodedata.normalize("NFKC", text)
    s = unicodedata.normalize("NFD", s)
    s = "".join(c for c in s if not unicodedata.category(c).startswith("M"))
    s = "".join(c.lower() for c in s)
    s = re.sub(r"[ \t\r\n]+", " ", s)
    sentinel = "\ue000"
    if s == " ":
        s = sentinel
    i, j = 0, len(s)
    while i < j and s[i] in _WHITE_SPACE:
        i += 1
    while j > i and s[j - 1] in _WHITE_SPACE:
        j -= 1
    return s[i:j].replace(sentinel, " ")


class Tokenizer:
    """Just what build_compressed_token_map needs from a tokenizer.json: id -> token string and the
    single-token decode of a byte-level BPE (tokenizers' ByteLevel decoder: a token whose chars all
    belong to the byte alphabet becomes those bytes, any other token its own UTF-8; then lossy
    UTF-8)."""

    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            tj = json.load(f)
        self.id_to_tok = {}
        for tok, i in tj["model"]["vocab"].items():
            self.id_to_tok[int(i)] = tok
        for at in tj.get("added_tokens", []):
            self.id_to_tok[int(at["id"])] = at["content"]
        dec = tj.get("decoder") or {}
        kinds = [d.get("type") for d in dec.get("decoders", [])] if dec.get("type") == "Sequence" \
            else [dec.get("type")]
        if "ByteLevel" not in kinds:
            raise ValueError(f"{path}: decoder {kinds}: only byte-level BPE tokenizers are supported")
        self.byte_of = {c: b for b, c in _bytes_to_unicode().items()}

    def __len__(self):
        return len(self.id_to_tok)

    def decode_one(self, i):
        tok = self.id_to_tok.get(i)
        if tok is None:
            return ""
        if all(c in self.byte_of for c in tok):
            raw = bytes(self.byte_of[c] for c in tok)
        else:
            raw = tok.encode("utf-8")
        return raw.decode("utf-8", errors="replace")


def build_compressed_token_map(tok):
    """mirrors: engram.py build_compressed_token_map - ids whose decoded text normalizes alike share
    one compressed id (numbered by first appearance); a decode holding U+FFFD is keyed by its raw
    token string; an empty normalization keys by the decoded text."""
    key_to_new, lookup = {}, []
    for i in range(len(tok)):
        text = tok.decode_one(i)
        if "\ufffd" in text:
            key = tok.id_to_tok.get(i, "")
        else:
            norm = normalize_token_text(text)
            key = norm if norm else text
        if key not in key_to_new:
            key_to_new[key] = len(key_to_new)
        lookup.append(key_to_new[key])
    return np.array(lookup, dtype=np.int64), len(key_to_new)


class NgramHash:
    """mirrors: engram.py NgramHashState - per position the hash ids of the 2..max_ngram-grams ending
    there, over compressed ids, look-back padded with the pad token's compressed id."""

    def __init__(self, args, token_map, cvocab):
        self.args = args
        self.token_map = token_map
        self.pad = int(token_map[args.engram_pad_id])
        self.primes = engram_primes(args)
        flat = [[p for per in layer for p in per] for layer in self.primes]
        self.offsets = np.array([np.cumsum([0] + sizes[:-1]) for sizes in flat], dtype=np.int64)
        self.mult = compute_hash_multipliers(args.engram_layer_ids, args.engram_max_ngram_size, cvocab)
        self.primes_arr = np.array(self.primes, dtype=np.int64)  # [L, n-1, heads]

    def ids(self, cache, start, n):
        """cache: compressed ids of positions 0..start+n-1; returns [n, n_layers, n_hash_cols]."""
        N = self.args.engram_max_ngram_size
        out = []
        for p in range(start, start + n):
            toks = [cache[p - k] if p - k >= 0 else self.pad for k in range(N)]
            prod = np.array(toks, dtype=np.int64)[None, :] * self.mult  # [L, N]
            rolling = prod[:, 0].copy()
            cols = []
            for i in range(1, N):
                rolling = np.bitwise_xor(rolling, prod[:, i])
                cols.append(rolling[:, None] % self.primes_arr[:, i - 1])
            out.append(np.concatenate(cols, axis=-1) + self.offsets)
        return np.array(out, dtype=np.int64)


# --------------------------------------------------------------------------------------------
# Checkpoint reading
# --------------------------------------------------------------------------------------------

class SafeTensors:
    """Minimal safetensors reader: 8-byte little-endian header length, JSON header, raw data."""

    def __init__(self, folder):
        self.entries = {}
        files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
        if not files:
            raise FileNotFoundError(f"{folder}: no *.safetensors")
        for fn in files:
            path = os.path.join(folder, fn)
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                hdr = json.loads(f.read(n))
            data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
            for name, e in hdr.items():
                if name == "__metadata__":
                    continue
                b, end = e["data_offsets"]
                self.entries[name] = (e["dtype"], tuple(e["shape"]), data[b:end], path)

    def __contains__(self, name):
        return name in self.entries

    def raw(self, name):
        return self.entries[name]

    def names(self):
        return self.entries.keys()


def decode_array(dtype, shape, buf):
    """Tensor bytes -> float32 array (F8_E4M3 / F8_E8M0 by table) or integer array (I8/U8/I64/I32)."""
    b = np.asarray(buf)
    if dtype == "F32":
        return b.view("<f4").reshape(shape).astype(F32)
    if dtype == "F64":
        return b.view("<f8").reshape(shape).astype(F32)
    if dtype == "F16":
        return b.view("<f2").reshape(shape).astype(F32)
    if dtype == "BF16":
        return bf16_to_f32(b.view("<u2")).reshape(shape)
    if dtype == "F8_E4M3":
        return E4M3[b].reshape(shape)
    if dtype == "F8_E8M0":
        return E8M0[b].reshape(shape)
    if dtype in ("I8", "U8"):
        return b.view(np.uint8).reshape(shape)
    if dtype == "I64":
        return b.view("<i8").reshape(shape)
    if dtype == "I32":
        return b.view("<i4").reshape(shape)
    raise ValueError(f"unsupported safetensors dtype {dtype}")


class Weights:
    """Loads tensors by the names the reference's state dict uses (model.py module paths)."""

    def __init__(self, folder):
        self.st = SafeTensors(folder)
        self.used = set()

    def has(self, name):
        return name in self.st

    def dense(self, name, shape=None):
        dt, shp, buf, path = self.st.raw(name)
        if dt not in ("F32", "BF16", "F16", "F64"):
            raise ValueError(f"{path}: {name}: dtype {dt}, the reference keeps it bf16/fp32")
        a = decode_array(dt, shp, buf)
        if shape is not None and tuple(a.shape) != tuple(shape):
            raise ValueError(f"{path}: {name}: shape {a.shape}, expected {tuple(shape)}")
        self.used.add(name)
        return a

    def dequantized(self, prefix, shape):
        """A weight the reference holds in bf16 that the release stores as FP8 (attn.wo_a): as the
        release's convert.py, e4m3 x ue8m0 block scale in fp32, rounded to bf16 (ties to even)."""
        lin = self.linear(prefix, shape[0], shape[1])
        w = np.ascontiguousarray(lin.wt.T).astype(F32)
        if lin.quantized:
            u = w.view(np.uint32)
            u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
            w = u.astype(np.uint32).view(F32)
        return w

    def linear(self, prefix, out_f, in_f, expect_dense=False):
        """prefix.weight (+ prefix.scale): mirrors the Linear dtypes of model.py - FP8 e4m3
        [out, in] with ue8m0 scales [ceil(out/32), ceil(in/32)]; FP4 e2m1 packed two per byte
        [out, in/2] (even element low nibble) with ue8m0 scales [out, in/32]; else bf16/fp32."""
        name = prefix + ".weight"
        dt, shp, buf, path = self.st.raw(name)
        self.used.add(name)
        if dt in ("F32", "BF16", "F16", "F64"):
            w = decode_array(dt, shp, buf)
            if w.shape != (out_f, in_f):
                raise ValueError(f"{path}: {name}: shape {w.shape}, expected {(out_f, in_f)}")
            return Linear(w, False)
        if expect_dense:
            raise ValueError(f"{path}: {name}: dtype {dt}, the reference keeps this weight bf16/fp32")
        sdt, sshp, sbuf, spath = self.st.raw(prefix + ".scale")
        self.used.add(prefix + ".scale")
        if sdt not in ("F8_E8M0", "U8"):
            raise ValueError(f"{spath}: {prefix}.scale: dtype {sdt}, expected F8_E8M0")
        sc = E8M0[np.asarray(sbuf).view(np.uint8)].reshape(sshp)
        if dt == "F8_E4M3":
            if shp != (out_f, in_f) or sshp != ((out_f + 31) // 32, (in_f + 31) // 32):
                raise ValueError(f"{path}: {name}: shapes {shp}/{sshp} for fp8 [{out_f}, {in_f}]")
            w = E4M3[np.asarray(buf)].reshape(shp)
            full = np.repeat(np.repeat(sc, 32, axis=0), 32, axis=1)[:out_f, :in_f]
            return Linear((w * full).astype(F32), True)
        if dt in ("I8", "U8"):
            if shp != (out_f, in_f // 2) or sshp != (out_f, in_f // 32):
                raise ValueError(f"{path}: {name}: shapes {shp}/{sshp} for fp4 [{out_f}, {in_f}]")
            b = np.asarray(buf).view(np.uint8).reshape(shp)
            w = np.empty((out_f, in_f), dtype=F32)
            w[:, 0::2] = E2M1[b & 0x0F]
            w[:, 1::2] = E2M1[b >> 4]
            w = w * np.repeat(sc, 32, axis=1)
            return Linear(w.astype(F32), True)
        raise ValueError(f"{path}: {name}: unsupported dtype {dt}")


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------

class Layer:
    pass


class Shared:
    """mirrors: model.py SharedAttentionRuntime - what sources publish for later layers: the
    compressed KV and index keys of the latest kv source, the top-k of the latest index source,
    the candidate mask of the candidate source. Persists across forwards like the reference's."""

    def __init__(self):
        self.compress_kv = None  # the source layer's per-sequence state (rows list)
        self.index_k = None
        self.topk = None  # per query of the current chunk: array of compressed positions
        self.candidates = None  # per query: bool mask over compressed positions


class Model:
    """mirrors: model.py Transformer (+ Block, Attention, Compressor, Indexer, MoE, Engram), world
    size 1, batch 1, text only. The per-sequence state (window KV, compressor tails, compressed rows,
    index keys, the Engram n-gram context) lives in a Sequence; forward() is
    Transformer.forward(input_ids, start_pos)."""

    def __init__(self, folder):
        self.args = a = Args(load_model_args(folder))
        if a.vision_n_layers:
            pass  # vision tensors are not read: text only
        self.check_schedule()
        W = Weights(folder)
        D, H, HD, R = a.dim, a.n_heads, a.head_dim, a.rope_head_dim
        self.embed = W.dense("embed.weight", (a.vocab_size, D))
        self.norm = W.dense("norm.weight", (D,))
        self.head = Linear(W.dense("head.weight", (a.vocab_size, D)), False)
        mix = (2 + a.hc_mult) * a.hc_mult
        self.engram_hash = None
        if a.engram_layer_ids:
            tok_path = os.path.join(folder, "tokenizer.json")
            tmap, cvocab = build_compressed_token_map(Tokenizer(tok_path))
            if cvocab != a.engram_compressed_vocab_size:
                raise ValueError(f"{tok_path}: compressed vocab {cvocab} != config "
                                 f"engram_compressed_vocab_size {a.engram_compressed_vocab_size}")
            self.token_map, self.cvocab = tmap, cvocab
            self.engram_hash = NgramHash(a, tmap, cvocab)
        self.layers = [self.load_block(W, f"layers.{i}.", i) for i in range(a.n_layers)]
        # DSpark stages (mtp.*): only when the config enables them, as Transformer.__init__ does
        self.mtp = []
        if a.dspark_block_size:
            for k in range(a.n_mtp_layers):
                self.mtp.append(self.load_block(W, f"mtp.{k}.", a.n_layers + k))
            self.load_dspark_heads(W)
        self.unused = sorted(n for n in W.st.names() if n not in W.used)

    def load_block(self, W, p, i):
        """mirrors: model.py Block.__init__ (and DSparkBlock's, for i >= n_layers): the tensors of
        one block under prefix p."""
        a = self.args
        D, H, HD, R = a.dim, a.n_heads, a.head_dim, a.rope_head_dim
        mix = (2 + a.hc_mult) * a.hc_mult
        backbone = i < a.n_layers
        n_exp, _ = self.moe_config(i)
        L = Layer()
        L.id = i
        L.n_act = self.moe_config(i)[1]
        L.attn_norm = W.dense(p + "attn_norm.weight", (D,))
        L.ffn_norm = W.dense(p + "ffn_norm.weight", (D,))
        for k in ("attn", "ffn"):
            setattr(L, f"hc_{k}_fn", W.dense(p + f"hc_{k}_fn", (mix, a.hc_mult * D)))
            setattr(L, f"hc_{k}_base", W.dense(p + f"hc_{k}_base", (mix,)))
            setattr(L, f"hc_{k}_scale", W.dense(p + f"hc_{k}_scale", (3,)))
        q = p + "attn."
        L.attn_sink = W.dense(q + "attn_sink", (H,))
        L.wq_a = W.linear(q + "wq_a", a.q_lora_rank, D)
        L.q_norm = W.dense(q + "q_norm.weight", (a.q_lora_rank,))
        L.wq_b = W.linear(q + "wq_b", H * HD, a.q_lora_rank)
        L.wkv = W.linear(q + "wkv", HD, D)
        L.kv_norm = W.dense(q + "kv_norm.weight", (HD,))
        L.wo_a = W.dequantized(q + "wo_a", (a.o_groups * a.o_lora_rank, H * HD // a.o_groups))
        L.wo_b = W.linear(q + "wo_b", D, a.o_groups * a.o_lora_rank)
        L.ratio = a.compress_ratios[i]
        L.is_kv_source = backbone and i in a.kv_source_layers
        L.is_index_source = backbone and i in a.index_source_layers
        if L.ratio:
            L.rope = Rope(precompute_freqs(R, a.original_seq_len, a.compress_rope_theta,
                                           a.rope_factor, a.beta_fast, a.beta_slow))
        else:
            L.rope = Rope(precompute_freqs(R, 0, a.rope_theta, a.rope_factor, a.beta_fast,
                                           a.beta_slow))
        if L.is_kv_source:
            c = q + "compressor."
            L.c_wkv = W.linear(c + "wkv", HD, D, expect_dense=True)
            L.c_wgate = W.linear(c + "wgate", HD, D, expect_dense=True) if L.ratio > 1 else None
            L.c_norm = W.dense(c + "norm.weight", (HD,))
        if L.is_index_source:
            x = q + "indexer."
            L.i_wq_b = W.linear(x + "wq_b", a.index_n_heads * a.index_head_dim, a.q_lora_rank)
            L.i_weights_proj = W.linear(x + "weights_proj", a.index_n_heads, D, expect_dense=True)
            if L.is_kv_source:
                L.i_wk = W.linear(x + "wk", a.index_head_dim, HD, expect_dense=True)
                L.i_k_norm = W.dense(x + "k_norm.weight", (a.index_head_dim,))
        f = p + "ffn."
        L.gate_w = Linear(W.dense(f + "gate.weight", (n_exp, D)), False)
        L.gate_bias = W.dense(f + "gate.bias", (n_exp,))
        L.experts = []
        for e in range(n_exp):
            L.experts.append(tuple(W.linear(f + f"experts.{e}.{n}", o, k) for n, o, k in (
                ("w1", a.moe_inter_dim, D), ("w2", D, a.moe_inter_dim), ("w3", a.moe_inter_dim, D))))
        L.shared = tuple(W.linear(f + f"shared_experts.{n}", o, k) for n, o, k in (
            ("w1", a.moe_inter_dim, D), ("w2", D, a.moe_inter_dim), ("w3", a.moe_inter_dim, D)))
        L.engram = None
        if backbone and i in a.engram_layer_ids:
            g = p + "engram."
            j = a.engram_layer_ids.index(i)
            rows = a.engram_num_embeddings[j]
            ehd = a.engram_head_dim
            tw = W.st.raw(g + "embed.weight")
            ts = W.st.raw(g + "embed.scale")
            if tw[0] != "F8_E4M3" or tuple(tw[1]) != (rows, ehd) or tuple(ts[1]) != (rows, ehd // 32):
                raise ValueError(f"{tw[3]}: {g}embed: {tw[0]} {tw[1]} / {ts[1]}, expected "
                                 f"F8_E4M3 [{rows}, {ehd}] + F8_E8M0 [{rows}, {ehd // 32}]")
            W.used.update([g + "embed.weight", g + "embed.scale"])
            ncols = (a.engram_max_ngram_size - 1) * a.engram_n_heads
            L.engram = dict(
                index=j, rows=rows, table=tw[2], scale=ts[2], head_dim=ehd,
                wkv=W.linear(g + "wkv", D * (a.hc_mult + 1), ncols * ehd),
                weight=(W.dense(g + "q_weight", (a.hc_mult, D)).astype(F64) *
                        W.dense(g + "k_weight", (a.hc_mult, D)).astype(F64)).astype(F32))
        return L

    def moe_config(self, i):
        """mirrors: model.py ModelArgs.get_moe_config - DSpark stages may have their own counts."""
        a = self.args
        if i < a.n_layers:
            return a.n_routed_experts, a.n_activated_experts
        return (a.dspark_n_routed_experts or a.n_routed_experts,
                a.dspark_n_activated_experts or a.n_activated_experts)

    def load_dspark_heads(self, W):
        """mirrors: model.py DSparkBlock.__init__ - stage 0's main_proj/main_norm, the last stage's
        norm, markov head (its own embedding and head over dspark_markov_rank) and confidence head
        (kept fp32, from bf16); the token embedding and head are the backbone's."""
        a = self.args
        D, T, Rk = a.dim, len(a.dspark_target_layer_ids), a.dspark_markov_rank
        if any(a.compress_ratios[a.n_layers + k] for k in range(a.n_mtp_layers)):
            raise ValueError("a DSpark stage has compress ratio > 0 (the reference asserts 0)")
        if not T:
            raise ValueError("DSpark needs dspark_target_layer_ids")
        last = f"mtp.{a.n_mtp_layers - 1}."
        self.ds_main_proj = W.linear("mtp.0.main_proj", D, D * T)
        self.ds_main_norm = W.dense("mtp.0.main_norm.weight", (D,))
        self.ds_norm = W.dense(last + "norm.weight", (D,))
        self.ds_markov_embed = W.dense(last + "markov_head.embed.weight", (a.vocab_size, Rk))
        self.ds_markov_head = Linear(W.dense(last + "markov_head.head.weight", (a.vocab_size, Rk)), False)
        self.ds_confidence = Linear(W.dense(last + "confidence_head.proj.weight", (1, D + Rk)), False)

    def check_schedule(self):
        """The sharing schedule the reference's one-slot SharedAttentionRuntime relies on: each
        compressing layer reads the latest kv source and index source before or at it, and those
        have its compress ratio; kv sources run an indexer; candidate users share the source's ratio."""
        a = self.args
        if len(a.compress_ratios) < a.n_layers:
            raise ValueError(f"compress_ratios has {len(a.compress_ratios)} entries < n_layers {a.n_layers}")
        last_kv = last_ix = None
        for i in range(a.n_layers):
            r = a.compress_ratios[i]
            if i in a.kv_source_layers:
                if not r:
                    raise ValueError(f"kv source layer {i} has compress ratio 0")
                if i not in a.index_source_layers:
                    raise ValueError(f"kv source layer {i} is not an index source")
                last_kv = i
            if i in a.index_source_layers:
                last_ix = i
                if LITERAL_INDEX_K and i not in a.kv_source_layers and r > 1:
                    # the reference's shared index_k is republished only by a kv source that wrote
                    # keys in this forward, so such an indexer would read another layer's keys
                    raise ValueError(f"index source {i} (ratio {r} > 1) is not a kv source")
            if r:
                for what, s in (("kv", last_kv), ("index", last_ix)):
                    if s is None or a.compress_ratios[s] != r:
                        raise ValueError(f"layer {i} (ratio {r}): no earlier {what} source of that ratio")
        cs = a.candidate_source_layer
        if cs >= 0:
            if cs not in a.index_source_layers:
                raise ValueError(f"candidate_source_layer {cs} is not an index source")
            for i in a.index_source_layers:
                if i > cs and a.compress_ratios[i] != a.compress_ratios[cs]:
                    raise ValueError(f"index source {i} uses candidates of layer {cs} with another ratio")

    # ---------------------------------------------------------------------------------------
    def new_sequence(self):
        return Sequence(self)

    def forward(self, seq, tokens, start_pos, all_logits=False):
        """mirrors: model.py Transformer.forward(input_ids, start_pos) for one sequence; tokens are
        positions start_pos.. . Returns float32 logits [len(tokens), vocab] (all_logits) or [vocab]
        of the last position."""
        a = self.args
        assert start_pos == seq.pos, (start_pos, seq.pos)
        n = len(tokens)
        pos = np.arange(start_pos, start_pos + n)
        hashes = None
        if self.engram_hash is not None:
            seq.engram_cache.extend(int(self.token_map[t]) for t in tokens)
            hashes = self.engram_hash.ids(seq.engram_cache, start_pos, n)
        h = self.embed[np.asarray(tokens)]
        h = np.repeat(h[:, None, :], a.hc_mult, axis=1).astype(F32)  # [S, hc, D]
        pre_mix = np.zeros((n, a.hc_mult), dtype=F32)
        pre_mix[:, 0] = 1.0  # mirrors: model.py make_identity_pre_mix
        hidden = []
        for L in self.layers:
            if L.engram is not None:
                h = self.engram(L, h, hashes[:, L.engram["index"], :])
            if L.id in a.dspark_target_layer_ids:  # the attention input of a target layer
                hidden.append(h.astype(F64).mean(axis=1).astype(F32))
            h, pre_mix = self.block(L, seq, h, pos, pre_mix)
        seq.main_hidden = np.concatenate(hidden, axis=-1) if hidden else None
        x = hc_pre(h, pre_mix)
        x = rms_norm(x, self.norm, a.norm_eps)
        seq.pos += n
        if not all_logits:
            x = x[-1:]
        logits = self.head(x)
        return logits if all_logits else logits[0]

    def engram(self, L, h, ids):
        """mirrors: model.py Engram.forward + ParallelEngramEmbedding.forward (world 1): table rows
        dequantized (e4m3 x ue8m0 per 32), ids past the table read as zero rows; wkv -> one key per
        hc copy + a shared value; gate = sigmoid(signed sqrt of the normalised dot of stream and
        key, |dot| floored at 1e-6); h + gate * value."""
        a, E = self.args, L.engram
        S, ncols = ids.shape
        ehd = E["head_dim"]
        rows = np.zeros((S, ncols, ehd), dtype=F32)
        valid = (ids >= 0) & (ids < E["rows"])
        for s in range(S):
            for c in range(ncols):
                if valid[s, c]:
                    r = int(ids[s, c])
                    q = E4M3[np.asarray(E["table"][r * ehd:(r + 1) * ehd])]
                    sc = E8M0[np.asarray(E["scale"][r * (ehd // 32):(r + 1) * (ehd // 32)])]
                    rows[s, c] = q * np.repeat(sc, 32)
        kv = E["wkv"](rows.reshape(S, ncols * ehd))
        D, hc = a.dim, a.hc_mult
        key = kv[:, :hc * D].reshape(S, hc, D).astype(F64)
        value = kv[:, hc * D:].astype(F64)
        x = h.astype(F64)
        eps = a.norm_eps
        rstd = 1.0 / np.sqrt((x * x).mean(-1) + eps) / np.sqrt((key * key).mean(-1) + eps)
        dot = (x * E["weight"].astype(F64) * key).sum(-1) * rstd * D ** -0.5
        gate = 1.0 / (1.0 + np.exp(-np.copysign(np.sqrt(np.maximum(np.abs(dot), 1e-6)), dot)))
        return (x + gate[..., None] * value[:, None, :]).astype(F32)

    def block(self, L, seq, x, pos, pre_mix, attention=None):
        """mirrors: model.py Block.forward - attention takes the stream collapsed by the previous
        sublayer's pre mix; each sublayer's hc_mixes provide post/comb for itself and the pre mix
        of the next sublayer. `attention` replaces Attention.forward (DSparkAttention)."""
        a = self.args
        residual = x
        attn_pre, attn_post, attn_comb = hc_mixes(x, L.hc_attn_fn, L.hc_attn_scale, L.hc_attn_base, a)
        y = hc_pre(x, pre_mix)
        y = rms_norm(y, L.attn_norm, a.norm_eps)
        y = attention(y) if attention is not None else self.attention(L, seq, y, pos)
        x = hc_post(y, residual, attn_post, attn_comb)
        residual = x
        ffn_pre, ffn_post, ffn_comb = hc_mixes(x, L.hc_ffn_fn, L.hc_ffn_scale, L.hc_ffn_base, a)
        y = hc_pre(x, attn_pre)
        y = rms_norm(y, L.ffn_norm, a.norm_eps)
        y = self.moe(L, y, seq)
        x = hc_post(y, residual, ffn_post, ffn_comb)
        return x, ffn_pre

    # ---------------------------------------------------------------------------------------
    def attention(self, L, seq, x, pos):
        """mirrors: model.py Attention.forward (+ _window_kv, _compress_kv, _compress_topk_idxs):
        low-rank q with RoPE; window KV = act_quant(rope(kv_norm(wkv x))); compressed KV and
        indexer top-k when compress_ratio > 0; sparse_attn with sinks; inverse RoPE on the output;
        grouped wo_a then wo_b."""
        a, st = self.args, seq.layers[L.id]
        S, H, HD, R = x.shape[0], a.n_heads, a.head_dim, a.rope_head_dim
        qr = rms_norm(L.wq_a(x), L.q_norm, a.norm_eps)
        q = L.wq_b(qr).reshape(S, H, HD)
        q = L.rope.apply(q, pos, R)
        kv = rms_norm(L.wkv(x), L.kv_norm, a.norm_eps)
        kv = L.rope.apply(kv, pos, R)
        kv = act_quant(kv, 32)
        st["win"].extend(kv)
        sel = [np.zeros(0, dtype=np.int64)] * S
        comp_rows = None
        if L.ratio:
            sel, comp_rows = self.compress_kv(L, seq, x, qr, pos)
        win = a.window_size
        o = np.empty((S, H, HD), dtype=F32)
        scale = HD ** -0.5
        for s in range(S):
            p = int(pos[s])
            rows = [st["win"][t] for t in range(max(0, p - win + 1), p + 1)]
            rows += [comp_rows[j] for j in sel[s]]
            o[s] = sparse_attn(q[s], np.array(rows, dtype=F32), L.attn_sink, scale)
        o = L.rope.apply(o, pos, R, inverse=True)
        G = a.o_groups
        og = o.reshape(S, G, -1).astype(F64)
        wo_a = L.wo_a.reshape(G, a.o_lora_rank, -1).astype(F64)
        y = np.einsum("sgd,grd->sgr", og, wo_a).astype(F32)
        return L.wo_b(y.reshape(S, G * a.o_lora_rank))

    def compress_kv(self, L, seq, x, qr, pos):
        """mirrors: model.py Attention._compress_kv + Compressor.forward: a kv source pools each
        completed group of `ratio` tokens (ratio 1: norm(wkv x); above: per-channel softmax of wgate
        x over the group weighting wkv x, then norm), the indexer sees the latent before RoPE, then
        the latent is rotated at its group's first position and fp4-quantized (e4m3 scales, 16-blocks)
        into the shared compressed KV. Returns the per-query compressed selections and the rows."""
        a, sh, st = self.args, seq.shared, seq.layers[L.id]
        r = L.ratio
        end = int(pos[-1]) + 1
        new_groups, latents = [], []
        if L.is_kv_source:
            if r == 1:
                lat = rms_norm(L.c_wkv(x), L.c_norm, a.norm_eps)
                new_groups = [int(p) for p in pos]
                latents = list(lat)
            else:
                kvt, sct = L.c_wkv(x), L.c_wgate(x)
                for s in range(x.shape[0]):
                    st["tail_kv"].append(kvt[s])
                    st["tail_sc"].append(sct[s])
                    if (int(pos[s]) + 1) % r == 0:
                        k = np.array(st["tail_kv"][-r:], dtype=F64)
                        sc = np.array(st["tail_sc"][-r:], dtype=F64)
                        w = np.exp(sc - sc.max(axis=0))
                        w /= w.sum(axis=0)
                        pooled = (k * w).sum(axis=0).astype(F32)
                        latents.append(rms_norm(pooled, L.c_norm, a.norm_eps))
                        new_groups.append((int(pos[s]) + 1) // r - 1)
                        st["tail_kv"].clear()
                        st["tail_sc"].clear()
            sh.compress_kv = st
            if not LITERAL_INDEX_K:
                sh.index_k = st
        compress_len = end // r
        sel = self.topk_idxs(L, seq, x, qr, pos, latents, new_groups, compress_len)
        if L.is_kv_source and latents:
            lat = np.array(latents, dtype=F32)
            lat = L.rope.apply(lat, np.array(new_groups) * r, a.rope_head_dim)
            lat = fp4_act_quant(lat, 16, e4m3_scale=True)
            st["comp"].extend(lat)
        return sel, sh.compress_kv["comp"]

    def topk_idxs(self, L, seq, x, qr, pos, latents, groups, compress_len):
        """mirrors: model.py Attention._compress_topk_idxs + Indexer.forward + select_candidate_blocks.
        Index sources score every reachable compressed position p (sum over heads of relu(q.k) times
        the head weight; q, k rotated and fp4-quantized with ue8m0 32-blocks), mask positions the query
        has not passed, apply (or publish) the candidate blocks, keep the top index_topk; other
        compressing layers reuse the latest source's choice."""
        a, sh = self.args, seq.shared
        if not L.is_index_source:
            return sh.topk
        S, r = x.shape[0], L.ratio
        if compress_len == 0:
            sh.topk = [np.zeros(0, dtype=np.int64)] * S
            return sh.topk
        IH, ID, R = a.index_n_heads, a.index_head_dim, a.rope_head_dim
        st = seq.layers[L.id]
        if L.is_kv_source and latents:
            k = rms_norm(L.i_wk(np.array(latents, dtype=F32)), L.i_k_norm, a.norm_eps)
            k = L.rope.apply(k, np.array(groups) * r, R)
            st["index_k"].extend(fp4_act_quant(k, 32))
            if LITERAL_INDEX_K:
                sh.index_k = st  # published only when keys were written, as the reference does
        q = L.i_wq_b(qr).reshape(S, IH, ID)
        q = L.rope.apply(q, pos, R)
        q = fp4_act_quant(q, 32)
        K = np.array(sh.index_k["index_k"][:compress_len], dtype=F64)  # [N, ID]
        w = L.i_weights_proj(x).astype(F64) * (ID ** -0.5 * IH ** -0.5)  # [S, IH]
        sc = np.einsum("shd,td->sht", q.astype(F64), K)
        score = (np.maximum(sc, 0) * w[:, :, None]).sum(axis=1)  # [S, N]
        N = compress_len
        lens = (pos + 1) // r  # per query: compressed positions it has passed
        score = score.astype(F32).astype(F64)  # the reference's scores are fp32
        score[np.arange(N)[None, :] >= lens[:, None]] = -np.inf
        cs = a.candidate_source_layer
        if L.id == cs:
            sh.candidates = select_candidate_blocks(score, lens, a.candidate_topk_blocks,
                                                    a.candidate_block_size, seq.stats)
        elif 0 <= cs < L.id:
            score = np.where(sh.candidates[:, :N], score, -np.inf)
        topk = min(a.index_topk, N)
        out = []
        for s in range(S):
            pick = topk_lowest_index_ties(score[s], topk)
            if topk < N and np.isfinite(score[s][pick[-1]]) and \
                    score[s][pick[-1]] == score[s][topk_lowest_index_ties(score[s], topk + 1)[-1]]:
                seq.stats["index_topk_boundary_ties"] += 1
            amb = (~np.isfinite(score[s][pick])) & (pick < lens[s])
            seq.stats["masked_picks_attended"] += int(amb.sum())
            keep = np.sort(pick[pick < lens[s]])  # unreachable -> -1 in the reference: dropped
            out.append(keep)
        sh.topk = out
        return out

    # ---------------------------------------------------------------------------------------
    def dspark_seed(self, seq, main_x, start_pos):
        """mirrors: model.py DSparkAttention.forward's main-KV part - each stage's window KV of the
        main model's positions: act_quant(rope(kv_norm(wkv main_x))) (prefill seeds, a decode step
        adds its position)."""
        pos = np.arange(start_pos, start_pos + main_x.shape[0])
        for L in self.mtp:
            kv = rms_norm(L.wkv(main_x), L.kv_norm, self.args.norm_eps)
            kv = act_quant(L.rope.apply(kv, pos, self.args.rope_head_dim), 32)
            win = seq.mtp[L.id - self.args.n_layers]["win"]
            for j, p in enumerate(pos):
                win[int(p)] = kv[j]

    def dspark_attention(self, L, seq, x, start_pos):
        """mirrors: model.py DSparkAttention.forward (decode) + get_dspark_topk_idxs - the draft block
        (positions start_pos+1..start_pos+block) attends to the stage's window of main KV (positions
        up to start_pos) and to every position of the block itself (no causal mask), with sinks."""
        a = self.args
        B, H, HD, R = x.shape[0], a.n_heads, a.head_dim, a.rope_head_dim
        bpos = np.arange(start_pos + 1, start_pos + 1 + B)
        qr = rms_norm(L.wq_a(x), L.q_norm, a.norm_eps)
        q = L.rope.apply(L.wq_b(qr).reshape(B, H, HD), bpos, R)
        kv = rms_norm(L.wkv(x), L.kv_norm, a.norm_eps)
        kv = act_quant(L.rope.apply(kv, bpos, R), 32)
        win = seq.mtp[L.id - a.n_layers]["win"]
        rows = [win[p] for p in range(max(0, start_pos - a.window_size + 1), start_pos + 1)]
        rows = np.array(rows + list(kv), dtype=F32)
        o = np.stack([sparse_attn(q[b], rows, L.attn_sink, HD ** -0.5) for b in range(B)])
        o = L.rope.apply(o, bpos, R, inverse=True)
        G = a.o_groups
        y = np.einsum("sgd,grd->sgr", o.reshape(B, G, -1).astype(F64),
                      L.wo_a.reshape(G, a.o_lora_rank, -1).astype(F64)).astype(F32)
        return L.wo_b(y.reshape(B, G * a.o_lora_rank))

    def forward_spec(self, seq, token, main_hidden, start_pos):
        """mirrors: model.py Transformer.forward_spec + DSparkBlock.forward_embed / forward /
        forward_head + DSparkMarkovHead + DSparkConfidenceHead, temperature 0 (greedy).
        main_hidden: seq.main_hidden of the main forward at start_pos.. (all prompt rows at
        start_pos 0, one row in a decode step); token: the main model's next token. At start_pos 0
        only the stages' window KV is seeded (returns None); else returns (draft ids
        [block + 1] starting with token, logits [block, vocab] with the markov bias added,
        confidence [block])."""
        a = self.args
        assert self.mtp, "the checkpoint has no DSpark stages (dspark_block_size 0)"
        main_x = rms_norm(self.ds_main_proj(main_hidden), self.ds_main_norm, a.norm_eps)
        if start_pos == 0:
            self.dspark_seed(seq, main_x, 0)
            return None
        assert main_x.shape[0] == 1, "a DSpark decode step takes one main position"
        self.dspark_seed(seq, main_x, start_pos)
        B = a.dspark_block_size
        ids = [int(token)] + [a.dspark_noise_token_id] * (B - 1)
        h = np.repeat(self.embed[np.asarray(ids)][:, None, :], a.hc_mult, axis=1).astype(F32)
        pre_mix = np.zeros((B, a.hc_mult), dtype=F32)
        pre_mix[:, 0] = 1.0
        bpos = np.arange(start_pos + 1, start_pos + 1 + B)
        for L in self.mtp:
            h, pre_mix = self.block(L, seq, h, bpos, pre_mix,
                                    attention=lambda y, L=L: self.dspark_attention(L, seq, y, start_pos))
        x = hc_pre(h, pre_mix)
        logits = self.head(rms_norm(x, self.ds_norm, a.norm_eps))
        out, markov = [int(token)], []
        for i in range(B):
            e = self.ds_markov_embed[out[i]]
            logits[i] = (logits[i].astype(F64) + self.ds_markov_head(e[None, :])[0].astype(F64)).astype(F32)
            markov.append(e)
            out.append(int(np.argmax(logits[i])))
        conf = self.ds_confidence(np.concatenate([x, np.array(markov, dtype=F32)], axis=-1))[:, 0]
        return out, logits, conf

    # ---------------------------------------------------------------------------------------
    def moe(self, L, x, seq):
        """mirrors: model.py MoE.forward + Gate.forward + Expert.forward: scores = x W^T / gate_temp
        through the score function; the bias picks the experts, the raw scores weight them
        (normalised when norm_topk_prob and topk > 1, times route_scale); SwiGLU experts with the
        swiglu_limit clamps (up both sides, gate from above), the routing weight applied before w2;
        plus the shared expert."""
        a = self.args
        S = x.shape[0]
        sc = (L.gate_w(x).astype(F64) / a.gate_temp)
        if a.score_func == "softmax":
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            sc = sc / sc.sum(-1, keepdims=True)
        elif a.score_func == "sigmoid":
            sc = 1.0 / (1.0 + np.exp(-sc))
        else:
            sc = np.sqrt(softplus(sc))
        sc = sc.astype(F32)
        biased = (sc + L.gate_bias).astype(F32)
        y = np.zeros((S, a.dim), dtype=F64)
        k = L.n_act
        for s in range(S):
            idx = topk_lowest_index_ties(biased[s], k)
            srt = np.sort(biased[s].astype(F64))[::-1]
            if k < len(srt) and srt[k - 1] == srt[k]:
                seq.stats["moe_boundary_ties"] += 1
            wts = sc[s][idx].astype(F64)
            if a.norm_topk_prob and k > 1:
                wts = wts / (wts.sum() + 1e-20)
            wts = (wts * a.route_scale).astype(F32)
            for e, wgt in sorted(zip(idx.tolist(), wts.tolist())):
                y[s] += expert(L.experts[e], x[s:s + 1], a.swiglu_limit, F32(wgt))[0]
        y += expert(L.shared, x, a.swiglu_limit, None)
        return y.astype(F32)


def expert(ws, x, limit, weight):
    """mirrors: model.py Expert.forward."""
    w1, w2, w3 = ws
    gate = w1(x).astype(F64)
    up = w3(x).astype(F64)
    if limit > 0:
        up = np.clip(up, -limit, limit)
        gate = np.minimum(gate, limit)
    h = gate / (1.0 + np.exp(-gate)) * up
    if weight is not None:
        h = h * F64(weight)
    return w2(h.astype(F32))


def hc_mixes(x, fn, scale, base, a):
    """mirrors: model.py Block.hc_mixes - the stream flattened to hc*dim, normalised by one rms per
    token (norm_eps), projected by hc_fn, then hc_split_sinkhorn."""
    S = x.shape[0]
    xf = x.reshape(S, -1).astype(F64)
    rs = 1.0 / np.sqrt((xf * xf).mean(-1, keepdims=True) + a.norm_eps)
    mixes = ((xf @ fn.astype(F64).T) * rs).astype(F32)
    return hc_split_sinkhorn(mixes, scale, base, a.hc_mult, a.hc_sinkhorn_iters, a.hc_eps)


def hc_pre(x, pre_mix):
    """mirrors: model.py Block.hc_pre - sum over hc copies weighted by pre_mix."""
    return (pre_mix.astype(F64)[..., None] * x.astype(F64)).sum(axis=1).astype(F32)


def hc_post(y, residual, post, comb):
    """mirrors: model.py Block.hc_post - out[j] = post[j] y + sum_i comb[i, j] residual[i]."""
    out = post.astype(F64)[..., None] * y.astype(F64)[:, None, :] + \
        np.einsum("sij,sid->sjd", comb.astype(F64), residual.astype(F64))
    return out.astype(F32)


def select_candidate_blocks(score, lens, topk_blocks, block, stats):
    """mirrors: model.py select_candidate_blocks - block score = max over its positions (-inf pads
    the last block); the block holding the query's newest reachable position is pinned (+inf); keep
    the top topk_blocks blocks whose score is not -inf. Returns a bool mask [S, N]."""
    S, N = score.shape
    nb = -(-N // block)
    pad = np.full((S, nb * block), -np.inf)
    pad[:, :N] = score
    bs = pad.reshape(S, nb, block).max(axis=-1)
    out = np.zeros((S, N), dtype=bool)
    for s in range(S):
        b = bs[s].copy()
        last = (int(lens[s]) - 1) // block  # floor division: -1 when nothing is reachable
        if 0 <= last < nb:
            b[last] = np.inf
        k = min(topk_blocks, nb)
        pick = topk_lowest_index_ties(b, k)
        if k < nb and np.isfinite(b[pick[-1]]) and b[pick[-1]] == np.sort(b)[::-1][k]:
            stats["candidate_boundary_ties"] += 1
        keep = np.zeros(nb, dtype=bool)
        keep[pick[b[pick] > -np.inf]] = True
        out[s] = np.repeat(keep, block)[:N]
    return out


class Sequence:
    """One sequence's state, as the reference's per-module caches hold it (full history kept)."""

    def __init__(self, model):
        self.pos = 0
        self.engram_cache = []
        self.layers = [dict(win=[], tail_kv=[], tail_sc=[], comp=[], index_k=[]) for _ in model.layers]
        self.mtp = [dict(win={}) for _ in model.mtp]  # DSpark stages: main KV by position
        self.main_hidden = None
        self.shared = Shared()
        self.stats = {"index_topk_boundary_ties": 0, "masked_picks_attended": 0,
                      "candidate_boundary_ties": 0, "moe_boundary_ties": 0}


# --------------------------------------------------------------------------------------------
# Driving it
# --------------------------------------------------------------------------------------------

def run(model, prompt, n_decode, chunk=0):
    """Prefill `prompt` (one chunk from start_pos 0, or chunks of `chunk` tokens), then greedy
    decode. Returns (prefill logits [len(prompt), V], step logits list, greedy ids, stats)."""
    seq = model.new_sequence()
    rows = []
    if chunk <= 0:
        chunk = len(prompt)
    for b in range(0, len(prompt), chunk):
        rows.append(model.forward(seq, prompt[b:b + chunk], b, all_logits=True))
    full = np.concatenate(rows, axis=0)
    steps, greedy = [], []
    row = full[-1]
    for i in range(n_decode):
        tok = int(np.argmax(row))  # lowest id on ties
        steps.append(row)
        greedy.append(tok)
        if i + 1 == n_decode:
            break
        row = model.forward(seq, [tok], seq.pos)
    return full, steps, greedy, seq.stats


def selftest():
    """Hand-checked cases of the number formats and kernels (run by tests/e2e/e2e_v41_oracle.sh)."""
    eq = np.testing.assert_array_equal
    # e4m3fn: ties to even in normals and subnormals, saturation at 448, the 2^-9 quantum below 2^-6
    eq(round_e4m3(np.array([17, 19, 464, -1000, 2.5 * 2 ** -9, 1.5 * 2 ** -9, 0.0137, 0.3 * 256])),
       np.array([16, 20, 448, -448, 2 ** -8, 2 ** -8, 7 * 2 ** -9, 80], dtype=F32))
    # e2m1: ties to the even code, 6 the largest
    eq(round_e2m1(np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 5.1, -0.3])),
       np.array([0, 1, 1, 2, 2, 4, 4, 6, -0.5], dtype=F32))
    eq(pow2_ceil(np.array([1.0, 1.5, 0.75, 2.0 ** -130], dtype=F32)),
       np.array([1, 2, 1, 2.0 ** -126], dtype=F32))
    # the byte tables: 0x7e = 448, 0x01 = 2^-9, 0x7f NaN; e8m0 127 = 1
    assert E4M3[0x7E] == 448 and E4M3[0x01] == 2.0 ** -9 and np.isnan(E4M3[0x7F]) and E8M0[127] == 1
    # act_quant of a block whose amax is 1: scale 2^ceil(log2(1/448)) = 2^-8, 0.3 -> 80/256
    x = np.zeros(32, dtype=F32)
    x[:3] = [1.0, 0.3, -0.001]
    eq(act_quant(x)[:3], np.array([1.0, 0.3125, -0.0009765625], dtype=F32))
    # fp4 with an e4m3 scale: amax 1 -> s = e4m3(1/6) = 0.171875, -1 saturates to -6 s
    y = np.linspace(-1, 1, 16).astype(F32)
    assert fp4_act_quant(y, 16, e4m3_scale=True)[0] == F32(-6 * 0.171875)
    # Sinkhorn: comb close to doubly stochastic, pre in (eps, 1 + eps), post in (0, 2)
    rng = np.random.default_rng(0)
    pre, post, comb = hc_split_sinkhorn(rng.standard_normal((3, 24)), np.ones(3), np.zeros(24), 4, 20, 1e-6)
    assert np.abs(comb.sum(-1) - 1).max() < 1e-3 and np.abs(comb.sum(-2) - 1).max() < 1e-3
    assert (pre > 0).all() and (pre < 1.001).all() and (post > 0).all() and (post < 2).all()
    # sparse_attn: one key, sink -inf -> the value itself; sink equal to the score halves it
    kv = np.array([[1.0, 2.0]], dtype=F32)
    q = np.array([[0.0, 0.0]], dtype=F32)
    eq(sparse_attn(q, kv, np.array([-np.inf], dtype=F32), 1.0), kv)
    eq(sparse_attn(q, kv, np.array([0.0], dtype=F32), 1.0), kv / 2)
    # primes as find_next_prime: per (layer, n-gram) restarting above vocab - 1, never reused
    class A:
        engram_layer_ids, engram_max_ngram_size, engram_n_heads, engram_vocab_size = (0, 1), 3, 2, 100
    assert engram_primes(A) == [[[101, 103], [107, 109]], [[113, 127], [131, 137]]]
    # multipliers: odd, below the bound, and NumPy's own stream
    mult = compute_hash_multipliers((0, 5), 3, 1000)
    assert (mult % 2 == 1).all() and (mult < np.iinfo(np.int64).max // 1000).all()
    eq(mult[1], np.random.default_rng(50035).integers(0, (np.iinfo(np.int64).max // 1000) // 2, 3,
                                                       dtype=np.int64) * 2 + 1)
    # the normaliser: case, accents (Mn and Mc), whitespace runs, a lone space kept
    assert normalize_token_text(" Caf\u00e9\t\n") == "cafe"
    assert normalize_token_text("\u0915\u093e") == "\u0915"  # KA + AA sign (Mc) -> KA
    assert normalize_token_text("  ") == " " and normalize_token_text("\u03a3") == "\u03c3"
    print("v41_ref selftest: ok")


def run_spec(model, prompt, n_decode):
    """The reference's own DSpark driving (model.py __main__, greedy): prefill, seed the stages with
    forward_spec at 0, then per decode step the main forward of one token followed by forward_spec
    at its position. Returns per step (main token, draft ids, draft logits, confidence)."""
    seq = model.new_sequence()
    row = model.forward(seq, prompt, 0)
    tok = int(np.argmax(row))
    model.forward_spec(seq, tok, seq.main_hidden, 0)
    out = []
    for _ in range(n_decode):
        p = seq.pos
        row = model.forward(seq, [tok], p)
        nxt = int(np.argmax(row))
        ids, logits, conf = model.forward_spec(seq, nxt, seq.main_hidden, p)
        out.append((nxt, ids, logits, conf))
        tok = nxt
    return out


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--prompt", help="comma-separated token ids")
    ap.add_argument("--token-map", metavar="TOKENIZER_JSON",
                    help="print the compressed vocab size of a tokenizer.json (and the map with -v)")
    ap.add_argument("-v", action="store_true")
    ap.add_argument("--selftest", action="store_true", help="check the kernels on hand-made cases")
    ap.add_argument("--decode", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=0)
    ap.add_argument("--literal-index-k", action="store_true")
    ap.add_argument("--spec", action="store_true", help="also run the DSpark drafts (forward_spec)")
    o = ap.parse_args()
    global LITERAL_INDEX_K
    LITERAL_INDEX_K = o.literal_index_k
    if o.selftest:
        selftest()
        return
    if o.token_map:
        tmap, n = build_compressed_token_map(Tokenizer(o.token_map))
        print(f"n_tok {len(tmap)} compressed {n} unicode {unicodedata.unidata_version}")
        if o.v:
            print("\n".join(map(str, tmap.tolist())))
        return
    if not o.model or not o.prompt:
        ap.error("MODEL and --prompt are needed")
    m = Model(o.model)
    if m.args.unknown:
        print(f"config keys not read by the reference: {m.args.unknown}", file=sys.stderr)
    if m.unused:
        print(f"tensors not read: {m.unused[:10]}{'...' if len(m.unused) > 10 else ''}", file=sys.stderr)
    prompt = [int(t) for t in o.prompt.split(",")]
    if o.spec:
        for nxt, ids, logits, conf in run_spec(m, prompt, o.decode):
            print(json.dumps({"main": nxt, "draft": ids, "confidence": [float(c) for c in conf]}))
        return
    full, steps, greedy, stats = run(m, prompt, o.decode, o.chunk)
    print(json.dumps({"greedy_ids": greedy, "stats": stats,
                      "last_top5": [[int(i), float(full[-1][i])] for i in np.argsort(-full[-1])[:5]]}))


if __name__ == "__main__":
    main()
