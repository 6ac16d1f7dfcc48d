"""Mixture-of-experts feed-forward: a router sends each token to a few of N expert feed-forwards.

Routing (``routing``):

* ``top_k`` (token choice; Shazeer et al. 2017, GShard, Switch with k = 1, Mixtral with k = 2):
  each token goes to the k experts with the highest router probabilities, its output is their
  outputs weighted by those probabilities (renormalised over the k when ``normalize``: Mixtral;
  the raw probability: Switch). ``capacity_factor`` c caps each expert at
  ``ceil(c * tokens * k / N)`` assignments per forward; assignments over capacity are dropped in
  priority order (every token's first choice before any second choice, earlier tokens first: GShard),
  and a token dropped by all its experts passes through the layer's residual unchanged. ``None`` is
  dropless (Mixtral, MegaBlocks): every assignment is computed.
* ``expert_choice`` (Zhou et al. 2022): each expert takes the ``ceil(c * tokens / N)`` tokens that
  rate it highest (c = ``capacity_factor``, default k), so a token gets zero to N experts. The
  choice compares tokens across the batch, so it suits encoders, not causal decoding.

Scores (``scoring``): ``softmax`` over the N router logits, or ``sigmoid`` of each logit alone
(DeepSeek-V3: each expert's affinity on its own; the k chosen are renormalised when ``normalize``, with
1e-20 added to the sum). DeepSeek-V3's options (DeepSeek-AI 2024, section 2.1.2), each off by default:

* ``choice_bias``: a per-expert bias (the buffer ``expert_bias`` [N], fp32, in the state dict and
  checkpoints) added to the scores for choosing the k experts only; the gates are the unbiased scores.
  With ``bias_update_rate`` g > 0 it is the auxiliary-loss-free load balancing: training forwards count
  each expert's assignments (``expert_load``, not saved), and :meth:`MoE.update_choice_bias`, called after
  every optimizer step (``training/trainer.py``'s ``ExpertBiasUpdate``, with the counts summed over ranks),
  moves each bias by g towards balance (down by g for an expert above the mean load, up by g below it);
* group-limited routing (``groups`` n, ``group_top_k`` m): the experts form n equal groups, each group scores
  the sum of its two best (biased) scores, and a token chooses its k experts among the m best groups alone
  (DeepSeek-V3 limits each token to 4 of 8 groups, i.e. nodes);
* ``routed_scaling``: a factor on the routed experts' gates (2.5 in DeepSeek-V3).

The router reads the layer's hidden states, or with ``router_input: word`` the stack's input (the
token embeddings: HunYuan-NLP routes by the word vector, which keeps a token's expert stable across
training). Router logits are computed in fp32 (Switch's selective precision). Shared experts (one
dense or gated feed-forward every token passes through, DeepSeek-MoE / Qwen-MoE) are added to the
routed output; with ``shared_gate`` (Qwen-MoE) their output is first scaled per token by
``sigmoid(shared_gate(x))``, a Linear(H, 1) without bias.

Auxiliary losses (returned by :meth:`MoE.pop_aux`, already weighted): ``moe_balance``, the
load-balancing loss ``N * sum_e f_e P_e`` (Switch, eq. 4), with f_e the fraction of token-expert
assignments routed to e before capacity and P_e the mean router probability of e (1 when routing is
uniform, whatever k; not used with expert choice, which is balanced by construction; with sigmoid
scores P_e is the mean of each token's scores divided by their sum, DeepSeek-V3's sequence-wise
balance loss taken over the batch); ``moe_z``, the
router z-loss ``mean(logsumexp(logits)^2)`` (ST-MoE, Zoph et al. 2022). Metric ``moe_dropped``: the
fraction of assignments over capacity (expert choice: of tokens no expert took).

Experts are held as stacked tensors (``experts.gate``/``up`` [N, F, H], ``experts.down`` [N, H, F]) and
computed per expert on the gathered rows of its tokens (one matmul per expert; no loop over tokens).
Padding positions are not routed and do not count in the losses.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pentad.layers.activations import get_activation
from pentad.layers.block import Block, InitScheme, init_linear
from pentad.layers.feed_forward import FeedForward

Routing = Literal["top_k", "expert_choice"]
RouterInput = Literal["hidden", "word"]
Scoring = Literal["softmax", "sigmoid"]


class Experts(nn.Module):
    """N feed-forwards of width F as stacked weights: ``gate`` (gated only) and ``up`` [N, F, H],
    ``down`` [N, H, F]; biases ``up_bias`` [N, F], ``down_bias`` [N, H] when ``bias``."""

    def __init__(self, num_experts: int, hidden_size: int, ffn_size: int, activation: str, bias: bool, gated: bool):
        super().__init__()
        self.num_experts, self.ffn_size = num_experts, ffn_size
        self.gate = nn.Parameter(torch.empty(num_experts, ffn_size, hidden_size)) if gated else None
        self.up = nn.Parameter(torch.empty(num_experts, ffn_size, hidden_size))
        self.down = nn.Parameter(torch.empty(num_experts, hidden_size, ffn_size))
        self.up_bias = nn.Parameter(torch.zeros(num_experts, ffn_size)) if bias else None
        self.down_bias = nn.Parameter(torch.zeros(num_experts, hidden_size)) if bias else None
        self.act = get_activation(activation)

    def reset_parameters(self, std: float = 0.02, scheme: InitScheme = "normal") -> None:
        hidden = self.up.shape[2]
        in_std, out_std = (std, std) if scheme == "normal" else (hidden ** -0.5, self.ffn_size ** -0.5)
        for weight in (self.gate, self.up):
            if weight is not None:
                nn.init.normal_(weight, std=in_std)
        nn.init.normal_(self.down, std=out_std)
        for bias in (self.up_bias, self.down_bias):
            if bias is not None:
                nn.init.zeros_(bias)

    def one(self, x: Tensor, e: int) -> Tensor:
        """Expert ``e`` on rows x [n, H] -> [n, H]."""
        up = F.linear(x, self.up[e], self.up_bias[e] if self.up_bias is not None else None)
        h = self.act(F.linear(x, self.gate[e])) * up if self.gate is not None else self.act(up)
        return F.linear(h, self.down[e], self.down_bias[e] if self.down_bias is not None else None)

    def batched(self, x: Tensor) -> Tensor:
        """Every expert on its own rows at once: x [N, n, H] -> [N, n, H] (batched matmuls)."""
        up = torch.bmm(x, self.up.transpose(1, 2))
        if self.up_bias is not None:
            up = up + self.up_bias[:, None]
        h = self.act(torch.bmm(x, self.gate.transpose(1, 2))) * up if self.gate is not None else self.act(up)
        out = torch.bmm(h, self.down.transpose(1, 2))
        return out + self.down_bias[:, None] if self.down_bias is not None else out


class MoE(Block):
    """[B,S,H] -> [B,S,H]: routed experts (see the module docstring) plus optional shared experts.

    ``forward(x, padding_mask [B,S] | None, router_input [B,S,H] | None)``; the last two come from
    the stack (``routed``). Parameters: ``router.weight`` [N, H], ``experts.*``, ``shared.*``,
    ``shared_gate.weight`` [1, H]; buffer ``expert_bias`` [N] with ``choice_bias``.
    """

    routed = True
    has_aux = True
    expert_bias: Tensor | None  # buffers (register_buffer), declared for the type checker
    expert_load: Tensor | None

    def __init__(self, hidden_size: int, ffn_size: int, num_experts: int, top_k: int = 2, *,
                 activation: str = "silu", bias: bool = False, gated: bool = True, routing: Routing = "top_k",
                 capacity_factor: float | None = None, normalize: bool = True, router_input: RouterInput = "hidden",
                 shared_ffn_size: int = 0, shared_gate: bool = False, balance_loss_weight: float = 0.01,
                 z_loss_weight: float = 0.0, scoring: Scoring = "softmax", choice_bias: bool = False,
                 bias_update_rate: float = 0.0, groups: int = 1, group_top_k: int | None = None,
                 routed_scaling: float = 1.0):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k {top_k} must be between 1 and num_experts {num_experts}")
        group_top_k = groups if group_top_k is None else group_top_k
        if num_experts % groups or not 1 <= group_top_k <= groups or \
                (groups > 1 and (num_experts // groups < 2 or top_k > group_top_k * (num_experts // groups))):
            raise ValueError(f"{num_experts} experts in {groups} groups, {group_top_k} groups per token and top_k "
                             f"{top_k}: the groups must be equal, of 2 experts or more, and hold the k chosen")
        if bias_update_rate and not choice_bias:
            raise ValueError("bias_update_rate updates the choice bias: it needs choice_bias")
        if routing == "expert_choice" and (scoring != "softmax" or choice_bias or groups > 1):
            raise ValueError("sigmoid scores, the choice bias and group-limited routing choose experts per token "
                             "(routing top_k)")
        self.scoring, self.groups, self.group_top_k = scoring, groups, group_top_k
        self.routed_scaling, self.bias_update_rate = routed_scaling, bias_update_rate
        self.register_buffer("expert_bias", torch.zeros(num_experts) if choice_bias else None)
        self.register_buffer("expert_load", torch.zeros(num_experts) if bias_update_rate else None, persistent=False)
        self.num_experts, self.top_k, self.routing = num_experts, top_k, routing
        self.capacity_factor, self.normalize, self.router_input = capacity_factor, normalize, router_input
        self.balance_loss_weight, self.z_loss_weight = balance_loss_weight, z_loss_weight
        self.router = nn.Linear(hidden_size, num_experts, bias=False)
        self.experts = Experts(num_experts, hidden_size, ffn_size, activation, bias, gated)
        self.shared = FeedForward(hidden_size, shared_ffn_size, activation, bias, gated) if shared_ffn_size else None
        if shared_gate and self.shared is None:
            raise ValueError("shared_gate needs shared experts (shared_ffn_size > 0)")
        self.shared_gate = nn.Linear(hidden_size, 1, bias=False) if shared_gate else None
        self._aux: tuple[dict[str, Tensor], dict[str, Tensor]] = ({}, {})

    def reset_parameters(self, std: float = 0.02, scheme: InitScheme = "normal") -> None:
        if scheme == "normal":
            init_linear(self.router, std)
        else:
            nn.init.normal_(self.router.weight, std=self.router.weight.shape[1] ** -0.5)
        self.experts.reset_parameters(std, scheme)
        if self.shared is not None:
            self.shared.reset_parameters(std, scheme)
        if self.shared_gate is not None:
            if scheme == "normal":
                init_linear(self.shared_gate, std)
            else:
                nn.init.normal_(self.shared_gate.weight, std=self.shared_gate.weight.shape[1] ** -0.5)

    def pop_aux(self) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        aux, self._aux = self._aux, ({}, {})
        return aux

    def update_choice_bias(self, load: Tensor | None = None) -> None:
        """The auxiliary-loss-free balancing step: each expert's choice bias moves by ``bias_update_rate``
        towards balance, down for an expert assigned more than the mean, up for one assigned fewer
        (``load``: the assignments counted since the last update, summed over ranks; default this rank's
        ``expert_load``), and the count starts again. Nothing moves when nothing was counted."""
        if self.expert_load is None or self.expert_bias is None:
            return
        load = self.expert_load if load is None else load
        with torch.no_grad():  # no count: mean - load is zero, and so is the step (no host sync to ask)
            self.expert_bias.add_(self.bias_update_rate * torch.sign(load.mean() - load).to(self.expert_bias))
            self.expert_load.zero_()

    def capacity(self, tokens: int) -> int | None:
        """Assignments one expert takes per forward of ``tokens`` tokens (None: unlimited)."""
        if self.routing == "expert_choice":
            factor = self.capacity_factor if self.capacity_factor is not None else float(self.top_k)
            return min(tokens, max(1, math.ceil(factor * tokens / self.num_experts)))
        if self.capacity_factor is None:
            return None
        return max(1, math.ceil(self.capacity_factor * tokens * self.top_k / self.num_experts))

    def forward(self, x: Tensor, padding_mask: Tensor | None = None, router_input: Tensor | None = None) -> Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        source = router_input if self.router_input == "word" and router_input is not None else x
        route = source.reshape(-1, shape[-1])
        rows = None
        if padding_mask is not None:
            rows = (~padding_mask.reshape(-1)).nonzero().squeeze(1)
            flat, route = flat.index_select(0, rows), route.index_select(0, rows)
        if flat.shape[0] == 0:  # every position is padding: zeros, with every parameter in the graph
            self._aux = ({}, {})
            out = torch.zeros_like(x) + 0.0 * sum(p.sum() for p in self.parameters() if p.requires_grad)
            return out + self._shared(x) if self.shared is not None else out
        logits = F.linear(route.float(), self.router.weight.float())  # [T, N] in fp32
        probs = logits.softmax(dim=-1) if self.scoring == "softmax" else logits.sigmoid()
        if self.routing == "expert_choice":
            out, metrics = self._expert_choice(flat, probs)
            losses: dict[str, Tensor] = {}
        else:
            out, losses, metrics = self._top_k(flat, probs)
        if self.z_loss_weight:
            losses["moe_z"] = self.z_loss_weight * torch.logsumexp(logits, dim=-1).pow(2).mean()
        self._aux = (losses, metrics)
        if rows is not None:
            out = torch.zeros(shape[0] * shape[1], shape[-1], dtype=out.dtype, device=out.device).index_copy(
                0, rows, out)
        out = out.reshape(shape)
        if self.shared is not None:
            out = out + self._shared(x)
        return out

    def _shared(self, x: Tensor) -> Tensor:
        """The shared experts' output [B,S,H], gated per token when ``shared_gate``."""
        shared = self.shared(x)
        return torch.sigmoid(self.shared_gate(x)) * shared if self.shared_gate is not None else shared

    def choose(self, probs: Tensor) -> tuple[Tensor, Tensor]:
        """Each token's k experts [T, k] and their gates [T, k] from its scores ``probs`` [T, N]: the k
        best scores (plus the choice bias, among the best groups) choose, the unbiased scores gate, renormalised
        when ``normalize``, times ``routed_scaling``."""
        k = self.top_k
        choice = probs if self.expert_bias is None else probs + self.expert_bias
        if self.groups > 1:
            grouped = choice.view(choice.shape[0], self.groups, -1)
            best = grouped.topk(2, dim=-1).values.sum(dim=-1).topk(self.group_top_k, dim=-1).indices  # [T, m]
            allowed = torch.zeros(grouped.shape[:2], dtype=torch.bool, device=probs.device).scatter_(1, best, True)
            choice = grouped.masked_fill(~allowed[..., None], float("-inf")).view_as(choice)
        if choice is probs:
            top_p, top_e = probs.topk(k, dim=-1)
        else:
            top_e = choice.topk(k, dim=-1).indices
            top_p = probs.gather(1, top_e)
        if self.normalize:
            total = top_p.sum(dim=-1, keepdim=True)
            top_p = top_p / (total + 1e-20 if self.scoring == "sigmoid" else total)
        return top_e, top_p * self.routed_scaling if self.routed_scaling != 1.0 else top_p

    def _top_k(self, x: Tensor, probs: Tensor) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
        tokens, k, n = x.shape[0], self.top_k, self.num_experts
        top_e, gates = self.choose(probs)  # [T, k]
        if self.expert_load is not None and self.training:
            self.expert_load.add_(torch.bincount(top_e.reshape(-1), minlength=n).to(self.expert_load))
        affinity = probs if self.scoring == "softmax" else probs / probs.sum(dim=-1, keepdim=True)
        # assignments in priority order: every token's first choice, then every second choice
        expert = top_e.t().reshape(-1)  # [k T]
        token = torch.arange(tokens, device=x.device).repeat(k)
        gate = gates.t().reshape(-1)
        onehot = F.one_hot(expert, n)  # [k T, N]
        fraction = onehot.float().mean(dim=0)  # f_e: share of assignments (before capacity), sums to 1
        losses = {"moe_balance": self.balance_loss_weight * n * (fraction * affinity.mean(dim=0)).sum()} \
            if self.balance_loss_weight else {}
        capacity = self.capacity(tokens)
        if capacity is not None:
            slot = (onehot.cumsum(dim=0) * onehot).sum(dim=-1) - 1  # place in its expert's queue
            kept = (slot < capacity).nonzero().squeeze(1)
            dropped = 1.0 - kept.numel() / max(1, expert.numel())
            expert, token, gate = expert[kept], token[kept], gate[kept]
        else:
            dropped = 0.0
        order = expert.argsort(stable=True)
        expert, token, gate = expert[order], token[order], gate[order]
        counts = torch.bincount(expert, minlength=n).tolist()  # one host sync per layer: the split sizes
        # with gradients, every expert runs, an idle one on no rows: its parameters stay in the graph with zero
        # gradients (ddp expects a gradient for every parameter); without, idle experts are skipped (decoding
        # one token touches k of N)
        everyone = torch.is_grad_enabled()
        routed = torch.cat([self.experts.one(chunk, e)
                            for e, chunk in enumerate(x.index_select(0, token).split(counts)) if everyone or counts[e]])
        out = torch.zeros_like(x).index_add_(0, token, (routed * gate[:, None].to(routed.dtype)).to(x.dtype))
        return out, losses, {"moe_dropped": torch.tensor(dropped, device=x.device)}

    def _expert_choice(self, x: Tensor, probs: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        tokens = x.shape[0]
        capacity = self.capacity(tokens)
        gate, token = probs.topk(capacity, dim=0)  # [C, N]: each expert's tokens
        token, gate = token.t(), gate.t()  # [N, C]
        routed = self.experts.batched(x[token])  # [N, C, H]
        out = torch.zeros_like(x).index_add_(0, token.reshape(-1),
                                             (routed * gate[..., None].to(routed.dtype)).reshape(-1, x.shape[1])
                                             .to(x.dtype))
        taken = torch.zeros(tokens, dtype=torch.bool, device=x.device)
        taken[token.reshape(-1)] = True
        return out, {"moe_dropped": 1.0 - taken.float().mean()}
