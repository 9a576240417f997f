import { afterEach, describe, expect, it, vi } from 'vitest';

import { SliceStore } from '../src/store';
import { sliceModel } from './models';

// The store's requests, answered by each test (a deferred answer per call, in order).
const answers: {
  resolve: (slices: unknown) => void;
  reject: (error: unknown) => void;
}[] = [];

vi.mock('../src/api', () => {
  class VGPUServerError extends Error {
    constructor(
      readonly status: number,
      message: string
    ) {
      super(message);
    }
  }
  return {
    VGPUServerError,
    listSlices: () =>
      new Promise((resolve, reject) => answers.push({ resolve, reject })),
    listDevices: () => Promise.resolve([])
  };
});

const { VGPUServerError } = await import('../src/api');

/** A store whose own poll is stopped, and the answers its `refresh` calls wait for. */
function store(): SliceStore {
  const made = new SliceStore(60_000);
  made.dispose(); // the poll; refresh still works
  answers.length = 0;
  return made;
}

/** A store that listed one slice, and its next refresh, which fails with `failure`. */
async function listedOnceThenFailing(
  failure: Error
): Promise<{ slices: SliceStore; second: Promise<void> }> {
  const slices = store();
  const first = slices.refresh();
  answers[0].resolve([sliceModel()]);
  await first;
  const second = slices.refresh();
  answers[1].reject(failure);
  return { slices, second };
}

afterEach(() => {
  answers.length = 0;
});

describe('SliceStore', () => {
  it('keeps the newer answer when an older one comes after it', async () => {
    const slices = store();
    const older = slices.refresh();
    const newer = slices.refresh();
    answers[1].resolve([sliceModel({ state: 'suspended' })]);
    await newer;
    answers[0].resolve([sliceModel({ state: 'running' })]);
    await older;
    expect(slices.slices.map(slice => slice.state)).toEqual(['suspended']);
  });

  it('lists nothing while the server cannot be reached, and says so', async () => {
    const { slices, second } = await listedOnceThenFailing(
      new TypeError('Failed to fetch')
    );
    await expect(second).rejects.toThrow('Failed to fetch');
    expect([slices.slices, slices.unreachable, slices.error]).toEqual([
      [],
      true,
      'Failed to fetch'
    ]);
  });

  it('keeps what it listed when the server answers with an error (a busy ledger)', async () => {
    const { slices, second } = await listedOnceThenFailing(
      new VGPUServerError(503, 'GPU slices cannot be read')
    );
    await expect(second).rejects.toThrow();
    expect([slices.slices.length, slices.unreachable]).toEqual([1, false]);
  });
});
