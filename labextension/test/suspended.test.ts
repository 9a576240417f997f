import { nullTranslator } from '@jupyterlab/translation';
import { describe, expect, it } from 'vitest';

import type { ISliceModel } from '../src/api';
import {
  memoryFill,
  memoryLabel,
  sliceStatusText,
  sliceTitle,
  sliceTooltip,
  stateLabel
} from '../src/describe';
import { GIB } from '../src/slice-values';
import { oneProcessUsage, sliceModel } from './models';

const trans = nullTranslator.load('jupyter_vgpu');

/** A kernel suspended to host memory (issue 18), as GET /api/vgpu/slices gives it. */
function suspended(): ISliceModel {
  return sliceModel({
    state: 'suspended',
    host_memory_bytes: 12 * GIB,
    limits: { memory_bytes: 12 * GIB, cores: 30, policy: 'hard' },
    // The server still counts what its processes allocated (now in host memory).
    usage: oneProcessUsage(12 * GIB, 0),
    notice:
      'suspended after 20 min idle: 12GiB moved to host memory; resumes when a cell runs, about 4 s'
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
      'Memory 12.0 / 12.0 GiB'
    );
  });

  it('draws its memory bar with the GPU part empty', () => {
    expect(memoryFill(suspended())).toBe(0);
    expect(memoryFill({ ...suspended(), state: 'running' })).toBe(1);
  });

  it('says in the status bar that it is suspended and where its memory is', () => {
    expect(sliceStatusText(suspended(), trans)).toBe(
      'GPU suspended · 12GiB in host memory'
    );
    expect(sliceStatusText({ ...suspended(), state: 'running' }, trans)).toBe(
      'GPU 12.0 / 12.0 GiB · SM 0 / 30 %'
    );
  });

  it('tells in the status tooltip how it resumes, then the idle notice', () => {
    expect(sliceTooltip(suspended(), trans).split('\n')).toEqual([
      'GPU slice on device 1: memory cap 12GiB, SM share 30 % (hard)',
      'Suspended: 12GiB in host memory, none of it on the GPU; its next cell resumes it',
      'Idle kernel: suspended after 20 min idle: 12GiB moved to host memory; resumes when a cell runs, about 4 s'
    ]);
  });
});
