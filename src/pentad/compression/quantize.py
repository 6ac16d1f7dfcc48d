"""Int8 quantization of a run (``pentad compress RUN --output OUT --quantize int8``).

Every linear layer that is not tied to an embedding gets int8 weights with one scale per output
channel (:class:`pentad.layers.quantized.QuantizedLinear`); on the CPU its forward runs PyTorch's
dynamic int8 kernel. OUT's ``config.yaml`` says ``model.compression.quantize: int8``, so readers build the
int8 modules before reading ``model.safetensors`` (int8 tensors and fp32 scales: no pickle).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pentad.compression.store import check_output, load_run_model, weights_bytes, with_compression, write_run
from pentad.errors import UserError
from pentad.layers.quantized import quantize_linears

KINDS = ("int8",)


@dataclass
class Quantized:
    out: Path
    layers: int
    bytes_before: int
    bytes_after: int

    def render(self) -> str:
        return (f"quantized {self.layers} linear layers to int8: {self.bytes_before / 1e6:,.2f} MB -> "
                f"{self.bytes_after / 1e6:,.2f} MB, wrote {self.out}")


def quantize_run(run: Path, out: Path, kind: str = "int8", overwrite: bool = False) -> Quantized:
    """Write the int8 version of ``run`` (its best or latest weights) to ``out``."""
    if kind not in KINDS:
        raise UserError(f"--quantize {kind}: unknown kind; expected one of {', '.join(KINDS)}")
    run, out = Path(run), Path(out)
    check_output(run, out, overwrite)
    model, cfg, _ = load_run_model(run)
    if cfg.model.compression is not None and cfg.model.compression.quantize is not None:
        raise UserError(f"{run} is quantized already ({cfg.model.compression.quantize}); quantize the run it came "
                        "from instead")
    before = weights_bytes(model)
    names = quantize_linears(model)
    if not names:
        raise UserError(f"{run}: its model has no linear layer to quantize")
    write_run(run, out, with_compression(cfg, quantize=kind), model,
              {"step": "quantize", "source": str(run.resolve()), "kind": kind, "layers": len(names)})
    return Quantized(out, len(names), before, weights_bytes(model))
