import { nullTranslator } from '@jupyterlab/translation';
import { describe, expect, it } from 'vitest';

import type { IDeviceModel, ISliceModel } from '../src/api';
import {
  describeDevice,
  memoryLabel,
  sliceSummary,
  sliceTitle,
  sliceTooltip,
  smLabel
} from '../src/describe';
import { GIB, MIB } from '../src/slice-values';

const trans = nullTranslator.load('jupyter_vgpu');

/** A slice as GET /api/vgpu/slices gives it (jupyter_vgpu/server/api.yaml's Slice). */
function slice(overrides: Partial<ISliceModel> = {}): ISliceModel {
  return {
    kernel_id: '3f2a9c4e-5b7d-4e1f-9a0b-1c2d3e4f5a6b',
    kernelspec: 'python3-vgpu',
    path: 'analysis.ipynb',
    owner: 'ada',
    holder: 'local',
    state: 'running',
    device: { index: 1, uuid: 'GPU-5eed' },
    limits: { memory_bytes: 4 * GIB, cores: 30, policy: 'hard' },
    usage: {
      memory_bytes: 1.2 * GIB,
      sm_util: 27.6,
      processes: [{ pid: 4242, memory_bytes: 1.2 * GIB, sm_util: 27.6, oom_refusals: 0 }]
    },
    warnings: [],
    ...overrides
  };
}

const device: IDeviceModel = {
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
  slices: 3
};

describe('a device', () => {
  it('says what is free of what slices may hold, and the SM share promised', () => {
    expect(describeDevice(device, trans)).toBe('GPU 0 Sim GPU: 4GiB free of 15GiB · SM 70 % of 100 % promised');
  });

  it('says a full device has nothing free', () => {
    expect(describeDevice({ ...device, memory_free_bytes: 0 }, trans)).toContain(': 0B free of 15GiB');
  });
});

describe('a slice', () => {
  it('is titled by its notebook, device and policy', () => {
    expect(sliceTitle(slice(), trans)).toBe('analysis.ipynb · GPU 1 · hard');
  });

  it('is titled by its kernel id without a notebook, and says its state unless running', () => {
    expect(sliceTitle(slice({ path: '', state: 'lost' }), trans)).toBe('3f2a9c4e · GPU 1 · hard · lost');
  });

  it('reads its memory and SM share from the byte and percent fields', () => {
    expect(sliceSummary(slice())).toBe('GPU 1.2 / 4.0 GiB · SM 28 / 30 %');
    expect(memoryLabel(slice(), trans)).toBe('Memory 1.2 / 4.0 GiB');
    expect(smLabel(slice(), trans)).toBe('SM 28 / 30 %');
    const small = slice({ limits: { memory_bytes: 768 * MIB, cores: 20, policy: 'burst' } });
    expect(sliceSummary({ ...small, usage: { memory_bytes: 0, sm_util: 0, processes: [] } })).toBe(
      'GPU 0 / 768 MiB · SM 0 / 20 %'
    );
  });

  it("has its limits in the status item's tooltip, then each warning on a line of its own", () => {
    expect(sliceTooltip(slice(), trans)).toBe('GPU slice on device 1: memory cap 4GiB, SM share 30 % (hard)');
    const warning =
      "the slice's limits were changed from inside the kernel (memory cap 16GiB instead of 3GiB); the server restored them";
    expect(sliceTooltip(slice({ warnings: [warning] }), trans).split('\n')).toEqual([
      'GPU slice on device 1: memory cap 4GiB, SM share 30 % (hard)',
      warning
    ]);
  });
});
