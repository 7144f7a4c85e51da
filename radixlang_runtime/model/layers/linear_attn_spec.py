"""LinearAttnSpec: what a hybrid config.json (Qwen3-Next, Qwen3.5) asks of its Gated DeltaNet layers
(model/layers/gated_deltanet.py runs them), and the size of one request's recurrent state.

Layers are "linear_attention" (Gated DeltaNet: a recurrent state, no KV) or "full_attention" (gated softmax
attention over the paged KV pool). layer_types from config.json, else transformers' default: every
full_attention_interval-th layer (1-based) is full attention.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from radixlang_runtime.model.layers.recurrent_spec import RecurrentSpec

LAYER_TYPES = ("linear_attention", "full_attention")


@dataclass(frozen=True)
class LinearAttnSpec(RecurrentSpec):
    """linear_layers: per layer, Gated DeltaNet (True) or full attention (False)."""

    num_k_heads: int  # linear_num_key_heads
    num_v_heads: int  # linear_num_value_heads (a multiple of num_k_heads)
    k_head_dim: int  # linear_key_head_dim
    v_head_dim: int  # linear_value_head_dim
    conv_kernel: int  # linear_conv_kernel_dim: the causal depthwise convolution's width

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: q and k (num_k_heads x k_head_dim each), then v."""
        return 2 * self.num_k_heads * self.k_head_dim + self.num_v_heads * self.v_head_dim

    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """One layer's state of one request: the DeltaNet matrix [Hv, Dk, Dv] (float32) and the conv window
        [conv_dim, conv_kernel - 1] (the last inputs the next token's convolution reads)."""
        return (self.num_v_heads, self.k_head_dim, self.v_head_dim), (self.conv_dim, self.conv_kernel - 1)

    def split(self, size: int) -> "LinearAttnSpec":
        """One rank's share with tensor parallelism over `size` ranks (as SGLang splits it): num_k_heads / size key
        heads and the num_v_heads / size value heads that read them, their conv channels, their state; ValueError
        when the key heads do not divide."""
        if self.num_k_heads % size:
            raise ValueError(f"tp_size {size} cannot split {self.num_k_heads} linear-attention key heads "
                             "(linear_num_key_heads must be a multiple of tp_size)")
        return replace(self, num_k_heads=self.num_k_heads // size, num_v_heads=self.num_v_heads // size)

    def rank_channels(self, size: int, rank: int) -> tuple[range, range, range]:
        """Rank `rank`'s conv channels (= in_proj's q/k/v rows) of the whole layer, as the (q, k, v) ranges of
        `rank`'s key and value heads; z's rows are the v range shifted to 0, b's and a's its heads."""
        part = self.split(size)
        kd, vd = part.num_k_heads * self.k_head_dim, part.num_v_heads * self.v_head_dim
        key_dim = self.num_k_heads * self.k_head_dim
        return (range(rank * kd, (rank + 1) * kd), range(key_dim + rank * kd, key_dim + (rank + 1) * kd),
                range(2 * key_dim + rank * vd, 2 * key_dim + (rank + 1) * vd))


def parse_linear_attn(cfg: dict, arch: str) -> LinearAttnSpec:
    """config.json's linear-attention fields with transformers' defaults; ValueError names what is not honoured."""
    n = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if types is None:
        interval = int(cfg.get("full_attention_interval", 4))
        if interval < 1:
            raise ValueError(f"full_attention_interval {interval} must be >= 1 ({arch})")
        types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)]
    unknown = sorted(set(types) - set(LAYER_TYPES))
    if unknown:
        raise ValueError(f"layer_types entry {unknown[0]!r} is not supported ({arch}: {', '.join(LAYER_TYPES)})")
    if len(types) != n:
        raise ValueError(f"layer_types has {len(types)} entries for {n} layers ({arch})")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} is not supported ({arch}: SiLU MLPs and convolution)")
    spec = LinearAttnSpec(
        linear_layers=tuple(t == "linear_attention" for t in types),
        num_k_heads=int(cfg.get("linear_num_key_heads", 16)), num_v_heads=int(cfg.get("linear_num_value_heads", 32)),
        k_head_dim=int(cfg.get("linear_key_head_dim", 128)), v_head_dim=int(cfg.get("linear_value_head_dim", 128)),
        conv_kernel=int(cfg.get("linear_conv_kernel_dim", 4)))
    if spec.num_v_heads % spec.num_k_heads:
        raise ValueError(f"linear_num_value_heads {spec.num_v_heads} must be a multiple of linear_num_key_heads "
                         f"{spec.num_k_heads} ({arch})")
    if spec.conv_kernel < 2:
        raise ValueError(f"linear_conv_kernel_dim {spec.conv_kernel} must be >= 2 ({arch})")
    return spec
