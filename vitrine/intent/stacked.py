"""An ensemble of Qwen2 sequence classifiers as one forward, the members on a leading axis.

The shipped intent classifier is an ensemble of small ``Qwen2ForSequenceClassification`` models
whose probabilities are averaged. Run one after another, each member is a few hundred tiny
operators whose cost is dispatch, not arithmetic (~0.8 ms per member in onnxruntime at batch 1).
:class:`StackedQwen2` carries the members' activations on a leading member axis: norms, rotary
positions, attention and the head run once for all members (their small weights stacked), so an
ensemble of M costs about one member's operator count (``vitrine bench intent``). The projections
(q|k|v side by side, o, gate|up side by side, down) stay one 2D matrix per member, split off the
member axis and concatenated back: onnxruntime packs a constant 2D MatMul weight once at load,
while a stacked 3D weight was packed again on every call (1.3 ms more CPU per query at batch 1).

It is a serving form, not a model format: it is built from the trained members (which persist
as config.json + safetensors) and is checked against transformers' own forward of each member
before use (:func:`export_stacked`). It reproduces Qwen2's decoder exactly: RMSNorm,
rotary positions, grouped-query causal attention with q/k/v biases, SiLU-gated MLP, and the
sequence head read at the last real token. Inputs are right-padded (every query ends with EOS),
so under causal attention no real token ever sees a pad: the causal mask alone is exact.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from vitrine import onnxrt
from vitrine.errors import ModelError, VitrineError
from vitrine.intent.model import EOS, PAD, UNK

if TYPE_CHECKING:  # pragma: no cover
    from vitrine.intent.member import IntentMember

log = logging.getLogger(__name__)

# A member is a transformers Qwen2ForSequenceClassification; these config fields must agree.
_SHAPE_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "rms_norm_eps", "hidden_act", "max_position_embeddings")


def _rope_theta(cfg: Any) -> float:
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict) and rp.get("rope_theta") is not None:
        return float(rp["rope_theta"])
    return float(getattr(cfg, "rope_theta", 10000.0))


class StackedQwen2(nn.Module):
    """``forward(rows, last) -> probabilities``: ``rows`` [M, B, T] are each member's embedding
    rows for B right-padded queries (already offset into the concatenated table, see
    :attr:`row_offsets`), ``last`` [B] the index of each query's last real token. Returns the
    members' mean softmax, [B, labels]."""

    # buffers (register_buffer); the per-layer ones are read by name with getattr
    embed: torch.Tensor
    final_norm: torch.Tensor
    score: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    causal: torch.Tensor

    def __init__(self, nets: list[Any]) -> None:
        super().__init__()
        if not nets:
            raise ModelError("a stacked ensemble needs at least one member")
        cfg = nets[0].config
        for n in nets[1:]:
            diff = [f for f in _SHAPE_FIELDS if getattr(n.config, f, None) != getattr(cfg, f, None)]
            if diff or _rope_theta(n.config) != _rope_theta(cfg):
                raise ModelError(f"ensemble members differ in {diff or ['rope_theta']}: cannot stack them")
        if cfg.hidden_act != "silu":
            raise ModelError(f"stacked Qwen2 supports the silu activation, not {cfg.hidden_act}")
        self.n_members = len(nets)
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(cfg.num_key_value_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.eps = float(cfg.rms_norm_eps)
        self.n_layers = int(cfg.num_hidden_layers)

        def stack(get: Any, transpose: bool = False) -> torch.Tensor:
            ws = [get(n).detach().float() for n in nets]
            return torch.stack([w.t() if transpose else w for w in ws]).contiguous()

        tables = [n.model.embed_tokens.weight.detach().float() for n in nets]
        self.row_offsets = np.cumsum([0] + [t.shape[0] for t in tables[:-1]]).astype(np.int64)
        self.register_buffer("embed", torch.cat(tables).contiguous())
        nh, nkv, d = self.n_heads, self.n_kv, self.head_dim
        self.qkv_split = [nh * d, nkv * d, nkv * d]
        self.mlp_split = [int(cfg.intermediate_size)] * 2
        for i in range(self.n_layers):
            def layer(n: Any, i: int = i) -> Any:
                return n.model.layers[i]
            if layer(nets[0]).self_attn.o_proj.bias is not None:
                raise ModelError("stacked Qwen2 expects o_proj without bias (as Qwen2 has)")
            for name, get in (  # vectors broadcast over the flattened tokens: [M, 1, dim]
                ("in_norm", lambda n: layer(n).input_layernorm.weight),
                ("post_norm", lambda n: layer(n).post_attention_layernorm.weight),
                ("bqkv", lambda n: torch.cat([layer(n).self_attn.q_proj.bias, layer(n).self_attn.k_proj.bias,
                                              layer(n).self_attn.v_proj.bias])),
            ):
                self.register_buffer(f"l{i}_{name}", stack(get).unsqueeze(1))
            # projections: one 2D [in, out] matrix per member (onnxruntime pre-packs a constant 2D
            # MatMul weight once; a stacked 3D one is re-packed on every call), q|k|v and gate|up
            # side by side so that each member reads its input once per pair
            for j, n in enumerate(nets):
                a, mlp = layer(n).self_attn, layer(n).mlp
                for name, ws in (("qkv", (a.q_proj, a.k_proj, a.v_proj)), ("o", (a.o_proj,)),
                                 ("gu", (mlp.gate_proj, mlp.up_proj)), ("down", (mlp.down_proj,))):
                    w = torch.cat([x.weight.detach().float() for x in ws]).t().contiguous()
                    self.register_buffer(f"l{i}_{name}_{j}", w)
        self.register_buffer("final_norm", stack(lambda n: n.model.norm.weight).unsqueeze(1))
        self.register_buffer("score", stack(lambda n: n.score.weight, True))
        n_pos = int(cfg.max_position_embeddings)
        inv = 1.0 / (_rope_theta(cfg) ** (torch.arange(0, self.head_dim, 2, dtype=torch.int64).float()
                                           / self.head_dim))
        freqs = torch.outer(torch.arange(n_pos, dtype=torch.float32), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())
        self.register_buffer("causal", torch.triu(torch.full((n_pos, n_pos), float("-inf")), diagonal=1))
        self.max_positions = n_pos

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin

    def _each(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """``x`` [M, N, in] times each member's own 2D weight ``{name}_{j}``: [M, N, out]."""
        return torch.cat([torch.matmul(p, getattr(self, f"{name}_{j}"))
                          for j, p in enumerate(x.split(1, dim=0))], dim=0)

    def forward(self, rows: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        m, b, t = rows.shape
        d, nh, nkv = self.head_dim, self.n_heads, self.n_kv
        x = self.embed[rows.reshape(m, b * t)]                       # [M, B*T, H]
        cos, sin = self.cos[:t], self.sin[:t]                        # [T, d]
        mask = self.causal[:t, :t]
        for i in range(self.n_layers):
            h = self._norm(x, getattr(self, f"l{i}_in_norm"))
            q, k, v = (self._each(h, f"l{i}_qkv") + getattr(self, f"l{i}_bqkv")).split(self.qkv_split, dim=-1)
            q = q.reshape(m, b, t, nh, d).transpose(2, 3)
            k = k.reshape(m, b, t, nkv, d).transpose(2, 3)
            v = v.reshape(m, b, t, nkv, d).transpose(2, 3)
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
            if nh != nkv:  # grouped-query attention: each key/value head serves nh/nkv query heads
                k = k.repeat_interleave(nh // nkv, dim=2)
                v = v.repeat_interleave(nh // nkv, dim=2)
            att = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * (d ** -0.5) + mask, dim=-1)
            o = torch.matmul(att, v).transpose(2, 3).reshape(m, b * t, nh * d)
            x = x + self._each(o, f"l{i}_o")
            h = self._norm(x, getattr(self, f"l{i}_post_norm"))
            g, u = self._each(h, f"l{i}_gu").split(self.mlp_split, dim=-1)
            x = x + self._each(nn.functional.silu(g) * u, f"l{i}_down")
        x = self._norm(x, self.final_norm).reshape(m, b, t, -1)
        pooled = x[:, torch.arange(b), last]                         # [M, B, H]
        logits = torch.matmul(pooled, self.score)                    # [M, B, labels]
        return torch.softmax(logits, dim=-1).mean(0)


def stack_inputs(member_rows: list[list[list[int]]], offsets: np.ndarray, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """``member_rows[m][b]``: member m's embedding rows for query b (each ending with EOS).
    Returns the [M, B, T] offset rows (pads filled with each member's own pad row) and ``last`` [B]."""
    n_m, n_b = len(member_rows), len(member_rows[0])
    width = max(len(r) for r in member_rows[0])
    out = np.empty((n_m, n_b, width), dtype=np.int64)
    for mi, rows in enumerate(member_rows):
        out[mi].fill(pad + int(offsets[mi]))
        for bi, r in enumerate(rows):
            out[mi, bi, : len(r)] = np.asarray(r, dtype=np.int64) + offsets[mi]
    last = np.fromiter((len(r) - 1 for r in member_rows[0]), dtype=np.int64, count=n_b)
    return out, last


class RowTable:
    """Query token ids -> the stacked graph's inputs in one gather per query: what
    :func:`stack_inputs` builds from each member's :meth:`IntentModel.rows`, without running
    every member's lookup in Python. ``row_of[m]`` is member m's id -> row table (all the same
    length); ids are given already clipped to the members' (equal) token limit."""

    def __init__(self, row_of: list[np.ndarray], offsets: np.ndarray, *, pad: int, unk: int, eos: int) -> None:
        if len({len(r) for r in row_of}) != 1:
            raise ModelError("ensemble members have id tables of different lengths")
        off = np.asarray(offsets, dtype=np.int64)
        self.table = np.stack([np.asarray(r, dtype=np.int64) + o for r, o in zip(row_of, off)])  # [M, V]
        self.pad, self.unk, self.eos = pad + off, unk + off, eos + off

    def __call__(self, ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        n_v = self.table.shape[1]
        width = max(len(i) for i in ids) + 1
        out = np.empty((len(self.table), len(ids), width), dtype=np.int64)
        out[:] = self.pad[:, None, None]
        for b, i in enumerate(ids):
            a = np.asarray(i, dtype=np.int64)
            ok = (a >= 0) & (a < n_v)
            rows = self.table[:, np.clip(a, 0, n_v - 1)]
            out[:, b, : len(i)] = rows if ok.all() else np.where(ok, rows, self.unk[:, None])
            out[:, b, len(i)] = self.eos
        return out, np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))


def export_stacked(members: list[IntentMember], onnx_dir: Path | None,
                   threads: int) -> tuple[onnxrt.OnnxModule, np.ndarray]:
    """``members`` (the first one's tokenizer reads the queries) as one checked onnxruntime graph of
    their mean probabilities, cached in ``onnx_dir``; returns it with its row offsets. Raises
    :class:`~vitrine.errors.ModelError` when the stacked form disagrees with the members."""
    net = StackedQwen2([c.model.model for c in members]).eval()
    texts = ("women red heels under 1500", "x", "这个耳机和AirPods Pro 2比，降噪强吗？", "nike vs puma running shoes",
             "how do I return these sandals", "what goes with a navy blazer for a wedding in june " * 4)
    probes = []
    for batch in (texts[:1], texts[1:2], texts[2:3], texts):
        ids = [members[0].token_ids(t) for t in batch]
        rows, last = stack_inputs([[c.model.rows(i).rows for i in ids] for c in members], net.row_offsets, PAD)
        with torch.inference_mode():
            got = net(torch.from_numpy(rows), torch.from_numpy(last)).numpy()
        want = np.mean([c.model.probabilities([c.model.rows(i) for i in ids]) for c in members], axis=0)
        if got.shape != want.shape or float(np.abs(got - want).max()) > 1e-5:
            raise ModelError(f"the stacked ensemble disagrees with its members on {batch[0]!r}")
        probes.append((torch.from_numpy(rows), torch.from_numpy(last)))
    key = "intent-stacked-2d:" + ",".join(str(c.model.config.get("weights_sha256") or c.model.config.get("name", "intent"))
                                          for c in members)
    graph = onnxrt.OnnxModule.export(
        net, probes[0], key=key, cache_dir=onnx_dir,
        input_names=["rows", "last"], dynamic_axes={"rows": {1: "batch", 2: "tokens"}, "last": {0: "batch"},
                                                    "out": {0: "batch"}},
        probes=probes, atol=1e-5, threads=threads)
    return graph, net.row_offsets


def row_table(members: list[IntentMember], offsets: np.ndarray) -> RowTable | None:
    """Every member's rows in one gather, when the members share the token limit and the id
    table's length (else None: each member looks up its own rows)."""
    if len({c.model.max_tokens for c in members}) != 1:
        return None
    try:
        return RowTable([c.model.row_of for c in members], offsets, pad=PAD, unk=UNK, eos=EOS)
    except VitrineError as e:
        log.info("intent ensemble looks up each member's rows: %s", e)
        return None
