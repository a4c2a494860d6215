"""CPU STAND-IN for the `torchstore` package (which needs Monarch and CUDA): an in-memory dict shared by every
client in this process, with torchstore's async put/get/put_state_dict/get_state_dict names. It checks forgeflow's
adapter logic (keys, latest pointer, missing versions), not torchstore itself."""

from __future__ import annotations

import types

import torch


def make_stand_in() -> types.ModuleType:
    data: dict[str, object] = {}
    module = types.ModuleType("torchstore")
    module.STAND_IN = True

    async def put(key, value):
        data[key] = value.clone() if isinstance(value, torch.Tensor) else value

    async def get(key):
        if key not in data:
            raise KeyError(key)
        return data[key]

    async def put_state_dict(state_dict, key):
        data[key] = {k: v.clone() for k, v in state_dict.items()}

    async def get_state_dict(key):
        return await get(key)

    module.put, module.get, module.put_state_dict, module.get_state_dict = put, get, put_state_dict, get_state_dict
    return module
