import { nullTranslator } from '@jupyterlab/translation';
import { describe, expect, it } from 'vitest';

import type { ISliceModel } from '../src/api';
import {
  memoryLabel,
  messageTopic,
  sliceStatusText,
  sliceTitle,
  sliceTooltip
} from '../src/describe';
import { GIB } from '../src/slice-values';
import { resumed } from '../src/wake';
import { sliceModel } from './models';

const trans = nullTranslator.load('jupyter_vgpu');

/** A 4 GiB kernel whose memory is on its way to or from host memory (issue 27 #10). */
function moving(state: 'suspending' | 'resuming'): ISliceModel {
  return sliceModel({
    state,
    // Once a resume is admitted the server no longer counts host memory; its processes'
    // allocations (on their way back) are still their usage.
    host_memory_bytes: 0,
    usage: { memory_bytes: 4 * GIB, sm_util: 0, processes: [] }
  });
}

describe('a kernel being suspended or resumed', () => {
  it('is named so in its heading, not running', () => {
    expect(sliceTitle(moving('suspending'), trans)).toBe(
      'analysis.ipynb · GPU 1 · hard · suspending'
    );
    expect(sliceTitle(moving('resuming'), trans)).toBe(
      'analysis.ipynb · GPU 1 · hard · resuming'
    );
  });

  it('says in the status bar which way its memory moves and how much', () => {
    expect(sliceStatusText(moving('suspending'), trans)).toBe(
      'GPU suspending · moving 4GiB to host memory'
    );
    expect(sliceStatusText(moving('resuming'), trans)).toBe(
      'GPU resuming · 4GiB coming back from host memory'
    );
  });

  it('labels its memory bar with the move, not a used-of-cap figure', () => {
    expect(memoryLabel(moving('suspending'), trans)).toBe(
      'Memory 4GiB moving to host memory (suspending)'
    );
    expect(memoryLabel(moving('resuming'), trans)).toBe(
      'Memory 4GiB coming back from host memory (resuming)'
    );
  });

  it('explains the state in the status tooltip', () => {
    expect(sliceTooltip(moving('resuming'), trans).split('\n')[1]).toBe(
      'Resuming: its room is back and 4GiB is being copied back from host memory; its cells wait until it is'
    );
  });

  it('is not back for the wake hint until it runs', () => {
    expect(resumed(moving('resuming'))).toBe(false);
    expect(resumed({ ...moving('resuming'), state: 'running' })).toBe(true);
  });

  it('takes a lent kernel, which has nothing to copy, as taking its room back', () => {
    expect(
      sliceStatusText(
        {
          ...moving('resuming'),
          usage: { ...moving('resuming').usage, memory_bytes: 0 }
        },
        trans
      )
    ).toBe('GPU resuming · taking its 4GiB back');
  });
});

describe('what a row message is about', () => {
  it('changes with the state or the limits, not with usage', () => {
    const running = sliceModel();
    expect(
      messageTopic({ ...running, usage: { ...running.usage, sm_util: 99 } })
    ).toBe(messageTopic(running));
    expect(messageTopic({ ...running, state: 'suspended' })).not.toBe(
      messageTopic(running)
    );
    expect(
      messageTopic({
        ...running,
        limits: { ...running.limits, memory_bytes: 5 * GIB }
      })
    ).not.toBe(messageTopic(running));
  });
});
