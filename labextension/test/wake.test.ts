import { nullTranslator } from '@jupyterlab/translation';
import { describe, expect, it } from 'vitest';

import type { ISliceModel } from '../src/api';
import { resumingStatusText } from '../src/describe';
import { GIB, MIB } from '../src/slice-values';
import { WAKE_INTERVAL, WakeHints, wantsWake } from '../src/wake';
import { sliceModel } from './models';

const trans = nullTranslator.load('jupyter_vgpu');
const KERNEL = sliceModel().kernel_id;

/** WakeHints over a fake clock and a fake server: the slices by kernel id, the wakes sent. */
function harness(slices: Record<string, Partial<ISliceModel>>) {
  const known = new Map(
    Object.entries(slices).map(([id, fields]) => [
      id,
      sliceModel({ kernel_id: id, ...fields })
    ])
  );
  const sent: string[] = [];
  const clock = { now: 1_000_000 };
  let answer: (kernelId: string) => Promise<ISliceModel> = kernelId =>
    Promise.resolve(known.get(kernelId)!);
  const hints = new WakeHints({
    send: kernelId => {
      sent.push(kernelId);
      return answer(kernelId);
    },
    sliceOf: kernelId => known.get(kernelId),
    now: () => clock.now
  });
  return {
    hints,
    sent,
    clock,
    known,
    answerWith: (f: typeof answer) => (answer = f)
  };
}

/** Let the promise callbacks of a sent wake run. */
const settled = () => new Promise(resolve => setTimeout(resolve, 0));

describe('which kernels get a wake hint', () => {
  it('only a local slice that is suspended or lent', () => {
    expect(wantsWake(sliceModel({ state: 'suspended' }))).toBe(true);
    expect(wantsWake(sliceModel({ state: 'lent' }))).toBe(true);
    for (const state of ['running', 'unused', 'queued', 'lost'] as const) {
      expect(wantsWake(sliceModel({ state }))).toBe(false);
    }
    expect(wantsWake(sliceModel({ state: 'suspended', holder: 'pod' }))).toBe(
      false
    );
    expect(wantsWake(undefined)).toBe(false);
  });

  it('sends nothing for a running kernel however the user turns to it', () => {
    const { hints, sent } = harness({ [KERNEL]: { state: 'running' } });
    for (const reason of ['open', 'focus', 'edit', 'run'] as const) {
      expect(hints.turnedTo(KERNEL, reason)).toBe(false);
    }
    expect(hints.turnedTo(undefined, 'focus')).toBe(false);
    expect(sent).toEqual([]);
    expect(hints.isResuming(KERNEL)).toBe(false);
  });

  it('sends nothing while the wakeHint setting is off', () => {
    const { hints, sent } = harness({ [KERNEL]: { state: 'suspended' } });
    hints.enabled = false;
    expect(hints.turnedTo(KERNEL, 'run')).toBe(false);
    expect(sent).toEqual([]);
    expect(hints.isResuming(KERNEL)).toBe(false);
  });

  it('wakes a suspended kernel and a lent one, each for itself', () => {
    const { hints, sent } = harness({
      a: { state: 'suspended' },
      b: { state: 'lent' },
      c: { state: 'running' }
    });
    expect(hints.turnedTo('a', 'focus')).toBe(true);
    expect(hints.turnedTo('b', 'edit')).toBe(true);
    expect(hints.turnedTo('c', 'run')).toBe(false);
    expect(sent).toEqual(['a', 'b']);
  });
});

describe('debounce', () => {
  it('sends at most one wake per kernel per interval, however many keystrokes', () => {
    const { hints, sent, clock } = harness({
      [KERNEL]: { state: 'suspended' }
    });
    expect(hints.turnedTo(KERNEL, 'focus')).toBe(true);
    for (let key = 0; key < 50; key++) {
      clock.now += 50; // typing: a keystroke every 50 ms, 2.5 s in all
      hints.turnedTo(KERNEL, 'edit');
    }
    expect(sent).toEqual([KERNEL]);
    // The first edit after a quiet interval sends again (its slice still reads suspended).
    clock.now += WAKE_INTERVAL;
    expect(hints.turnedTo(KERNEL, 'edit')).toBe(true);
    expect(sent).toEqual([KERNEL, KERNEL]);
  });

  it('wakes a kernel suspended again at once once it was seen back, within the interval', async () => {
    const { hints, sent, known } = harness({
      [KERNEL]: { state: 'suspended' }
    });
    expect(hints.turnedTo(KERNEL, 'focus')).toBe(true);
    await settled();
    known.set(KERNEL, sliceModel({ kernel_id: KERNEL, state: 'running' }));
    hints.update(); // the poll sees it back
    known.set(KERNEL, sliceModel({ kernel_id: KERNEL, state: 'suspended' }));
    expect(hints.turnedTo(KERNEL, 'edit')).toBe(true);
    expect(sent).toEqual([KERNEL, KERNEL]);
  });

  it('counts the interval per kernel', () => {
    const { hints, sent } = harness({
      a: { state: 'suspended' },
      b: { state: 'suspended' }
    });
    hints.turnedTo('a', 'edit');
    hints.turnedTo('b', 'edit');
    hints.turnedTo('a', 'run');
    expect(sent).toEqual(['a', 'b']);
  });

  it('waits for the first poll where the slice is not known yet, for one interval', () => {
    const { hints, sent, clock, known } = harness({});
    expect(hints.turnedTo('late', 'open')).toBe(false);
    known.set('late', sliceModel({ kernel_id: 'late', state: 'suspended' }));
    clock.now += 500;
    hints.update();
    expect(sent).toEqual(['late']);
    // A sign older than the interval is dropped.
    expect(hints.turnedTo('later', 'open')).toBe(false);
    clock.now += WAKE_INTERVAL + 1;
    known.set('later', sliceModel({ kernel_id: 'later', state: 'suspended' }));
    hints.update();
    expect(sent).toEqual(['late']);
  });
});

describe('resuming', () => {
  it('holds from the wake until the slice runs and has left the line', async () => {
    const { hints, known } = harness({ [KERNEL]: { state: 'suspended' } });
    const changes: string[] = [];
    hints.changed.connect((_, kernelId) => changes.push(kernelId));
    hints.turnedTo(KERNEL, 'focus');
    expect(hints.isResuming(KERNEL)).toBe(true);
    await settled();
    hints.update(); // the next poll: still suspended, its memory on its way back
    expect(hints.isResuming(KERNEL)).toBe(true);
    // Admitted: it reads running, but stays in the line while its memory is copied back.
    const place = { position: 1, eta_seconds: null, waiting_for: '' };
    known.set(KERNEL, sliceModel({ state: 'running', queue: place }));
    hints.update();
    expect(hints.isResuming(KERNEL)).toBe(true);
    known.set(KERNEL, sliceModel({ state: 'running' }));
    hints.update();
    expect(hints.isResuming(KERNEL)).toBe(false);
    expect(changes).toEqual([KERNEL, KERNEL]);
  });

  it('ends where the server answers that the kernel runs, or refuses', async () => {
    const { hints, answerWith } = harness({
      a: { state: 'suspended' },
      b: { state: 'suspended' }
    });
    answerWith(kernelId =>
      kernelId === 'a'
        ? Promise.resolve(sliceModel({ kernel_id: 'a', state: 'running' }))
        : Promise.reject(new Error('404'))
    );
    const warn = console.warn;
    console.warn = () => undefined;
    try {
      hints.turnedTo('a', 'run');
      hints.turnedTo('b', 'run');
      await settled();
    } finally {
      console.warn = warn;
    }
    expect(hints.isResuming('a')).toBe(false);
    expect(hints.isResuming('b')).toBe(false);
  });

  it('says so in the status bar, with its place where it waits for room', () => {
    const suspended = sliceModel({
      state: 'suspended',
      host_memory_bytes: 300 * MIB
    });
    expect(resumingStatusText(suspended, trans)).toBe(
      'GPU resuming · 300MiB coming back from host memory'
    );
    // In the line only for its turn (room is there): where its memory is.
    const turn = { position: 1, eta_seconds: null, waiting_for: '' };
    expect(resumingStatusText({ ...suspended, queue: turn }, trans)).toBe(
      'GPU resuming · 300MiB coming back from host memory'
    );
    // Waiting for room: its place.
    expect(
      resumingStatusText(
        {
          ...suspended,
          queue: { ...turn, waiting_for: '1GiB more GPU memory (0B free)' }
        },
        trans
      )
    ).toBe('GPU resuming · 1st in line for GPU 1');
    // Admitted, its memory on the way back (host_memory_bytes may read 0 by then).
    expect(
      resumingStatusText(
        sliceModel({ state: 'running', host_memory_bytes: 0, queue: turn }),
        trans
      )
    ).toBe('GPU resuming · 1.2GiB coming back from host memory');
    expect(
      resumingStatusText(
        sliceModel({
          state: 'lent',
          limits: { memory_bytes: 4 * GIB, cores: 30, policy: 'hard' }
        }),
        trans
      )
    ).toBe('GPU resuming · taking its 4GiB back');
  });
});
