"""Gated DeltaNet linear attention (the Qwen3.5 hybrid's `linear_attention` layers), pure PyTorch.

Per value head, a recurrent state S (Dk, Dv) is decayed, corrected toward the new value by the
delta rule, and read by the query (q, k L2-normalised, q scaled by 1/sqrt(Dk)):

    S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T      o_t = S_t^T q_t
    g_t = -exp(A_log) softplus(a_t + dt_bias) <= 0,   beta_t = sigmoid(b_t)

q, k, v come from one projection through a causal depthwise conv1d (kernel K, SiLU), so a cached
decode also keeps each row's last K-1 conv inputs. The output is RMS-normed per head, gated by
silu(z) and projected back. Two equal forms: `recurrent_rule` (token by token: decoding, and a
verify of K+1 drafts, whose state after every position it keeps; on a CPU also a prefill, keeping
only its end) and `chunked_rule` (chunks of CHUNK tokens in a few matmuls: training, and prefills
where the CPU kernel is not). Parameter names are Hugging Face's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bebop.model import gdn_kernel
from bebop.model.config import ModelConfig
from bebop.model.context import AttentionContext
from bebop.model.packed_linear import PackedLinear
from bebop.model.packing import Rows

CHUNK = 64  # tokens per chunk of chunked_rule
# chunks up to this many tokens (decode steps, verifies of up to MAX_K drafts) run recurrently and keep every
# position's state, in a buffer the cache reuses; longer ones (prefills) run the chunked form
SNAPSHOT_MAX = 16


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def recurrent_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   state: torch.Tensor, out: torch.Tensor | None = None, *,
                   every_position: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k (B, Hv, T, Dk) normed and scaled, v (B, Hv, T, Dv), g, beta (B, Hv, T), all float32, and state
    (B, Hv, Dk, Dv), float32 or bfloat16 -> outputs (B, Hv, T, Dv) float32 and the states after each position
    (T, B, Hv, Dk, Dv) in the state's dtype, written into `out` when given (storage the cache reuses;
    position-major, so each position's states are one contiguous block). The arithmetic is float32; a bfloat16
    state is rounded as each position's is written, and the next position reads the rounded one, as the next
    decode step would. every_position=False: the states after the last position only, (1, B, Hv, Dk, Dv) (a
    prefill's end), bit for bit the last of every position's.

    The state is the large operand (Dk x Dv a head): each position reads it once (k^T S and q^T S in one
    matmul; the decay is a scalar a head, applied to what was read) and writes the next one in place in
    the states tensor, with no state-sized temporaries. On a CPU the same rule runs as gdn_kernel's C++ kernel,
    which reads and writes each state tile once."""
    b, h, t, dk = k.shape
    kept = t if every_position else 1  # positions whose states are returned
    states = state.new_empty(kept, b, h, dk, state.shape[-1]) if out is None else out  # (T or 1, B, Hv, Dk, Dv)
    assert states.shape == (kept, b, h, dk, state.shape[-1]), (states.shape, state.shape)
    kernel = gdn_kernel.cpu_kernel() if gdn_kernel.fits(q, v, state, given=out is not None) else None
    if kernel is not None and states.is_contiguous():  # the same rule, each state tile read and written once
        outputs = v.new_empty(v.shape)  # (B, Hv, T, Dv)
        kernel(q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(), state.contiguous(),
               states, outputs)
        return outputs, states
    decay = g.exp()[..., None]  # (B, Hv, T, 1)
    qk = (q * k).sum(-1, keepdim=True)  # (B, Hv, T, 1)
    probes = torch.stack([k, q], dim=3)  # (B, Hv, T, 2, Dk)
    outs = []
    wide = state.dtype == torch.float32  # else a bfloat16 state, widened to compute and rounded as written
    for i in range(t):
        s = state if i == 0 else states[i - 1 if every_position else 0]  # (B, Hv, Dk, Dv)
        s = s if wide else s.float()
        read = probes[:, :, i] @ s  # (B, Hv, 2, Dv): k^T S and q^T S
        e = decay[:, :, i]  # (B, Hv, 1)
        delta = (v[:, :, i] - e * read[:, :, 0]) * beta[:, :, i, None]  # (B, Hv, Dv)
        outs.append(e * read[:, :, 1] + qk[:, :, i] * delta)  # q^T (e S + k delta^T)
        nxt = states[i if every_position else 0]  # updated in place when only the end is kept
        if wide:
            torch.mul(s, e[..., None], out=nxt)
            nxt.addcmul_(k[:, :, i, :, None], delta[:, :, None, :])  # e S + k delta^T
        else:
            nxt.copy_(torch.addcmul(s * e[..., None], k[:, :, i, :, None], delta[:, :, None, :]))
    return torch.stack(outs, dim=2), states


def chunked_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same rule over chunks of CHUNK tokens (the UT transform of the DeltaNet papers): same
    inputs as `recurrent_rule` -> outputs (B, Hv, T, Dv) and the final state (B, Hv, Dk, Dv). A sequence
    shorter than CHUNK is one chunk of its own length (no padding to CHUNK)."""
    b, h, t, dk = k.shape
    size = min(CHUNK, t)  # tokens a chunk
    pad = (size - t % size) % size
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (0, pad)) for x in (g, beta))  # padded steps: no decay, no update
    n = (t + pad) // size
    q, k, v = (x.reshape(b, h, n, size, x.shape[-1]) for x in (q, k, v))  # (B, Hv, N, C, D)
    k_beta, v_beta = k * beta.reshape(b, h, n, size, 1), v * beta.reshape(b, h, n, size, 1)
    decay = g.reshape(b, h, n, size).cumsum(-1)  # (B, Hv, N, C): log decay from the chunk start
    upper = torch.ones(size, size, dtype=torch.bool, device=q.device).triu(1)
    pair = (decay[..., :, None] - decay[..., None, :]).masked_fill(upper, float("-inf")).exp()  # (B, Hv, N, C, C)
    system = (k_beta @ k.transpose(-1, -2)) * pair  # its strictly lower part: how earlier updates interfere
    lower = torch.tril(system, -1) + torch.eye(size, dtype=q.dtype, device=q.device)  # (B, Hv, N, C, C)
    new_v = torch.linalg.solve_triangular(lower, v_beta, upper=False, unitriangular=True)  # (B, Hv, N, C, Dv)
    k_decayed = torch.linalg.solve_triangular(lower, k_beta * decay.exp()[..., None], upper=False, unitriangular=True)
    intra = (q @ k.transpose(-1, -2)) * pair  # (B, Hv, N, C, C), causal within the chunk
    q_decayed = q * decay.exp()[..., None]
    k_tail = k * (decay[..., -1:] - decay).exp()[..., None]  # decay from each position to the chunk's end
    out = torch.empty_like(new_v)
    for i in range(n):
        u = new_v[:, :, i] - k_decayed[:, :, i] @ state  # (B, Hv, C, Dv): the corrections this chunk writes
        out[:, :, i] = q_decayed[:, :, i] @ state + intra[:, :, i] @ u
        state = state * decay[:, :, i, -1, None, None].exp() + k_tail[:, :, i].transpose(-1, -2) @ u
    return out.reshape(b, h, n * size, -1)[:, :, :t], state


class GatedRMSNorm(nn.Module):
    """Per-head RMSNorm (weight w, not 1 + w) of the rule's output, then a silu(z) gate."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype)
        return (h * F.silu(z.float())).to(dtype)


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: ModelConfig, slot: int) -> None:
        super().__init__()
        self.slot = slot  # index among the linear layers: this layer's states in a HybridCache
        self.num_k_heads, self.num_v_heads = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.key_dim, self.value_dim = self.num_k_heads * self.dk, self.num_v_heads * self.dv
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.kernel = cfg.linear_conv_kernel_dim
        h = cfg.hidden_size
        self.in_proj_qkv = PackedLinear(h, self.conv_dim, bias=False)
        self.in_proj_z = PackedLinear(h, self.value_dim, bias=False)
        self.in_proj_b = PackedLinear(h, self.num_v_heads, bias=False)
        self.in_proj_a = PackedLinear(h, self.num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.kernel, groups=self.conv_dim, bias=False,
                                padding=self.kernel - 1)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = PackedLinear(self.value_dim, h, bias=False)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """x (B, T, H) -> (B, T, H). With a cache (a HybridCache), continues each row from its saved
        conv and recurrent states and stages the new ones (the cache picks them when it advances)."""
        b, t, _ = x.shape
        if ctx.packing is not None:
            return self._packed(x, ctx.packing.rows)
        qkv = self.in_proj_qkv(x).transpose(1, 2)  # (B, C, T)
        linear = getattr(ctx.cache, "linear", None)  # a HybridCache's or a compiled step's view of it
        if linear is None:
            window = F.pad(qkv, (self.kernel - 1, 0))  # (B, C, K-1+T): zero history
            state = qkv.new_zeros(b, self.num_v_heads, self.dk, self.dv, dtype=torch.float32)
        else:
            conv_state, state = linear.state(self.slot)  # (B, C, K-1), (B, Hv, Dk, Dv)
            window = torch.cat([conv_state.to(qkv.dtype), qkv], dim=-1)  # (B, C, K-1+T)
        every_position = linear is not None and linear.snapshots and t <= SNAPSHOT_MAX  # a step or verify
        q, k, v = self._qkv(F.silu(self._conv(window, every_position)))  # (B, Hv, T, Dk|Dv)
        g, beta = self._gates(self.in_proj_a(x), self.in_proj_b(x))  # (B, Hv, T)
        if linear is not None and every_position:  # every position's state: rollback-able
            out, states = recurrent_rule(q, k, v, g, beta, state, linear.staging(self.slot, t))
            linear.stage(self.slot, window, states, state, every_position=True)
        else:
            if linear is not None and ctx.num_new is not None:  # a ragged chunk: rows stop at num_new
                keep = (torch.arange(t, device=x.device)[None] < ctx.num_new[:, None])[:, None]  # (B, 1, T)
                g, beta = g * keep, beta * keep
            if linear is not None and gdn_kernel.cpu_kernel() is not None and gdn_kernel.fits(q, v, state, given=True):
                # a cached chunk on a CPU (a prefill): the kernel, token by token, keeping only the end, faster than
                # the chunked form's matmuls at every length measured (docs/benchmarks.md); in a prefill's scratch
                # (never rolled back into) written over the state it started from, which a row without tokens in the
                # chunk keeps (g = 0, beta = 0: the state unchanged)
                given = None if linear.snapshots or not state.is_contiguous() else state[None]
                out, ends = recurrent_rule(q, k, v, g, beta, state, given, every_position=False)  # (1, B, Hv, Dk, Dv)
            else:
                out, final = chunked_rule(q, k, v, g, beta, state.float())
                ends = final.to(state.dtype)[None]
            if linear is not None:
                linear.stage(self.slot, window, ends, state, every_position=False)
        return self._output(out.transpose(1, 2), x)

    def _output(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The rule's output (B, T, Hv, Dv) of the layer's input x (B, T, H) -> (B, T, H): normed, gated, projected."""
        b, t, _ = x.shape
        out = self.norm(out.to(x.dtype), self.in_proj_z(x).view(b, t, self.num_v_heads, self.dv))
        return self.out_proj(out.reshape(b, t, self.value_dim))

    def _qkv(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The conv's activated output (B, C, T) -> q, k (B, Hv, T, Dk) normed (q scaled), v (B, Hv, T, Dv), float32."""
        b, _, t = mixed.shape
        q, k, v = mixed.transpose(1, 2).split((self.key_dim, self.key_dim, self.value_dim), dim=-1)
        q, k = (self._heads(y, self.num_k_heads, self.dk) for y in (q, k))  # (B, Hv, T, Dk)
        return l2norm(q) * self.dk ** -0.5, l2norm(k), v.reshape(b, t, self.num_v_heads, self.dv).transpose(1, 2).float()

    def _gates(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """in_proj_a's and in_proj_b's outputs (B, T, Hv) -> the log decay g and the write strength beta (B, Hv, T)."""
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        return g.transpose(1, 2), b.float().sigmoid().transpose(1, 2)

    def _packed(self, x: torch.Tensor, rows: Rows) -> torch.Tensor:
        """x (1, N, H) of a packed sequence (model/packing.py) -> (1, N, H): each prompt from a zero state and no
        conv history, each continuation from its prompt's final state and last K-1 conv inputs. Projections run on
        the N tokens; the conv and the chunked rule along padded rows, padding neither decaying nor writing."""
        flat = [proj(x)[0] for proj in (self.in_proj_qkv, self.in_proj_a, self.in_proj_b)]  # (N, C), (N, Hv) x2

        def along(index: torch.Tensor, lens: torch.Tensor, history: torch.Tensor, state: torch.Tensor):
            qkv, a, b = (y[index] for y in flat)  # (S, T, C), (S, T, Hv) x2
            window = torch.cat([history, qkv.transpose(1, 2)], dim=-1)  # (S, C, K-1+T)
            keep = (torch.arange(index.shape[1], device=x.device)[None] < lens[:, None])[:, None]  # (S, 1, T)
            g, beta = self._gates(a, b)
            out, final = chunked_rule(*self._qkv(F.silu(self._conv(window, False))), g * keep, beta * keep, state)
            return out.transpose(1, 2).flatten(0, 1), window, final  # (S * T, Hv, Dv)

        g_rows = rows.prompts.shape[0]
        zeros = x.new_zeros(g_rows, self.conv_dim, self.kernel - 1)  # (G, C, K-1): no history
        state = x.new_zeros(g_rows, self.num_v_heads, self.dk, self.dv, dtype=torch.float32)
        out_p, window, final = along(rows.prompts, rows.prompt_lens, zeros, state)
        at = rows.prompt_lens[rows.continuation_prompt, None] + torch.arange(self.kernel - 1, device=x.device)
        history = window[rows.continuation_prompt].gather(2, at[:, None].expand(-1, self.conv_dim, -1))  # (R, C, K-1)
        out_c, _, _ = along(rows.continuations, rows.continuation_lens, history, final[rows.continuation_prompt])
        out = torch.cat([out_p, out_c]).index_select(0, rows.places)  # (N, Hv, Dv)
        return self._output(out[None], x)

    def _conv(self, window: torch.Tensor, every_position: bool) -> torch.Tensor:
        """The causal depthwise conv of a chunk's window (B, C, K-1+T) -> (B, C, T). A chunk that keeps every
        position's state (a decode step, a verify) sums its K taps a position in float32, each position alike
        whatever the chunk's length (a graph fuses it; at one token the library's conv cost more to call than to
        compute); any other (a prefill, a forward without a cache) runs conv1d, several times faster eagerly."""
        if not every_position:
            return F.conv1d(window, self.conv1d.weight, groups=self.conv_dim)
        taps = window.unfold(-1, self.kernel, 1)  # (B, C, T, K)
        return (taps.float() * self.conv1d.weight[:, 0, None, :].float()).sum(-1).to(window.dtype)

    def _heads(self, y: torch.Tensor, heads: int, dim: int) -> torch.Tensor:
        """(B, T, heads * dim) -> (B, Hv, T, dim) float32, each key head repeated for its value heads."""
        b, t, _ = y.shape
        y = y.reshape(b, t, heads, dim).transpose(1, 2).float()
        return y.repeat_interleave(self.num_v_heads // heads, dim=1) if heads != self.num_v_heads else y
