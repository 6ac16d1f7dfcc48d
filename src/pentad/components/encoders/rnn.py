"""Recurrent encoders: ``rnn``, ``lstm``, ``gru`` (one stack, optionally bidirectional) and
``birnn``, ``bilstm``, ``bigru`` (two separate one-way stacks, ELMo style).

Architecture and parameter layout follow TencentPretrain's ``rnn_encoder.py``: a batch-first
``nn.RNN`` / ``nn.LSTM`` / ``nn.GRU`` with dropout between stacked layers and on the output; a
bidirectional stack gives each direction ``hidden_size / 2`` units so that the output is
``hidden_size`` wide; the ``bi*`` encoders run a forward stack (``rnn_forward.*``) and a backward
stack (``rnn_backward.*``) of ``hidden_size / 2`` units each and concatenate their outputs
(Peters et al. 2018). The parameter names are TencentPretrain's, so checkpoints map one to one.

Unlike TencentPretrain, padding never reaches a real position. Each row is reordered so that its
real tokens come first (in reading order for the forward direction, in reverse order for the
backward one), the recurrence runs, and the outputs are put back in place; padding positions
output zeros. A backward stream therefore starts at each row's last real token, and rows padded on
the left behave as if they were unpadded. The reordering needs no host synchronisation; only a
bidirectional single stack (``bidirectional: true``) has to pack its sequences, which reads the
row lengths on the host once per batch.

Incremental decoding (a key/value ``cache``) is not supported.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import Field
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from pentad.components.base import Encoder
from pentad.config.base import StrictModel
from pentad.layers.dropout import Dropout
from pentad.registry import ENCODERS

# The recurrent cell of each registered name (and of its ``bi`` twin).
CELLS: dict[str, type[nn.RNNBase]] = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}


def input_width(model: Any) -> int:
    """Width of the embedding output: the optional ``model.embedding_size``, else ``hidden_size``.

    The recurrent and convolutional encoders read the embedding at its own width (TencentPretrain's
    ``emb_size``) and map it to ``hidden_size`` themselves; they say so with the class attribute
    ``takes_embedding_width = True``, so the embedding slot must not project to ``hidden_size``.
    """
    return getattr(model, "embedding_size", None) or model.hidden_size


def real_first_order(padding_mask: Tensor, reverse: bool = False) -> Tensor:
    """Per-row permutation [B,S] that lists a row's real positions first, then its padding.

    Real positions are in reading order, or in reverse order when ``reverse`` (so a recurrence over
    the permuted row starts at the last real token). padding_mask [B,S] bool, True = padding.
    """
    seq_len = padding_mask.shape[1]
    position = torch.arange(seq_len, device=padding_mask.device)
    key = (seq_len - 1 - position) if reverse else position
    # Unique keys, so the sort needs no stability: real positions get 0..S-1, padding S..2S-1.
    key = key + seq_len * padding_mask.long()
    return key.argsort(dim=1)


def _permute(hidden: Tensor, order: Tensor) -> Tensor:
    """hidden [B,S,D] gathered along S by order [B,S]."""
    return hidden.gather(1, order[..., None].expand(-1, -1, hidden.shape[-1]))


def _unpermute(hidden: Tensor, order: Tensor) -> Tensor:
    """Inverse of ``_permute``: puts row element i back at position order[b, i]."""
    index = order[..., None].expand(-1, -1, hidden.shape[-1])
    return hidden.new_zeros(hidden.shape).scatter(1, index, hidden)


def _no_cache(name: str, cache: Any) -> None:
    if cache is not None:
        raise ValueError(f"the '{name}' encoder does not support incremental decoding (a key/value cache); "
                         "generate without a cache or use a transformer encoder")


# ----------------------------------------------------------------------------------- configs
class RecurrentConfigBase(StrictModel):
    """Options shared by the one-stack recurrent encoders (``rnn``, ``lstm``, ``gru``)."""

    num_layers: int = Field(2, ge=1, description="stacked recurrent layers")
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="between stacked layers and on the output")
    bidirectional: bool = Field(False, description="run both directions, hidden_size / 2 units each")

    def check(self, model: Any) -> list[tuple[str, str]]:
        """Problems that need the model-level sizes: (sub-path, message)."""
        if self.bidirectional and model.hidden_size % 2:
            return [("bidirectional", f"hidden_size {model.hidden_size} is odd; a bidirectional encoder "
                                      "gives each direction hidden_size / 2 units")]
        return []


class RnnEncoderConfig(RecurrentConfigBase):
    type: Literal["rnn"] = "rnn"


class LstmEncoderConfig(RecurrentConfigBase):
    type: Literal["lstm"] = "lstm"


class GruEncoderConfig(RecurrentConfigBase):
    type: Literal["gru"] = "gru"


class BiRecurrentConfigBase(StrictModel):
    """Options shared by the two-stack encoders (``birnn``, ``bilstm``, ``bigru``)."""

    num_layers: int = Field(2, ge=1, description="stacked recurrent layers in each direction")
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="between stacked layers and on the output")

    def check(self, model: Any) -> list[tuple[str, str]]:
        if model.hidden_size % 2:
            return [("type", f"hidden_size {model.hidden_size} is odd; the forward and backward stacks "
                             "get hidden_size / 2 units each")]
        return []


class BirnnEncoderConfig(BiRecurrentConfigBase):
    type: Literal["birnn"] = "birnn"


class BilstmEncoderConfig(BiRecurrentConfigBase):
    type: Literal["bilstm"] = "bilstm"


class BigruEncoderConfig(BiRecurrentConfigBase):
    type: Literal["bigru"] = "bigru"


# ---------------------------------------------------------------------------------- encoders
class RecurrentEncoder(Encoder):
    """One recurrent stack: [B,S,E] -> [B,S,H]. Parameters ``rnn.weight_ih_l0``, ... (``_reverse``
    for the backward direction when bidirectional), as ``torch.nn.RNN``/``LSTM``/``GRU`` name them."""

    cell: ClassVar[str]
    takes_embedding_width: ClassVar[bool] = True  # see input_width

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 2, dropout: float = 0.1,
                 bidirectional: bool = False):
        super().__init__()
        if bidirectional and hidden_size % 2:
            raise ValueError(f"hidden_size {hidden_size} must be even for a bidirectional encoder")
        self.bidirectional = bidirectional
        # torch applies the inter-layer dropout only between layers (and warns for one layer).
        self.rnn = CELLS[self.cell](input_size, hidden_size // 2 if bidirectional else hidden_size,
                                    num_layers, batch_first=True,
                                    dropout=dropout if num_layers > 1 else 0.0, bidirectional=bidirectional)
        self.dropout = Dropout(dropout)

    @classmethod
    def from_config(cls, cfg: RecurrentConfigBase, model: Any) -> RecurrentEncoder:
        return cls(input_width(model), model.hidden_size, cfg.num_layers, cfg.dropout, cfg.bidirectional)

    def reset_parameters(self) -> None:
        """torch's default: uniform(-1/sqrt(units), 1/sqrt(units)) (as TencentPretrain)."""
        self.rnn.reset_parameters()

    def forward(self, hidden: Tensor, padding_mask: Tensor | None, prefix_lengths: Tensor | None = None,
                positions: Tensor | None = None, cache: Any = None) -> Tensor:
        """hidden [B,S,E], padding_mask [B,S] (True = padding) or None -> [B,S,H]; padding outputs 0.

        ``prefix_lengths`` and ``positions`` are ignored (a recurrence has its own order).
        """
        _no_cache(self.registry_name, cache)
        self.rnn.flatten_parameters()  # one contiguous weight block for cuDNN after moves / loads
        if padding_mask is None:
            output, _ = self.rnn(hidden)
            return self.dropout(output)
        order = real_first_order(padding_mask)
        compact = _permute(hidden, order)
        if self.bidirectional:
            # The reverse direction of one stack starts at the end of the row, so it must be told
            # where each row ends. Empty rows run one step (on padding; its output is zeroed).
            lengths = (~padding_mask).sum(dim=1).clamp(min=1).cpu()
            packed = pack_padded_sequence(compact, lengths, batch_first=True, enforce_sorted=False)
            output, _ = pad_packed_sequence(self.rnn(packed)[0], batch_first=True,
                                            total_length=hidden.shape[1])
        else:
            # Real tokens come first, so the causal recurrence never reads padding before them.
            output, _ = self.rnn(compact)
        output = _unpermute(output, order).masked_fill(padding_mask[..., None], 0.0)
        return self.dropout(output)


@ENCODERS.register("rnn")
class RnnEncoder(RecurrentEncoder):
    """Elman RNN (tanh) stack; see ``RecurrentEncoder``."""

    Config = RnnEncoderConfig
    cell = "rnn"


@ENCODERS.register("lstm")
class LstmEncoder(RecurrentEncoder):
    """LSTM stack (Hochreiter & Schmidhuber 1997); see ``RecurrentEncoder``."""

    Config = LstmEncoderConfig
    cell = "lstm"


@ENCODERS.register("gru")
class GruEncoder(RecurrentEncoder):
    """GRU stack (Cho et al. 2014); see ``RecurrentEncoder``."""

    Config = GruEncoderConfig
    cell = "gru"


class BiRecurrentEncoder(Encoder):
    """Two one-way stacks, ELMo style: [B,S,E] -> [B,S,H] = [forward H/2 | backward H/2].

    The forward stack (``rnn_forward.*``) reads left to right, the backward stack
    (``rnn_backward.*``) right to left from each row's last real token. Unlike a bidirectional
    single stack, the directions never mix between layers, so the first half of the output at t
    depends only on tokens <= t and the second half only on tokens >= t (what a ``bilm`` target
    needs: Peters et al. 2018).
    """

    cell: ClassVar[str]
    takes_embedding_width: ClassVar[bool] = True  # see input_width

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 2, dropout: float = 0.1):
        super().__init__()
        if hidden_size % 2:
            raise ValueError(f"hidden_size {hidden_size} must be even (each direction gets half)")
        cell = CELLS[self.cell]
        inner_dropout = dropout if num_layers > 1 else 0.0
        self.rnn_forward = cell(input_size, hidden_size // 2, num_layers, batch_first=True, dropout=inner_dropout)
        self.rnn_backward = cell(input_size, hidden_size // 2, num_layers, batch_first=True, dropout=inner_dropout)
        self.dropout = Dropout(dropout)

    @classmethod
    def from_config(cls, cfg: BiRecurrentConfigBase, model: Any) -> BiRecurrentEncoder:
        return cls(input_width(model), model.hidden_size, cfg.num_layers, cfg.dropout)

    def reset_parameters(self) -> None:
        """torch's default: uniform(-1/sqrt(units), 1/sqrt(units)) (as TencentPretrain)."""
        self.rnn_forward.reset_parameters()
        self.rnn_backward.reset_parameters()

    def forward(self, hidden: Tensor, padding_mask: Tensor | None, prefix_lengths: Tensor | None = None,
                positions: Tensor | None = None, cache: Any = None) -> Tensor:
        """hidden [B,S,E], padding_mask [B,S] (True = padding) or None -> [B,S,H]; padding outputs 0.

        ``prefix_lengths`` and ``positions`` are ignored.
        """
        _no_cache(self.registry_name, cache)
        self.rnn_forward.flatten_parameters()
        self.rnn_backward.flatten_parameters()
        if padding_mask is None:
            forward, _ = self.rnn_forward(hidden)
            backward = self.rnn_backward(hidden.flip(1))[0].flip(1)
            return self.dropout(torch.cat([forward, backward], dim=-1))
        order = real_first_order(padding_mask)
        forward, _ = self.rnn_forward(_permute(hidden, order))
        forward = _unpermute(forward, order)
        reverse = real_first_order(padding_mask, reverse=True)
        backward, _ = self.rnn_backward(_permute(hidden, reverse))
        backward = _unpermute(backward, reverse)
        output = torch.cat([forward, backward], dim=-1).masked_fill(padding_mask[..., None], 0.0)
        return self.dropout(output)


@ENCODERS.register("birnn")
class BirnnEncoder(BiRecurrentEncoder):
    """Forward and backward Elman RNN stacks; see ``BiRecurrentEncoder``."""

    Config = BirnnEncoderConfig
    cell = "rnn"


@ENCODERS.register("bilstm")
class BilstmEncoder(BiRecurrentEncoder):
    """Forward and backward LSTM stacks (ELMo's encoder); see ``BiRecurrentEncoder``."""

    Config = BilstmEncoderConfig
    cell = "lstm"


@ENCODERS.register("bigru")
class BigruEncoder(BiRecurrentEncoder):
    """Forward and backward GRU stacks; see ``BiRecurrentEncoder``."""

    Config = BigruEncoderConfig
    cell = "gru"
