"""The command-line options every `specdec` command shares, declared once (typer has no option groups):
the model pair, the runtimes, the device, dtype and threads. `generate`, `costs` and `sweep` take their names
and help text from here (`SHARED_OPTIONS`)."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = [
    "SHARED_OPTIONS", "BackendOpt", "CompileOpt", "DeviceOpt", "DraftBackendOpt", "DraftDtypeOpt", "DraftOpt",
    "DraftQuantOpt", "DtypeOpt", "GGUFTypeOpt", "PairOpt", "QuantOpt", "RemoteOpt", "TargetOpt", "ThreadsOpt",
]  # fmt: skip

PairOpt = Annotated[str | None, typer.Option("--pair", help="Model preset (see `specdec models`).")]
TargetOpt = Annotated[str | None, typer.Option("--target", help="Target: hub id, checkpoint dir or .gguf.")]
DraftOpt = Annotated[str | None, typer.Option("--draft", help="Draft: hub id, checkpoint dir or .gguf.")]
BackendOpt = Annotated[str, typer.Option("--backend", help="Target runtime: transformers | llamacpp.")]
DraftBackendOpt = Annotated[
    str | None, typer.Option("--draft-backend", help="Draft runtime (default: same as --backend).")
]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu | cuda (transformers).")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="auto | float32 | float16 | bfloat16 (transformers); auto: "
                                       "bfloat16 on a CPU with native bf16 kernels, else float32.")]
ThreadsOpt = Annotated[int | None, typer.Option("--threads", help="Intra-op CPU threads (recorded).")]
CompileOpt = Annotated[bool, typer.Option("--compile/--no-compile", help="Compiled static-cache forwards.")]
QuantOpt = Annotated[str | None, typer.Option("--quant", help="int8: int8 weight-only linears (torchao), "
                                             "transformers eager only.")]
DraftDtypeOpt = Annotated[str | None, typer.Option("--draft-dtype", help="The draft's dtype (default: --dtype).")]
DraftQuantOpt = Annotated[str | None, typer.Option(
    "--draft-quant", help="The draft's quantization: int8 | none (default: --quant). With --draft set to the "
    "target's own spec, a quantized copy of the target drafts for it.")]
RemoteOpt = Annotated[
    bool, typer.Option("--trust-remote-code", help="Allow model code from the hub (off by default).")
]
GGUFTypeOpt = Annotated[str | None, typer.Option(
    "--gguf-type", help="llama.cpp target only: run the target's GGUF requantized (pure) to this weight type: "
    "Q4_0 | IQ4_NL | Q8_0 | Q4_K_M (made once into the model cache; the draft keeps its GGUF).")]
#: The shared declarations by parameter name, for commands whose options are built from declarations
#: (``specdec sweep``: `specdec.bench.settings.typer_command`): names and help text come from here.
SHARED_OPTIONS = {
    "pair": PairOpt, "target": TargetOpt, "draft": DraftOpt, "backend": BackendOpt,
    "draft_backend": DraftBackendOpt, "device": DeviceOpt, "dtype": DtypeOpt, "threads": ThreadsOpt,
    "compile": CompileOpt, "quant": QuantOpt, "draft_dtype": DraftDtypeOpt, "draft_quant": DraftQuantOpt,
    "trust_remote_code": RemoteOpt, "gguf_type": GGUFTypeOpt,
}  # fmt: skip
