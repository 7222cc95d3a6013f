"""The whole model's random bf16 weights, made once on the device and shared by the executors of a replay."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from calibrate.model import layers as L
from calibrate.model.shapes import LayerShapes


@dataclass
class Weights:
    embed: torch.Tensor
    head: L.HeadWeights
    layers: list  # per layer: L.GDNWeights or L.AttnWeights
    conv: list  # per layer: the GDN conv weight as [channels, kernel] (the kernels' layout), or None
    ffn: list[L.FFNWeights]  # per layer: its MoE, or a dense model's MLP
    mtp: L.MTPWeights
    mtp_attn: L.AttnWeights
    mtp_ffn: L.FFNWeights

    @classmethod
    def build(cls, s: LayerShapes, kinds: list[str], device: torch.device) -> "Weights":
        """Random bf16 weights made on the device (never on the host): 70 GB for 35B-A3B."""
        layers, conv = [], []
        for kind in kinds:
            if kind == "gdn":
                w = L.gdn_weights(s, device)
                layers.append(w)
                conv.append(w.conv.t().contiguous())
            else:
                layers.append(L.attn_weights(s, device))
                conv.append(None)
        return cls(embed=L._w(s.vocab, s.hidden, device=device), head=L.head_weights(s, device), layers=layers,
                   conv=conv, ffn=[L.ffn_weights(s, device) for _ in kinds], mtp=L.mtp_weights(s, device),
                   mtp_attn=L.attn_weights(s, device), mtp_ffn=L.ffn_weights(s, device))
