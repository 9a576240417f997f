import { nullTranslator } from '@jupyterlab/translation';
import { describe, expect, it } from 'vitest';

import type { ISliceModel } from '../src/api';
import { memoryLabel, sliceTitle, stateLabel } from '../src/describe';
import { GIB } from '../src/slice-values';
import { sliceModel } from './models';

const trans = nullTranslator.load('jupyter_vgpu');

/** A kernel suspended to host memory (issue 18), as GET /api/vgpu/slices gives it. */
function suspended(): ISliceModel {
  return sliceModel({
    state: 'suspended',
    host_memory_bytes: 12 * GIB,
    limits: { memory_bytes: 12 * GIB, cores: 30, policy: 'hard' },
    usage: { memory_bytes: 0, sm_util: 0, processes: [] },
    notice:
      'suspended after 20 min idle: 12GiB moved to host memory; resumes when a cell runs'
  });
}

describe('a suspended kernel', () => {
  it('is named suspended in its heading', () => {
    expect(stateLabel('suspended', trans)).toBe('suspended');
    expect(sliceTitle(suspended(), trans)).toBe(
      'analysis.ipynb · GPU 1 · hard · suspended'
    );
  });

  it('shows where its memory is instead of 0 of its cap', () => {
    expect(memoryLabel(suspended(), trans)).toBe(
      'Memory 12GiB in host memory (suspended)'
    );
    expect(memoryLabel({ ...suspended(), state: 'running' }, trans)).toBe(
      'Memory 0.0 / 12.0 GiB'
    );
  });
});
