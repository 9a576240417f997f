import { nullTranslator } from '@jupyterlab/translation';
import { beforeEach, describe, expect, it } from 'vitest';

import type { ISliceModel } from '../src/api';
import { IActiveNotebook, IdleNotices, NoticeKind } from '../src/notices';
import { GIB } from '../src/slice-values';
import { sliceModel } from './models';

const trans = nullTranslator.load('jupyter_vgpu');
const KERNEL = '3f2a9c4e-5b7d-4e1f-9a0b-1c2d3e4f5a6b';
const OTHER = '9d8c7b6a-5b7d-4e1f-9a0b-1c2d3e4f5a6b';
const LOWERED =
  'lowered to 5% of the SMs after 20 min idle; restored when it runs again';
const KEPT =
  'kept at 5% of the SMs: its 50% did not fit when it ran again (GPU 0 has 10% of its SMs free)';
const STOPPED =
  'stopped after 2 h idle to free its 1GiB of GPU memory; start it again from the Kernel menu';

function slice(overrides: Partial<ISliceModel> = {}): ISliceModel {
  return sliceModel({
    kernel_id: KERNEL,
    state: 'unused',
    device: { index: 0, uuid: 'GPU-5eed' },
    limits: { memory_bytes: GIB, cores: 50, policy: 'hard' },
    usage: { memory_bytes: 0, sm_util: 0, processes: [] },
    notice: null,
    ...overrides
  });
}

function notebook(overrides: Partial<IActiveNotebook> = {}): IActiveNotebook {
  return {
    key: 'notebook-1',
    path: 'analysis.ipynb',
    kernelId: KERNEL,
    ...overrides
  };
}

describe('IdleNotices', () => {
  let told: [NoticeKind, string][];
  let notices: Record<string, string>;
  let asked: number;
  let watcher: IdleNotices;

  beforeEach(() => {
    told = [];
    notices = {};
    asked = 0;
    watcher = new IdleNotices(
      async () => {
        asked++;
        return notices;
      },
      (kind, message) => told.push([kind, message]),
      trans
    );
  });

  it('tells a new slice notice once, not on every poll', async () => {
    await watcher.check(notebook(), [slice()]);
    expect(told).toEqual([]);
    for (let poll = 0; poll < 3; poll++) {
      await watcher.check(notebook(), [slice({ notice: LOWERED })]);
    }
    expect(told).toEqual([['info', `GPU slice of analysis.ipynb: ${LOWERED}`]]);
    expect(asked).toBe(0);
  });

  it('tells a changed notice (not given back) and the same notice again after a restore', async () => {
    await watcher.check(notebook(), [slice({ notice: LOWERED })]);
    await watcher.check(notebook(), [slice({ notice: KEPT })]);
    await watcher.check(notebook(), [slice({ notice: KEPT })]);
    await watcher.check(notebook(), [slice({ notice: null })]); // restored
    await watcher.check(notebook(), [slice({ notice: LOWERED })]); // lowered again
    expect(told.map(([, message]) => message)).toEqual([
      `GPU slice of analysis.ipynb: ${LOWERED}`,
      `GPU slice of analysis.ipynb: ${KEPT}`,
      `GPU slice of analysis.ipynb: ${LOWERED}`
    ]);
  });

  it("tells nothing about another notebook's kernel, nor without an active notebook", async () => {
    const other = slice({ kernel_id: OTHER, path: 'b.ipynb', notice: LOWERED });
    await watcher.check(notebook(), [slice(), other]);
    await watcher.check(null, [slice({ notice: LOWERED }), other]);
    expect(told).toEqual([]);
    // A slice notice that came while its notebook was in the background is told when it is active.
    await watcher.check(notebook(), [slice({ notice: LOWERED }), other]);
    expect(told).toHaveLength(1);
  });

  it('says why a stopped kernel is gone, once, after its notebook lost the kernel', async () => {
    await watcher.check(notebook(), [slice({ notice: LOWERED })]);
    notices = { [KERNEL]: STOPPED };
    // The server stopped the kernel: the notebook's session no longer has it, its slice is gone.
    await watcher.check(notebook({ kernelId: undefined }), []);
    await watcher.check(notebook({ kernelId: undefined }), []);
    await watcher.check(notebook(), []);
    expect(told).toEqual([
      ['info', `GPU slice of analysis.ipynb: ${LOWERED}`],
      ['warning', `The kernel of analysis.ipynb: ${STOPPED}`]
    ]);
    expect(asked).toBe(1);
  });

  it('asks once for a kernel shut down by hand, and tells nothing', async () => {
    await watcher.check(notebook(), [slice()]);
    await watcher.check(notebook(), []);
    await watcher.check(notebook(), []);
    expect(asked).toBe(1);
    expect(told).toEqual([]);
  });

  it('never asks about a kernel it never saw with a slice', async () => {
    await watcher.check(notebook({ kernelId: OTHER }), [slice()]);
    await watcher.check(notebook({ kernelId: undefined }), []);
    expect(asked).toBe(0);
  });

  it('does not ask twice while a request is under way', async () => {
    let answer: (value: Record<string, string>) => void = () => {};
    const slow = new IdleNotices(
      () => {
        asked++;
        return new Promise(resolve => (answer = resolve));
      },
      (kind, message) => told.push([kind, message]),
      trans
    );
    await slow.check(notebook(), [slice()]);
    const first = slow.check(notebook(), []);
    await slow.check(notebook(), []);
    answer({ [KERNEL]: STOPPED });
    await first;
    expect(asked).toBe(1);
    expect(told).toEqual([
      ['warning', `The kernel of analysis.ipynb: ${STOPPED}`]
    ]);
  });

  it('asks again at the next poll when the server did not answer', async () => {
    let fail = true;
    const flaky = new IdleNotices(
      async () => {
        asked++;
        if (fail) {
          throw new Error('server away');
        }
        return { [KERNEL]: STOPPED };
      },
      (kind, message) => told.push([kind, message]),
      trans
    );
    await flaky.check(notebook(), [slice()]);
    await flaky.check(notebook(), []);
    fail = false;
    await flaky.check(notebook(), []);
    expect(asked).toBe(2);
    expect(told).toEqual([
      ['warning', `The kernel of analysis.ipynb: ${STOPPED}`]
    ]);
  });

  it("follows each notebook's own kernel when the active notebook changes", async () => {
    const second = notebook({
      key: 'notebook-2',
      path: 'b.ipynb',
      kernelId: OTHER
    });
    const slices = [slice(), slice({ kernel_id: OTHER, path: 'b.ipynb' })];
    await watcher.check(notebook(), slices);
    await watcher.check(second, slices);
    notices = { [KERNEL]: STOPPED };
    // The first notebook's kernel was stopped while the second was active.
    await watcher.check(second, [slices[1]]);
    expect(told).toEqual([]);
    await watcher.check(notebook({ kernelId: undefined }), [slices[1]]);
    expect(told).toEqual([
      ['warning', `The kernel of analysis.ipynb: ${STOPPED}`]
    ]);
  });
});
