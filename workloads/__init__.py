"""Workloads: requests (prompt and output lengths, optional category and arrival time)
sampled from real data or synthetic mixes, named in `configs/workloads/*.yaml`.

Layer: imports only `core`."""
from workloads.base import RequestSpec, Workload, WorkloadError
from workloads.registry import load_workload, parse_set, workload_names

__all__ = ["RequestSpec", "Workload", "WorkloadError", "load_workload", "parse_set", "workload_names"]
