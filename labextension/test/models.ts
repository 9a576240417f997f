import type { IDeviceModel, ISliceModel } from '../src/api';
import { GIB } from '../src/slice-values';

/** A device as GET /api/vgpu/devices gives it (jupyter_vgpu/server/api.yaml's Device): a 16 GiB
 * one with 100 SMs and three slices, with `overrides` in place of its figures. */
export function deviceModel(
  overrides: Partial<IDeviceModel> = {}
): IDeviceModel {
  return {
    index: 0,
    uuid: 'GPU-5eed',
    name: 'Sim GPU',
    sm_count: 100,
    memory_total_bytes: 16 * GIB,
    memory_capacity_bytes: 15 * GIB,
    memory_allocated_bytes: 11 * GIB,
    memory_free_bytes: 4 * GIB,
    sm_share_allocated: 70,
    sm_share_hard_allocated: 50,
    sm_share_capacity: 100,
    slices: 3,
    ...overrides
  };
}

/** A slice's usage when its one process (pid 4242) holds all of it. */
export function oneProcessUsage(
  memoryBytes: number,
  smUtil: number
): ISliceModel['usage'] {
  return {
    memory_bytes: memoryBytes,
    sm_util: smUtil,
    processes: [
      { pid: 4242, memory_bytes: memoryBytes, sm_util: smUtil, oom_refusals: 0 }
    ]
  };
}

/** A slice as GET /api/vgpu/slices gives it (jupyter_vgpu/server/api.yaml's Slice): a running
 * 4 GiB one on GPU 1, with `overrides` in place of its fields. */
export function sliceModel(overrides: Partial<ISliceModel> = {}): ISliceModel {
  return {
    kernel_id: '3f2a9c4e-5b7d-4e1f-9a0b-1c2d3e4f5a6b',
    kernelspec: 'python3-vgpu',
    path: 'analysis.ipynb',
    owner: 'ada',
    holder: 'local',
    state: 'running',
    message: '',
    location: {},
    device: { index: 1, uuid: 'GPU-5eed' },
    limits: { memory_bytes: 4 * GIB, cores: 30, policy: 'hard' },
    usage: oneProcessUsage(1.2 * GIB, 27.6),
    warnings: [],
    ...overrides
  };
}
