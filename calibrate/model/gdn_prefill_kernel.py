"""Which GDN prefill kernel prices the recurrence: the one vLLM would pick on this GPU.

vLLM's default GDN prefill backend on compute capability 9.0 and up is FlashInfer's kernel,
with fla's Triton chunk kernel the fallback (docs/vllm_kernels.md). The same order here:
FlashInfer where it imports and the GPU has it, else fla, else nothing (the callers then
skip the table or run the float64 reference).
"""
from __future__ import annotations

from typing import Callable

from calibrate.model.fla import load_fla_chunk
from calibrate.model.flashinfer_gdn import load_flashinfer_chunk


def load_gdn_prefill(prefer: str = "auto") -> tuple[str | None, Callable[..., object] | None]:
    """(kernel name with its package version, the call with fla's signature); prefer: auto, flashinfer or fla."""
    from importlib import metadata

    if prefer not in ("auto", "flashinfer", "fla"):
        raise ValueError(f"gdn prefill kernel: prefer must be auto, flashinfer or fla, got {prefer!r}")
    order = {"auto": ("flashinfer", "fla"), "flashinfer": ("flashinfer",), "fla": ("fla",)}[prefer]
    loaders = {"flashinfer": (load_flashinfer_chunk, "flashinfer-python"), "fla": (load_fla_chunk, "fla-core")}
    for name in order:
        load, package = loaders[name]
        fn = load()
        if fn is not None:
            try:
                version = metadata.version(package)
            except metadata.PackageNotFoundError:  # a subset carried without its metadata
                version = "unknown"
            return f"{name} {version}", fn
    return None, None
