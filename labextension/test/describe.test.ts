import { nullTranslator } from '@jupyterlab/translation';
import { describe, expect, it } from 'vitest';

import type { ISliceModel } from '../src/api';
import {
  describeDevice,
  memoryLabel,
  podStopped,
  sliceMessage,
  sliceNeedsAttention,
  sliceNotice,
  sliceStatusText,
  sliceSummary,
  sliceTitle,
  sliceTooltip,
  smLabel,
  stateLabel
} from '../src/describe';
import { MIB } from '../src/slice-values';
import { deviceModel, sliceModel } from './models';

const trans = nullTranslator.load('jupyter_vgpu');

/** A pod's slice: no device of the server's machine, its place in `location`. */
function podSlice(overrides: Partial<ISliceModel> = {}): ISliceModel {
  return sliceModel({
    holder: 'pod',
    device: null,
    location: {
      pod: 'jvgpu-3f2a9c4e-1',
      namespace: 'default',
      node: 'node-a',
      gpu: 'GPU-8f2c1d (4096 MiB, 30%)'
    },
    message: 'the kernel runs on node node-a, GPU GPU-8f2c1d (4096 MiB, 30%)',
    ...overrides
  });
}

/** Where a pod's slice is before HAMi has annotated its GPU: on `node` ('' until scheduled). */
function podLocation(node: string): ISliceModel['location'] {
  return { pod: 'jvgpu-3f2a9c4e-1', namespace: 'default', node, gpu: '' };
}

const SCHEDULING_MESSAGE =
  "waiting for the scheduler to place the kernel's pod: 0/3 nodes are available: 3 Insufficient nvidia.com/gpumem.";
const FAILED_MESSAGE =
  'the kernel\'s container cannot start on node node-a (ImagePullBackOff): Back-off pulling image "registry.example/kernel:1"';

const device = deviceModel();

describe('a device', () => {
  it('says what is free of what slices may hold, and the SM share promised', () => {
    expect(describeDevice(device, trans)).toBe(
      'GPU 0 Sim GPU: 4GiB free of 15GiB · SM 70 % of 100 % promised'
    );
  });

  it('says a full device has nothing free', () => {
    expect(
      describeDevice({ ...device, memory_free_bytes: 0 }, trans)
    ).toContain(': 0B free of 15GiB');
  });
});

describe('a slice', () => {
  it('is titled by its notebook, device and policy', () => {
    expect(sliceTitle(sliceModel(), trans)).toBe(
      'analysis.ipynb · GPU 1 · hard'
    );
  });

  it('is titled by its kernel id without a notebook, and says its state unless running', () => {
    expect(sliceTitle(sliceModel({ path: '', state: 'lost' }), trans)).toBe(
      '3f2a9c4e · GPU 1 · hard · lost'
    );
  });

  it('reads its memory and SM share from the byte and percent fields', () => {
    expect(sliceSummary(sliceModel())).toBe('GPU 1.2 / 4.0 GiB · SM 28 / 30 %');
    expect(memoryLabel(sliceModel(), trans)).toBe('Memory 1.2 / 4.0 GiB');
    expect(smLabel(sliceModel(), trans)).toBe('SM 28 / 30 %');
    const small = sliceModel({
      limits: { memory_bytes: 768 * MIB, cores: 20, policy: 'burst' }
    });
    expect(
      sliceSummary({
        ...small,
        usage: { memory_bytes: 0, sm_util: 0, processes: [] }
      })
    ).toBe('GPU 0 / 768 MiB · SM 0 / 20 %');
  });

  it("has its limits in the status item's tooltip, then each warning on a line of its own", () => {
    expect(sliceTooltip(sliceModel(), trans)).toBe(
      'GPU slice on device 1: memory cap 4GiB, SM share 30 % (hard)'
    );
    const warning =
      "the slice's limits were changed from inside the kernel (memory cap 16GiB instead of 3GiB); the server restored them";
    expect(
      sliceTooltip(sliceModel({ warnings: [warning] }), trans).split('\n')
    ).toEqual([
      'GPU slice on device 1: memory cap 4GiB, SM share 30 % (hard)',
      warning
    ]);
  });

  it("has the idle policy's notice last in the tooltip, and none when null or absent", () => {
    const notice =
      'lowered to 5% of the SMs after 20 min idle; restored when it runs again';
    const warning = 'something wrong';
    const lowered = sliceModel({ notice, warnings: [warning] });
    expect(sliceNotice(lowered)).toBe(notice);
    expect(sliceTooltip(lowered, trans).split('\n')).toEqual([
      'GPU slice on device 1: memory cap 4GiB, SM share 30 % (hard)',
      warning,
      `Idle kernel: ${notice}`
    ]);
    expect(sliceNotice(sliceModel({ notice: null }))).toBe('');
    const older = sliceModel();
    delete older.notice; // a server from before the idle policy
    expect(sliceNotice(older)).toBe('');
    expect(sliceTooltip(older, trans)).toBe(
      'GPU slice on device 1: memory cap 4GiB, SM share 30 % (hard)'
    );
    // A notice alone does not turn the item to the warn colour.
    expect(sliceNeedsAttention(sliceModel({ notice }))).toBe(false);
  });
});

describe('a local slice', () => {
  it('reads as before: the summary in the status bar, its device in the tooltip, no state sentence', () => {
    expect(sliceTitle(sliceModel(), trans)).toBe(
      'analysis.ipynb · GPU 1 · hard'
    );
    expect(sliceTitle(sliceModel({ state: 'unused' }), trans)).toBe(
      'analysis.ipynb · GPU 1 · hard · unused'
    );
    expect(sliceStatusText(sliceModel(), trans)).toBe(
      'GPU 1.2 / 4.0 GiB · SM 28 / 30 %'
    );
    expect(sliceStatusText(sliceModel({ state: 'lost' }), trans)).toBe(
      'GPU 1.2 / 4.0 GiB · SM 28 / 30 %'
    );
    expect(sliceTooltip(sliceModel(), trans)).toBe(
      'GPU slice on device 1: memory cap 4GiB, SM share 30 % (hard)'
    );
    expect(sliceMessage(sliceModel())).toBe('');
    expect(sliceNeedsAttention(sliceModel())).toBe(false);
    expect(sliceNeedsAttention(sliceModel({ state: 'lost' }))).toBe(false);
    expect(sliceNeedsAttention(sliceModel({ warnings: ['something'] }))).toBe(
      true
    );
  });

  it('does not break on a null device', () => {
    expect(sliceTitle(sliceModel({ device: null }), trans)).toBe(
      'analysis.ipynb · no device · hard'
    );
    expect(sliceTooltip(sliceModel({ device: null }), trans)).toBe(
      'GPU slice on device ?: memory cap 4GiB, SM share 30 % (hard)'
    );
  });
});

describe("a pod's slice", () => {
  it('running: titled by its node and GPU and policy, with no device to read', () => {
    const running = podSlice();
    expect(sliceTitle(running, trans)).toBe(
      'analysis.ipynb · pod on node-a · GPU-8f2c1d (4096 MiB, 30%) · hard'
    );
    expect(sliceStatusText(running, trans)).toBe(
      'GPU 1.2 / 4.0 GiB · SM 28 / 30 %'
    );
    expect(sliceTooltip(running, trans).split('\n')).toEqual([
      'GPU slice in pod default/jvgpu-3f2a9c4e-1: memory cap 4GiB, SM share 30 % (hard)',
      'On node node-a, GPU GPU-8f2c1d (4096 MiB, 30%)',
      'running: the kernel runs on node node-a, GPU GPU-8f2c1d (4096 MiB, 30%)'
    ]);
    expect(sliceNeedsAttention(running)).toBe(false);
    expect(podStopped(running)).toBe(false);
    // Usage labels read limits and usage only.
    expect(memoryLabel(running, trans)).toBe('Memory 1.2 / 4.0 GiB');
    expect(smLabel(running, trans)).toBe('SM 28 / 30 %');
  });

  it('running on a node whose GPU HAMi has not annotated: the node alone', () => {
    const running = podSlice({ location: podLocation('node-a') });
    expect(sliceTitle(running, trans)).toBe(
      'analysis.ipynb · pod on node-a · hard'
    );
    expect(sliceTooltip(running, trans).split('\n')[1]).toBe('On node node-a');
  });

  it.each([
    {
      case: 'scheduling: titled "pod · scheduling", with the scheduler\'s reason whole',
      state: 'scheduling',
      message: SCHEDULING_MESSAGE,
      node: '',
      titled: 'analysis.ipynb · pod · scheduling',
      nodeLine: [],
      stopped: false
    },
    {
      case: "failed: titled with its node and state, the container's reason whole, in the warn colour",
      state: 'failed',
      message: FAILED_MESSAGE,
      node: 'node-a',
      titled: 'analysis.ipynb · pod on node-a · failed',
      nodeLine: ['On node node-a'],
      stopped: true
    }
  ])('$case', ({ state, message, node, titled, nodeLine, stopped }) => {
    const pod = podSlice({
      state,
      message,
      location: podLocation(node),
      usage: { memory_bytes: 0, sm_util: 0, processes: [] }
    });
    expect(sliceTitle(pod, trans)).toBe(titled);
    expect(sliceMessage(pod)).toBe(message);
    expect(sliceStatusText(pod, trans)).toBe(
      `GPU 0.0 / 4.0 GiB · SM 0 / 30 % · ${state}`
    );
    expect(sliceTooltip(pod, trans).split('\n')).toEqual([
      'GPU slice in pod default/jvgpu-3f2a9c4e-1: memory cap 4GiB, SM share 30 % (hard)',
      ...nodeLine,
      `${state}: ${message}`
    ]);
    expect(sliceNeedsAttention(pod)).toBe(stopped);
    expect(podStopped(pod)).toBe(stopped);
  });

  it('before its pod exists: no location at all, still a title and a tooltip', () => {
    const creating = podSlice({
      state: 'scheduling',
      message: "the kernel's pod is being created",
      location: {}
    });
    expect(sliceTitle(creating, trans)).toBe(
      'analysis.ipynb · pod · scheduling'
    );
    expect(sliceTooltip(creating, trans).split('\n')[0]).toBe(
      'GPU slice in pod 3f2a9c4e-5b7d-4e1f-9a0b-1c2d3e4f5a6b: memory cap 4GiB, SM share 30 % (hard)'
    );
  });

  it('says a state without a sentence in its tooltip, and its warnings after it', () => {
    const gone = podSlice({
      state: 'gone',
      message: '',
      warnings: ['a warning']
    });
    expect(sliceTooltip(gone, trans).split('\n').slice(-2)).toEqual([
      'gone',
      'a warning'
    ]);
    expect(podStopped(gone)).toBe(true);
  });
});

describe('slice states', () => {
  it('each has its word, through the translation bundle; an unknown one is shown as it came', () => {
    const states = [
      'running',
      'unused',
      'lost',
      'scheduling',
      'pulling',
      'starting',
      'stopping',
      'failed',
      'exited',
      'gone'
    ];
    expect(states.map(state => stateLabel(state, trans))).toEqual(states);
    expect(stateLabel('hibernating', trans)).toBe('hibernating');
  });
});
