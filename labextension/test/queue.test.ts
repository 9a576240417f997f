import { nullTranslator } from '@jupyterlab/translation';
import { describe, expect, it } from 'vitest';

import type { IQueuePlace, ISliceModel } from '../src/api';
import {
  formatEta,
  gpuMemoryUsed,
  memoryFill,
  memoryLabel,
  ordinal,
  queuePlace,
  queueText,
  shownNotice,
  sliceMessage,
  sliceStatusText,
  sliceTitle,
  sliceTooltip,
  sliceWaits,
  stateExplained,
  stateLabel
} from '../src/describe';
import { GIB, MIB } from '../src/slice-values';
import { sliceModel } from './models';

const trans = nullTranslator.load('jupyter_vgpu');

const NO_USAGE = { memory_bytes: 0, sm_util: 0, processes: [] };

/** A kernel whose start waits in the line (the server's queued_start_model): no slice yet. */
function queued(
  queue: Partial<IQueuePlace> = {},
  overrides: Partial<ISliceModel> = {}
): ISliceModel {
  return sliceModel({
    state: 'queued',
    device: { index: 0, uuid: 'GPU-5eed' },
    limits: { memory_bytes: 10 * GIB, cores: 20, policy: 'burst' },
    usage: NO_USAGE,
    message:
      'waiting in line for room on a GPU: 6GiB more GPU memory (4GiB free)',
    queue: {
      position: 2,
      eta_seconds: 40,
      waiting_for: '6GiB more GPU memory (4GiB free)',
      ...queue
    },
    ...overrides
  });
}

/** A kernel that had not used the GPU, its room lent to others (state `lent`). */
function lent(overrides: Partial<ISliceModel> = {}): ISliceModel {
  return sliceModel({
    state: 'lent',
    device: { index: 0, uuid: 'GPU-5eed' },
    usage: NO_USAGE,
    queue: null,
    ...overrides
  });
}

/** A resume's reason as the server words it (server/suspend.py). */
const RESUME_WAITING =
  'waiting for 1GiB on GPU 0, held by running kernels (4GiB in all); this kernel resumes when it is free';

describe('a place in line', () => {
  it('is an English ordinal', () => {
    expect([1, 2, 3, 4, 10, 11, 12, 13, 21, 22, 101, 111].map(ordinal)).toEqual(
      [
        '1st',
        '2nd',
        '3rd',
        '4th',
        '10th',
        '11th',
        '12th',
        '13th',
        '21st',
        '22nd',
        '101st',
        '111th'
      ]
    );
  });

  it('has an estimate as precise as an estimate is, as the waiting cell says it', () => {
    expect(
      [0, 9.4, 10, 40, 44, 54, 55, 89, 90, 150, 5969, 5970, 7200].map(s =>
        formatEta(s, trans)
      )
    ).toEqual([
      'a few seconds',
      'a few seconds',
      'about 10 s',
      'about 40 s',
      'about 40 s',
      'about 50 s',
      'about 1 min',
      'about 1 min',
      'about 2 min',
      'about 3 min',
      'about 99 min',
      'about 2 h',
      'about 2 h'
    ]);
  });

  it('says where a queued start stands, about how long, and what it waits for', () => {
    expect(queueText(queued(), trans)).toBe(
      '2nd in line for GPU 0 · about 40 s · waiting for 6GiB more GPU memory (4GiB free)'
    );
    expect(queuePlace(queued(), trans)).toBe(
      '2nd in line for GPU 0 · about 40 s'
    );
  });

  it('says "any GPU" where the start takes any, and no estimate where the server has none', () => {
    expect(
      queueText(
        queued({ position: 1, eta_seconds: null }, { device: null }),
        trans
      )
    ).toBe(
      '1st in line for any GPU · waiting for 6GiB more GPU memory (4GiB free)'
    );
  });

  it("keeps a resume's own sentence, and leaves out an empty reason", () => {
    const suspended = sliceModel({
      state: 'suspended',
      host_memory_bytes: 300 * MIB,
      queue: { position: 1, eta_seconds: null, waiting_for: RESUME_WAITING }
    });
    expect(queueText(suspended, trans)).toBe(
      `1st in line for GPU 1 · ${RESUME_WAITING}`
    );
    expect(queueText(queued({ waiting_for: '' }), trans)).toBe(
      '2nd in line for GPU 0 · about 40 s'
    );
  });

  it('is nothing for a slice that waits for nothing (null, or absent from an older server)', () => {
    const running = sliceModel({ queue: null });
    expect(queueText(running, trans)).toBe('');
    expect(sliceWaits(running)).toBe(false);
    const older = sliceModel();
    delete older.queue;
    expect(queueText(older, trans)).toBe('');
    expect(sliceWaits(older)).toBe(false);
    expect(sliceTooltip(older, trans)).toBe(
      'GPU slice on device 1: memory cap 4GiB, SM share 30 % (hard)'
    );
  });
});

describe('a running kernel whose resize waits in line', () => {
  it('shows the place of its resize in the status bar and the whole of it in the sidebar', () => {
    const growing = sliceModel({
      state: 'running',
      queue: {
        position: 1,
        eta_seconds: null,
        waiting_for: '4GiB more GPU memory (4GiB free)'
      }
    });
    expect(sliceWaits(growing)).toBe(true);
    expect(sliceStatusText(growing, trans)).toBe(
      `${sliceStatusText(sliceModel({ state: 'running', queue: null }), trans)} · resize 1st in line for GPU 1`
    );
    expect(queueText(growing, trans)).toBe(
      '1st in line for GPU 1 · waiting for 4GiB more GPU memory (4GiB free)'
    );
  });
});

describe('a queued start', () => {
  it('shows its place and what it waits for in the status bar', () => {
    expect(sliceWaits(queued())).toBe(true);
    expect(sliceStatusText(queued(), trans)).toBe(
      'GPU queued · 2nd in line for GPU 0 · about 40 s · waiting for 6GiB more GPU memory (4GiB free)'
    );
    expect(
      sliceStatusText(queued({}, { queue: null }), trans) // between two polls of the line
    ).toBe('GPU queued · waiting in line for room');
  });

  it('is titled queued, on the GPU it waits for or on any GPU', () => {
    expect(stateLabel('queued', trans)).toBe('queued');
    expect(sliceTitle(queued(), trans)).toBe(
      'analysis.ipynb · GPU 0 · burst · queued'
    );
    expect(sliceTitle(queued({}, { device: null }), trans)).toBe(
      'analysis.ipynb · any GPU · burst · queued'
    );
  });

  it("explains itself in the tooltip, with its place instead of the server's sentence", () => {
    expect(sliceMessage(queued())).toBe('');
    expect(
      sliceTooltip(queued({}, { device: null }), trans).split('\n')
    ).toEqual([
      'GPU slice asked for on any GPU: memory cap 10GiB, SM share 20 % (burst)',
      'Queued: the kernel waits in line for room on the GPU and starts by itself when there is room; shutting it down leaves the line',
      '2nd in line for any GPU · about 40 s · waiting for 6GiB more GPU memory (4GiB free)'
    ]);
  });

  it('holds no memory on the GPU: an empty bar, labelled as asked for', () => {
    expect(gpuMemoryUsed(queued())).toBe(0);
    expect(memoryFill(queued())).toBe(0);
    expect(memoryLabel(queued(), trans)).toBe(
      'Memory 10GiB asked for, not held yet (queued)'
    );
  });
});

describe('a lent kernel', () => {
  it('says its room is lent, and what lent means in the tooltip', () => {
    expect(stateLabel('lent', trans)).toBe('lent');
    expect(sliceTitle(lent(), trans)).toBe(
      'analysis.ipynb · GPU 0 · hard · lent'
    );
    expect(sliceStatusText(lent(), trans)).toBe(
      'GPU lent · 4GiB back at its first GPU call'
    );
    const explained =
      'Lent: the kernel has not used the GPU yet, so its 4GiB of room is lent to other kernels; its first GPU call takes it back (or waits in line for it), nothing is lost';
    expect(stateExplained(lent(), trans)).toBe(explained);
    expect(sliceTooltip(lent(), trans).split('\n')).toEqual([
      'GPU slice on device 0: memory cap 4GiB, SM share 30 % (hard)',
      explained
    ]);
    expect(memoryLabel(lent(), trans)).toBe(
      'Memory 4GiB lent to others until its first GPU call'
    );
    expect(memoryFill(lent())).toBe(0);
    expect(stateExplained(sliceModel(), trans)).toBe('');
  });

  it('whose first GPU call waits for its room: its place in the status bar, the reason in the tooltip', () => {
    const waiting = lent({
      queue: { position: 1, eta_seconds: 5, waiting_for: RESUME_WAITING }
    });
    expect(sliceWaits(waiting)).toBe(true);
    expect(sliceStatusText(waiting, trans)).toBe(
      'GPU lent · 1st in line for GPU 0 · a few seconds'
    );
    expect(sliceTooltip(waiting, trans).split('\n').slice(-1)).toEqual([
      `1st in line for GPU 0 · a few seconds · ${RESUME_WAITING}`
    ]);
  });
});

describe('a suspended kernel whose cell waits for its room', () => {
  it('adds its place to where its memory is', () => {
    const waiting = sliceModel({
      state: 'suspended',
      host_memory_bytes: 300 * MIB,
      queue: { position: 3, eta_seconds: 120, waiting_for: RESUME_WAITING }
    });
    expect(sliceStatusText(waiting, trans)).toBe(
      'GPU suspended · 300MiB in host memory · 3rd in line for GPU 1 · about 2 min'
    );
    expect(sliceTooltip(waiting, trans).split('\n').slice(1)).toEqual([
      'Suspended: 300MiB in host memory, none of it on the GPU; its next cell resumes it',
      `3rd in line for GPU 1 · about 2 min · ${RESUME_WAITING}`
    ]);
  });
});

describe("the idle policy's notice of a waiting kernel", () => {
  it('is not said twice where it only says what the kernel waits for in line', () => {
    const waiting = sliceModel({
      state: 'suspended',
      host_memory_bytes: 300 * MIB,
      notice: RESUME_WAITING,
      queue: { position: 1, eta_seconds: null, waiting_for: RESUME_WAITING }
    });
    expect(shownNotice(waiting)).toBe('');
    expect(
      sliceTooltip(waiting, trans)
        .split('\n')
        .filter(line => line.includes(RESUME_WAITING))
    ).toEqual([`1st in line for GPU 1 · ${RESUME_WAITING}`]);
    const other = 'suspended after 20 min idle: 300MiB moved to host memory';
    expect(shownNotice({ ...waiting, notice: other })).toBe(other);
  });
});
