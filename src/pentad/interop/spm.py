"""SentencePiece models whose ids are laid out the way a foreign tokenizer numbers them.

Some Hugging Face tokenizers wrap a SentencePiece model but do not use its ids as they are:

* **fairseq** (XLM-RoBERTa; TencentPretrain's ``xlmroberta`` tokenizer): the model's own first
  three pieces ``<unk> <s> </s>`` are replaced by the fairseq dictionary's ``<s> <pad> </s> <unk>``,
  so every other piece moves up by one, and ``<mask>`` comes last.
* **t5**: the model's ids as they are, then 100 (``extra_ids``) sentinels ``<extra_id_N>`` whose
  ids count *down* from the end: ``<extra_id_0>`` is the last id.
* **pegasus**: the model ships ``<pad> </s> <unk>`` first; the tokenizer numbers ``<pad>`` 0,
  ``</s>`` 1, ``<mask_1>`` 2, ``<mask_2>`` 3, ``<unk_2>`` .. ``<unk_{offset-1}>`` 4 .. offset+1, and
  every piece from ``<unk>`` on at its own id + ``offset`` (103 by default).

pentad's ``sentencepiece`` tokenizer uses a model's ids as they are. Rather than teaching it each
foreign numbering, the import rewrites the model so that its own ids are the foreign ones (the
same pieces, scores and normalisation, with the special pieces moved or added), and the export
writes the original layout back. The model file is a protocol buffer (``sentencepiece_model.proto``);
the few fields touched here are read and written with the wire format directly, so no protobuf
package is needed and every other field is kept byte for byte.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from pentad.errors import UserError

# SentencePiece.Type
NORMAL, UNKNOWN, CONTROL, USER_DEFINED = 1, 2, 3, 4
# ModelProto field numbers.
_PIECES, _TRAINER_SPEC = 1, 2
# TrainerSpec field numbers of the special ids.
_UNK_ID, _BOS_ID, _EOS_ID, _PAD_ID = 40, 41, 42, 43
_SPECIAL_DEFAULTS = {_UNK_ID: 0, _BOS_ID: 1, _EOS_ID: 2, _PAD_ID: -1}

FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
FAIRSEQ_MASK = "<mask>"
T5_EXTRA_IDS = 100
PEGASUS_OFFSET = 103


# ------------------------------------------------------------------------------------ wire format
def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _encode_varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int32 values are written as 10-byte two's complement
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _fields(data: bytes) -> list[tuple[int, int, bytes | int]]:
    """(field number, wire type, payload) of every field of a message, in order."""
    out: list[tuple[int, int, bytes | int]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            out.append((number, wire, value))
        elif wire == 1:
            out.append((number, wire, data[pos:pos + 8]))
            pos += 8
        elif wire == 2:
            size, pos = _varint(data, pos)
            out.append((number, wire, data[pos:pos + size]))
            pos += size
        elif wire == 5:
            out.append((number, wire, data[pos:pos + 4]))
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > len(data):
            raise ValueError("truncated field")
    return out


def _encode_field(number: int, wire: int, payload: bytes | int) -> bytes:
    key = _encode_varint(number << 3 | wire)
    if wire == 0:
        return key + _encode_varint(int(payload))
    assert isinstance(payload, bytes)
    if wire == 2:
        return key + _encode_varint(len(payload)) + payload
    return key + payload


# ------------------------------------------------------------------------------------ the model
@dataclass
class Piece:
    """One vocabulary entry: its text, unigram score (log probability) and type."""

    text: str
    score: float = 0.0
    kind: int = NORMAL

    def encode(self) -> bytes:
        return (_encode_field(1, 2, self.text.encode("utf-8")) + _encode_field(2, 5, struct.pack("<f", self.score))
                + (_encode_field(3, 0, self.kind) if self.kind != NORMAL else b""))


@dataclass
class SentencePieceModel:
    """A SentencePiece model: its pieces (id = position) and every other field kept as bytes."""

    pieces: list[Piece]
    trainer_spec: list[tuple[int, int, bytes | int]] = field(default_factory=list)
    rest: list[tuple[int, int, bytes | int]] = field(default_factory=list)  # normalizer specs etc., in order

    @classmethod
    def parse(cls, data: bytes, origin: Path | str) -> SentencePieceModel:
        try:
            pieces, trainer, rest = [], [], []
            for number, wire, payload in _fields(data):
                if number == _PIECES and wire == 2:
                    assert isinstance(payload, bytes)
                    piece = Piece("")
                    for n, w, value in _fields(payload):
                        if n == 1 and w == 2:
                            piece.text = bytes(value).decode("utf-8")  # type: ignore[arg-type]
                        elif n == 2 and w == 5:
                            piece.score = struct.unpack("<f", value)[0]  # type: ignore[arg-type]
                        elif n == 3 and w == 0:
                            piece.kind = int(value)  # type: ignore[arg-type]
                    pieces.append(piece)
                elif number == _TRAINER_SPEC and wire == 2:
                    assert isinstance(payload, bytes)
                    trainer = _fields(payload)
                else:
                    rest.append((number, wire, payload))
        except (ValueError, UnicodeDecodeError, struct.error) as e:
            raise UserError(f"{origin} is not a SentencePiece model file ({e}).") from None
        if not pieces:
            raise UserError(f"{origin} is not a SentencePiece model file (it has no pieces).")
        return cls(pieces, trainer, rest)

    def serialize(self) -> bytes:
        out = bytearray()
        for piece in self.pieces:
            out += _encode_field(_PIECES, 2, piece.encode())
        if self.trainer_spec:
            out += _encode_field(_TRAINER_SPEC, 2, b"".join(_encode_field(*f) for f in self.trainer_spec))
        for f in self.rest:
            out += _encode_field(*f)
        return bytes(out)

    def set_special_ids(self) -> None:
        """Point the trainer spec's unk/bos/eos/pad ids at the pieces that now hold those roles
        (-1 when there is none), as a freshly trained model would have them."""
        index = {p.text: i for i, p in enumerate(self.pieces)}
        unk = next((i for i, p in enumerate(self.pieces) if p.kind == UNKNOWN), -1)
        ids = {_UNK_ID: unk, _BOS_ID: index.get("<s>", -1), _EOS_ID: index.get("</s>", -1),
               _PAD_ID: index.get("<pad>", -1)}
        kept = [f for f in self.trainer_spec if f[0] not in ids]
        # Values equal to the proto defaults stay unset, as the trainer leaves them.
        self.trainer_spec = kept + [(number, 0, value) for number, value in ids.items()
                                    if value != _SPECIAL_DEFAULTS[number]]


def _check_control(model: SentencePieceModel, expected: tuple[tuple[str, int], ...], what: str, origin: str) -> None:
    found = [(p.text, p.kind) for p in model.pieces[:len(expected)]]
    if found != list(expected):
        raise UserError(f"{origin}: expected {what} to start with {[t for t, _ in expected]} (found "
                        f"{[t for t, _ in found]}), so its ids cannot be laid out as the tokenizer numbers them.")


# ----------------------------------------------------------------------------------------- layouts
def to_fairseq(data: bytes, origin: str) -> bytes:
    """An XLM-R style SentencePiece model (``<unk> <s> </s>`` first) with fairseq's ids:
    ``<s> <pad> </s> <unk>``, the other pieces one id up, ``<mask>`` last."""
    model = SentencePieceModel.parse(data, origin)
    _check_control(model, (("<unk>", UNKNOWN), ("<s>", CONTROL), ("</s>", CONTROL)), "a fairseq SentencePiece model",
                   origin)
    unk = model.pieces[0]
    model.pieces = [Piece("<s>", 0.0, CONTROL), Piece("<pad>", 0.0, CONTROL), Piece("</s>", 0.0, CONTROL),
                    Piece("<unk>", unk.score, UNKNOWN), *model.pieces[3:], Piece(FAIRSEQ_MASK, 0.0, USER_DEFINED)]
    model.set_special_ids()
    return model.serialize()


def is_fairseq(data: bytes) -> bool:
    try:
        model = SentencePieceModel.parse(data, "")
    except UserError:
        return False
    head = [(p.text, p.kind) for p in model.pieces[:4]]
    return head == [("<s>", CONTROL), ("<pad>", CONTROL), ("</s>", CONTROL), ("<unk>", UNKNOWN)] and \
        model.pieces[-1].text == FAIRSEQ_MASK


def from_fairseq(data: bytes, origin: str) -> bytes:
    """The inverse of :func:`to_fairseq`: the model as XLM-R ships it."""
    model = SentencePieceModel.parse(data, origin)
    if not is_fairseq(data):
        raise UserError(f"{origin} is not a SentencePiece model in fairseq's id layout (<s> <pad> </s> <unk> first, "
                        "<mask> last), so it cannot be written as an XLM-RoBERTa sentencepiece.bpe.model.")
    unk = model.pieces[3]
    model.pieces = [Piece("<unk>", unk.score, UNKNOWN), Piece("<s>", 0.0, CONTROL), Piece("</s>", 0.0, CONTROL),
                    *model.pieces[4:-1]]
    model.set_special_ids()
    return model.serialize()


def t5_sentinel(i: int) -> str:
    return f"<extra_id_{i}>"


def to_t5(data: bytes, origin: str, extra_ids: int = T5_EXTRA_IDS) -> bytes:
    """A T5 SentencePiece model with its ``extra_ids`` sentinels appended as user-defined pieces,
    ``<extra_id_{extra_ids-1}>`` first and ``<extra_id_0>`` last, as T5's tokenizer numbers them."""
    model = SentencePieceModel.parse(data, origin)
    present = {p.text for p in model.pieces}
    if any(t5_sentinel(i) in present for i in range(extra_ids)):
        return data  # already has them (a model saved by pentad, or one trained with them)
    model.pieces += [Piece(t5_sentinel(i), 0.0, USER_DEFINED) for i in reversed(range(extra_ids))]
    return model.serialize()


def from_t5(data: bytes, origin: str) -> tuple[bytes, int]:
    """The T5 model without the trailing sentinels :func:`to_t5` added; (bytes, number removed)."""
    model = SentencePieceModel.parse(data, origin)
    n = 0
    while n < len(model.pieces) and model.pieces[-1 - n].text == t5_sentinel(n) and \
            model.pieces[-1 - n].kind == USER_DEFINED:
        n += 1
    if n:
        model.pieces = model.pieces[:-n]
    return model.serialize(), n


def pegasus_specials(offset: int) -> list[str]:
    """The pieces Pegasus's tokenizer puts between ``</s>`` and ``<unk>``."""
    return ["<mask_1>", "<mask_2>", *(f"<unk_{i}>" for i in range(2, offset))]


def to_pegasus(data: bytes, origin: str, offset: int = PEGASUS_OFFSET) -> bytes:
    """A Pegasus SentencePiece model (``<pad> </s> <unk>`` first) with the ids its tokenizer gives:
    ``<mask_1>``, ``<mask_2>`` and ``<unk_2>``..``<unk_{offset-1}>`` inserted after ``</s>`` as
    user-defined pieces, so that ``<unk>`` and every later piece move up by ``offset``."""
    if offset < 2:
        raise UserError(f"{origin}: Pegasus offset {offset}; the tokenizer needs an offset of at least 2.")
    model = SentencePieceModel.parse(data, origin)
    if [p.text for p in model.pieces[2:4]] == ["<mask_1>", "<mask_2>"]:
        return data  # already laid out (a model saved by pentad)
    _check_control(model, (("<pad>", CONTROL), ("</s>", CONTROL), ("<unk>", UNKNOWN)), "a Pegasus SentencePiece model",
                   origin)
    model.pieces = [*model.pieces[:2], *(Piece(t, 0.0, USER_DEFINED) for t in pegasus_specials(offset)),
                    *model.pieces[2:]]
    model.set_special_ids()
    return model.serialize()


def from_pegasus(data: bytes, origin: str) -> tuple[bytes, int]:
    """The inverse of :func:`to_pegasus`: (the model as Pegasus ships it, the offset)."""
    model = SentencePieceModel.parse(data, origin)
    n = 2
    while n < len(model.pieces) and model.pieces[n].kind == USER_DEFINED and \
            model.pieces[n].text in ("<mask_1>", "<mask_2>", f"<unk_{n - 2}>"):
        n += 1
    offset = n - 2
    if offset < 2 or [p.text for p in model.pieces[2:n]] != pegasus_specials(offset):
        raise UserError(f"{origin} is not a SentencePiece model in Pegasus's id layout (<pad> </s> <mask_1> <mask_2> "
                        "<unk_2> ... first), so it cannot be written as a Pegasus spiece.model.")
    model.pieces = [*model.pieces[:2], *model.pieces[n:]]
    model.set_special_ids()
    return model.serialize(), offset
