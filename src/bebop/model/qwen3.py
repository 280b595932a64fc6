"""The causal LM (trunk + LM head) of the Qwen3 family and the Qwen3.5 hybrid, Hugging Face weight names.

    model = CausalLM(config)
    hidden = model(input_ids, cache, num_new)   # (B, T, H): last hidden states, AFTER the final norm
    logits = model.logits(hidden)               # (B, T, V)

Without a cache, `forward` runs plain causal attention from position 0 (training, scoring).
With a cache, the chunk is appended per row at each row's length (see kv_cache.py).
The normed hidden state is what an MTP head consumes, as vLLM and SGLang feed it (docs/method.md section 2).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from bebop.errors import BebopError
from bebop.model.config import ModelConfig
from bebop.model.gated_deltanet import GatedDeltaNet, GatedRMSNorm
from bebop.model.hybrid_cache import HybridCache
from bebop.model.kv_cache import KVCache
from bebop.model.layers import RMSNorm, attention_context, trunk_layers
from bebop.model.mtp import MTP_PREFIX, MTPHead
from bebop.model.packed_linear import PackedLinear
from bebop.model.packing import Packing
from bebop.model.weight_files import StoredLayout


def embedding(num: int, dim: int) -> nn.Embedding:
    """nn.Embedding(num, dim); on the meta device (a skeleton whose weights are assigned after) without its N(0, 1)
    fill, which torch runs there through a Python reference that imports dynamo: most of a second of every
    command that loads a model."""
    if torch.get_default_device().type == "meta":  # torch.device's context
        return nn.Embedding(num, dim, _weight=torch.empty(num, dim))  # weight [num, dim], unfilled
    return nn.Embedding(num, dim)


class Qwen3Model(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(trunk_layers(cfg))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.rms_norm_offset)


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Qwen3Model(cfg)
        self.lm_head = PackedLinear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.mtp = MTPHead(cfg) if cfg.mtp_num_hidden_layers else None
        self.stored = StoredLayout()  # set by load_model: what the input held that a save gives back
        self._state_dtype = "float32"  # by name: a graph saved with its guards pickles the module's attributes

    @classmethod
    def from_state_dict(cls, cfg: ModelConfig, state: dict[str, torch.Tensor], *, strict: bool = True) -> CausalLM:
        """A model whose tensors ARE `state`'s (bebop names; assigned, not copied, never initialised):
        built on the meta device, loaded, and the LM head re-tied to the embedding when the config ties them."""
        with torch.device("meta"):
            model = cls(cfg)
        model.load_state_dict(state, strict=strict, assign=True)
        if cfg.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        return model

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def state_dtype(self) -> torch.dtype:
        """The dtype a hybrid's caches keep its linear layers' recurrent states in: float32 (transformers' precision,
        the default) or bfloat16 (vLLM's default, its mamba_ssm_cache_dtype "auto" for a bfloat16 model: half the
        bytes each decode step streams); the rule computes in float32 either way (HybridCache checks it)."""
        return getattr(torch, self._state_dtype)

    @state_dtype.setter
    def state_dtype(self, dtype: torch.dtype) -> None:
        self._state_dtype = str(dtype).removeprefix("torch.")

    def init_weights(self, generator: torch.Generator | None = None, std: float = 0.02,
                     prefix: str = "") -> None:
        """Hugging Face's Qwen3 initialisation: N(0, std) for linear and embedding, norms at unit
        scale. `prefix` limits it to one part (e.g. MTP_PREFIX)."""
        with torch.no_grad():
            for name, module in self.named_modules():
                if not name.startswith(prefix):
                    continue
                if isinstance(module, RMSNorm):
                    module.weight.fill_(1.0 - module.offset)
                elif isinstance(module, GatedRMSNorm):
                    module.weight.fill_(1.0)
                elif isinstance(module, GatedDeltaNet):  # transformers': A ~ U(1, 16), dt_bias = 1
                    module.A_log.copy_(torch.empty_like(module.A_log).uniform_(1, 16, generator=generator).log())
                    module.dt_bias.fill_(1.0)
                elif isinstance(module, (nn.Linear, nn.Embedding, nn.Conv1d)):
                    module.weight.normal_(0.0, std, generator=generator)
                    if isinstance(module, nn.Linear) and module.bias is not None:  # nn.Embedding has no bias
                        module.bias.zero_()

    def attach_mtp(self, num_layers: int = 1, generator: torch.Generator | None = None, *,
                   intermediate_size: int = 0) -> None:
        """Add a freshly initialised MTP head with `num_layers` layers (replacing any); `intermediate_size` its
        MLP width (0: the trunk's, the layout engines load)."""
        if num_layers < 1:
            raise BebopError(f"an MTP head needs at least 1 layer, got {num_layers}")
        if intermediate_size < 0:
            raise BebopError(f"an MTP head's intermediate size must be >= 0 (0: the trunk's), got {intermediate_size}")
        self.config = replace(self.config, mtp_num_hidden_layers=num_layers, mtp_intermediate_size=intermediate_size)
        self.mtp = MTPHead(self.config).to(device=self.device, dtype=self.dtype)
        self.init_weights(generator, prefix=MTP_PREFIX)

    def head_parameters(self) -> list[nn.Parameter]:
        """The MTP head's parameters (mtp.*; empty without a head)."""
        return [p for name, p in self.named_parameters() if name.startswith(MTP_PREFIX)]

    def trunk_parameters(self) -> list[nn.Parameter]:
        """Everything but the head: embeddings, decoder layers, final norm, LM head (shared with the head)."""
        return [p for name, p in self.named_parameters() if not name.startswith(MTP_PREFIX)]

    def require_mtp(self) -> MTPHead:
        if self.mtp is None:
            raise BebopError("this model has no MTP head (no mtp.* weights); add one with `bebop mtp init --model DIR`")
        return self.mtp

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def mtp_logits(self, mtp_hidden: torch.Tensor) -> torch.Tensor:
        """MTP output (..., H), after its norm -> draft logits (..., V) float32 (shared LM head)."""
        return self.lm_head(mtp_hidden).float()

    def new_cache(self, batch_size: int, capacity: int, *, rollback: bool = True) -> KVCache:
        """A KV cache of the attention layers; a HybridCache (also the linear layers' states) for a hybrid.
        rollback=False: a cache never rolled back into its last chunk (a prefill's scratch)."""
        cfg = self.config
        if cfg.linear_layers:
            return HybridCache(cfg, batch_size, capacity, dtype=self.dtype, device=self.device, rollback=rollback,
                               state_dtype=self.state_dtype)
        return KVCache(cfg.num_hidden_layers, batch_size, cfg.num_key_value_heads, cfg.head_dim,
                       capacity, dtype=self.dtype, device=self.device)

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None = None,
                num_new: torch.Tensor | None = None, packing: Packing | None = None) -> torch.Tensor:
        """input_ids (B, T) -> hidden (B, T, H) after the final norm.

        With a cache, row b appends its first num_new[b] tokens (default: all T). With a packing (no cache;
        model/packing.py), input_ids is its (1, N) sequence of rows that share prompts."""
        b, t = input_ids.shape
        if packing is not None:
            positions = self._packed_positions(input_ids, cache, packing)  # (1, N)
        elif cache is None:
            positions = torch.arange(t, device=input_ids.device).expand(b, t)  # (B, T)
            if t > self.config.max_position_embeddings:
                raise BebopError(f"sequence of {t} tokens exceeds the context ({self.config.max_position_embeddings})")
        else:
            if cache.batch_size != b:
                raise BebopError(f"batch of {b} rows does not match the cache's {cache.batch_size}")
            positions = cache.positions(t)  # (B, T)
        x = self.model.embed_tokens(input_ids)  # (B, T, H)
        ctx = attention_context(positions, cache, self.config.rotary_dim, self.config.rope_theta, x.dtype)
        ctx.packing = packing
        if cache is not None:
            if num_new is None:
                num_new = torch.full((b,), t, dtype=torch.long, device=input_ids.device)
            ctx.num_new = num_new
        for layer in self.model.layers:
            x = layer(x, ctx)
        if cache is not None:
            assert num_new is not None
            cache.advance(num_new, t)
        return self.model.norm(x)

    def _packed_positions(self, input_ids: torch.Tensor, cache: KVCache | None, packing: Packing) -> torch.Tensor:
        """The packing's positions (1, N), once the call is one it can serve."""
        if cache is not None:
            raise BebopError("a packed forward runs without a cache")
        if input_ids.shape != packing.ids.shape:
            raise BebopError(f"input ids {tuple(input_ids.shape)} are not the packing's {tuple(packing.ids.shape)}")
        if int(packing.positions.max()) >= self.config.max_position_embeddings:
            raise BebopError(f"a packed row of {int(packing.positions.max()) + 1} tokens exceeds the context "
                             f"({self.config.max_position_embeddings})")
        return packing.positions

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (..., H) after the final norm -> logits (..., V) in float32."""
        return self.lm_head(hidden).float()
