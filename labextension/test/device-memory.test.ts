import { nullTranslator } from '@jupyterlab/translation';
import { describe, expect, it } from 'vitest';

import type { IDeviceModel } from '../src/api';
import { deviceMemoryLines } from '../src/device-memory';
import { GIB, MIB } from '../src/slice-values';
import { deviceModel } from './models';

const trans = nullTranslator.load('jupyter_vgpu');

/** A 24 GiB device with one 8 GiB slice, as GET /api/vgpu/devices gives it (issue 20). */
function device(outside?: number, overCap?: number): IDeviceModel {
  return deviceModel({
    sm_count: 80,
    memory_total_bytes: 24 * GIB,
    memory_capacity_bytes: 24 * GIB,
    memory_allocated_bytes: 8 * GIB,
    memory_free_bytes: 16 * GIB - (outside ?? 0) - (overCap ?? 0),
    memory_outside_bytes: outside,
    memory_over_cap_bytes: overCap,
    sm_share_allocated: 30,
    sm_share_hard_allocated: 30,
    slices: 1
  });
}

describe('memory no slice was promised', () => {
  it('says how much is held outside any slice', () => {
    expect(deviceMemoryLines(device(2 * GIB, 0), trans)).toEqual([
      { kind: 'outside', text: '2GiB in use outside any slice' }
    ]);
  });

  it('says how much slices hold past their caps', () => {
    expect(deviceMemoryLines(device(0, 9 * GIB), trans)).toEqual([
      { kind: 'over-cap', text: '9GiB over slice caps' }
    ]);
  });

  it('gives both lines, outside first, in the sizes the sidebar uses', () => {
    expect(
      deviceMemoryLines(device(1536 * MIB, 512 * MIB), trans).map(l => l.text)
    ).toEqual(['1.5GiB in use outside any slice', '512MiB over slice caps']);
  });

  it('says nothing when the slices account for all held memory', () => {
    expect(deviceMemoryLines(device(0, 0), trans)).toEqual([]);
  });

  it('says nothing for a server that does not send the fields', () => {
    expect(deviceMemoryLines(device(), trans)).toEqual([]);
  });
});
