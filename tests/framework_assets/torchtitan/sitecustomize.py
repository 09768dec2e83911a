"""Test shim: torchtitan (0.2) on a machine without GPUs runs on the CPU.

torchtitan picks CUDA when no accelerator is found and asks its device module for names,
memory figures and caches that `torch.cpu` does not have, and for the current device as an
index (its ``set_pg_timeouts`` barrier): these stand-ins answer for the CPU. Loaded by the
test job's interpreter through ``PYTHONPATH`` (Python imports ``sitecustomize`` at start).
Tests only; nothing of the product imports this.
"""

import os
import types

import torch
import torch._utils

torch._utils._get_available_device_type = lambda: "cpu"
_cpu = torch.cpu
_cpu.get_device_name = lambda device=None: "cpu"
_cpu.get_device_properties = lambda device=None: types.SimpleNamespace(
    total_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), name="cpu"
)
_cpu.reset_peak_memory_stats = lambda device=None: None
_cpu.empty_cache = lambda: None
_cpu.memory_stats = lambda device=None: {}
_cpu.current_device = lambda: 0
