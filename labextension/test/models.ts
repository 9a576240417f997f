import type { IDeviceModel } from '../src/api';
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
