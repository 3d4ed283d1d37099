"""The live device's description: what the router decides for (a DeviceDesc from the capability
data for the GPU's compute capability and name, with the SM count and bandwidth its properties
report), cached per CUDA device."""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

import capability_db
from backends import DeviceDesc

_live_devices: dict[int, DeviceDesc] = {}


def with_properties(desc: DeviceDesc, props: Any) -> DeviceDesc:
    """``desc`` with what the live GPU's properties say: SM count, and peak HBM bandwidth
    (2 x memory clock x bus width) where this torch reports them (else 0: the name decides)."""
    clock_khz = getattr(props, "memory_clock_rate", 0) or 0
    bus_bits = getattr(props, "memory_bus_width", 0) or 0
    bandwidth = round(2 * clock_khz * 1e3 * bus_bits / 8 / 1e12, 3) if clock_khz and bus_bits else 0.0
    return dataclasses.replace(desc, sm_count=int(getattr(props, "multi_processor_count", 0) or 0),
                               peak_tb_per_s=bandwidth)


def live_device(tensor: torch.Tensor) -> DeviceDesc:
    """The DeviceDesc of the tensor's device (cached per CUDA device index)."""
    if tensor.device.type != "cuda":
        return capability_db.CPU_DEVICE
    index = tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    desc = _live_devices.get(index)
    if desc is None:
        major, minor = torch.cuda.get_device_capability(index)
        name = torch.cuda.get_device_name(index)
        desc = _live_devices[index] = with_properties(
            capability_db.device_for_capability(major, minor, name), torch.cuda.get_device_properties(index))
    return desc
