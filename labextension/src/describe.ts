/**
 * Short texts for people from the server's models (api.ts): what the sidebar, the status bar and
 * the start dialog say about a slice or a device, in one place so they say it the same way.
 */

import type { TranslationBundle } from '@jupyterlab/translation';

import type { IDeviceModel, ISliceModel } from './api';
import {
  formatSize,
  formatSliceSummary,
  formatUsedOfCap
} from './slice-values';
import { WAKEABLE } from './wake';

/** "GPU 0 Sim GPU: 4GiB free of 8GiB · SM 50 % of 100 % promised". */
export function describeDevice(
  device: IDeviceModel,
  trans: TranslationBundle
): string {
  return trans.__(
    'GPU %1 %2: %3 free of %4 · SM %5 % of %6 % promised',
    device.index,
    device.name,
    formatSize(device.memory_free_bytes),
    formatSize(device.memory_capacity_bytes),
    device.sm_share_allocated,
    device.sm_share_capacity
  );
}

/** A slice's state in the reader's language ("scheduling", "failed", ...). */
export function stateLabel(state: string, trans: TranslationBundle): string {
  switch (state) {
    case 'queued':
      return trans.__('queued');
    case 'running':
      return trans.__('running');
    case 'lent':
      return trans.__('lent');
    case 'unused':
      return trans.__('unused');
    case 'lost':
      return trans.__('lost');
    case 'suspended':
      return trans.__('suspended');
    case 'suspending':
      return trans.__('suspending');
    case 'resuming':
      return trans.__('resuming');
    case 'scheduling':
      return trans.__('scheduling');
    case 'pulling':
      return trans.__('pulling');
    case 'starting':
      return trans.__('starting');
    case 'stopping':
      return trans.__('stopping');
    case 'failed':
      return trans.__('failed');
    case 'exited':
      return trans.__('exited');
    case 'gone':
      return trans.__('gone');
    default:
      return state; // a state of a newer server: its own word
  }
}

/**
 * What a row's message (Suspended., Resized., a refusal) is about: the slice's state and limits
 * when it was said. Once they differ the message no longer holds (polls change only usage).
 */
export function messageTopic(slice: ISliceModel | undefined): string {
  return slice ? JSON.stringify([slice.state, slice.limits]) : '';
}

/** States in which a slice has stopped for a reason its user should see (warn colour). */
const STOPPED_STATES: ReadonlySet<string> = new Set([
  'failed',
  'exited',
  'gone',
  'lost'
]);

/** Whether the slice's pod failed, exited or is gone (its kernel no longer runs there). */
export function podStopped(slice: ISliceModel): boolean {
  return slice.holder === 'pod' && STOPPED_STATES.has(slice.state);
}

/**
 * Whether the slice needs its user's attention: the server has warnings about it, or its pod
 * failed, exited or is gone. (A local slice's state alone does not colour it, as before.)
 */
export function sliceNeedsAttention(slice: ISliceModel): boolean {
  return slice.warnings.length > 0 || podStopped(slice);
}

/**
 * The server's sentence about the slice's state ('' when there is nothing more to say), whole;
 * '' for a queued start that has its place in line (queueText says it, with the place).
 */
export function sliceMessage(slice: ISliceModel): string {
  return slice.state === 'queued' && slice.queue ? '' : (slice.message ?? '');
}

/** What the server's idle policy did to the slice ('' when nothing), whole. */
export function sliceNotice(slice: ISliceModel): string {
  return slice.notice ?? '';
}

/**
 * The idle policy's notice as the sidebar and the tooltip show it: '' where it only says what
 * the slice waits for in the line, which queueText says with its place (as client.py's
 * slice_notice does for %vgpu).
 */
export function shownNotice(slice: ISliceModel): string {
  const notice = sliceNotice(slice);
  return notice && notice === slice.queue?.waiting_for ? '' : notice;
}

/**
 * Where the slice is: "GPU 1" (local; "any GPU" for a queued start that takes any), "pod",
 * "pod on node-a", "pod on node-a · GPU-8f2c1d (...)".
 */
function sliceWhere(slice: ISliceModel, trans: TranslationBundle): string {
  if (slice.holder !== 'pod') {
    return slice.device
      ? trans.__('GPU %1', slice.device.index)
      : slice.state === 'queued'
        ? trans.__('any GPU')
        : trans.__('no device');
  }
  const { node, gpu } = slice.location ?? {};
  if (node && gpu) {
    return trans.__('pod on %1 · %2', node, gpu);
  }
  return node
    ? trans.__('pod on %1', node)
    : gpu
      ? trans.__('pod · %1', gpu)
      : trans.__('pod');
}

/**
 * A slice's heading: its notebook (or kernel id), where it is and its policy; its state instead
 * of the policy for a pod that is not running, after the policy for a local slice that is not.
 * "analysis.ipynb · GPU 1 · hard", "analysis.ipynb · pod on node-a · GPU-8f2c1d (4096 MiB, 30%) · hard",
 * "analysis.ipynb · pod · scheduling".
 */
export function sliceTitle(
  slice: ISliceModel,
  trans: TranslationBundle
): string {
  const name = slice.path || slice.kernel_id.slice(0, 8);
  const where = sliceWhere(slice, trans);
  if (slice.holder === 'pod') {
    const last =
      slice.state === 'running'
        ? slice.limits.policy
        : stateLabel(slice.state, trans);
    return trans.__('%1 · %2 · %3', name, where, last);
  }
  const title = trans.__('%1 · %2 · %3', name, where, slice.limits.policy);
  return slice.state === 'running'
    ? title
    : trans.__('%1 · %2', title, stateLabel(slice.state, trans));
}

/** States in which a slice holds no room on the GPU: its start waits, or its room is lent. */
const ROOMLESS_STATES: ReadonlySet<string> = new Set([
  'queued',
  'suspended',
  'lent'
]);

/**
 * Bytes the slice's processes hold on the GPU: none while it is suspended (the server's
 * usage.memory_bytes then still counts what they allocated, which is in host memory), lent or
 * queued.
 */
export function gpuMemoryUsed(slice: ISliceModel): number {
  return ROOMLESS_STATES.has(slice.state) ? 0 : slice.usage.memory_bytes;
}

/** 1st, 2nd, 3rd, 4th, 11th, 12th, 13th, 21st, 111th. */
export function ordinal(position: number): string {
  const tens = position % 100;
  const suffix =
    tens >= 10 && tens <= 20
      ? 'th'
      : (({ 1: 'st', 2: 'nd', 3: 'rd' } as Record<number, string>)[
          position % 10
        ] ?? 'th');
  return `${position}${suffix}`;
}

/**
 * An estimate as precise as an estimate is, as libvgpu.so says it in a waiting cell's output:
 * "a few seconds", "about 40 s", "about 2 min", "about 3 h".
 */
export function formatEta(seconds: number, trans: TranslationBundle): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 10) {
    return trans.__('a few seconds');
  }
  if (s < 55) {
    return trans.__('about %1 s', Math.floor((s + 5) / 10) * 10);
  }
  if (s < 99 * 60 + 30) {
    return trans.__('about %1 min', s < 90 ? 1 : Math.floor((s + 30) / 60));
  }
  return trans.__('about %1 h', Math.floor((s + 1800) / 3600));
}

/** Whether the slice waits in the line for room (a queued start, a cell of a suspended or lent kernel). */
export function sliceWaits(slice: ISliceModel): boolean {
  return !!slice.queue;
}

/**
 * Where a waiting slice stands: "2nd in line for GPU 0 · about 40 s" ("any GPU" where it takes
 * any; no estimate where the server cannot tell); '' when it waits for nothing.
 */
export function queuePlace(
  slice: ISliceModel,
  trans: TranslationBundle
): string {
  const queue = slice.queue;
  if (!queue) {
    return '';
  }
  const place = trans.__(
    '%1 in line for %2',
    ordinal(queue.position),
    slice.device ? trans.__('GPU %1', slice.device.index) : trans.__('any GPU')
  );
  return queue.eta_seconds === null || queue.eta_seconds === undefined
    ? place
    : trans.__('%1 · %2', place, formatEta(queue.eta_seconds, trans));
}

/**
 * Where a waiting slice stands and what it waits for: "2nd in line for GPU 0 · about 40 s ·
 * waiting for 6GiB more GPU memory (4GiB free)"; '' when it waits for nothing. The same words as
 * `jupyter vgpu status` and %vgpu (jupyter_vgpu/client.py's describe_queue).
 */
export function queueText(
  slice: ISliceModel,
  trans: TranslationBundle
): string {
  const place = queuePlace(slice, trans);
  const waitingFor = (slice.queue?.waiting_for ?? '').trim();
  if (!place || !waitingFor) {
    return place;
  }
  // A resume's reason is a sentence of its own ("waiting for 1GiB on GPU 0, ...").
  return /^waiting\b/.test(waitingFor)
    ? trans.__('%1 · %2', place, waitingFor)
    : trans.__('%1 · waiting for %2', place, waitingFor);
}

/**
 * What a queued, lent, suspending or resuming slice's state means, for tooltips; '' for other
 * states.
 */
export function stateExplained(
  slice: ISliceModel,
  trans: TranslationBundle
): string {
  switch (slice.state) {
    case 'queued':
      return trans.__(
        'Queued: the kernel waits in line for room on the GPU and starts by itself when there is room; shutting it down leaves the line'
      );
    case 'lent':
      return trans.__(
        'Lent: the kernel has not used the GPU yet, so its %1 of room is lent to other kernels; its first GPU call takes it back (or waits in line for it), nothing is lost',
        formatSize(slice.limits.memory_bytes)
      );
    case 'suspending':
      return trans.__(
        'Suspending: its %1 of GPU memory is being moved to host memory; its room is lent once it is there',
        formatSize(movingBytes(slice))
      );
    case 'resuming':
      return trans.__(
        'Resuming: its room is back and %1 is being copied back from host memory; its cells wait until it is',
        formatSize(movingBytes(slice))
      );
    default:
      return '';
  }
}

/**
 * Bytes on their way: what a suspending slice's processes hold, going to host memory; what a
 * resuming (or woken) one gets back, the server's host_memory_bytes until the resume is
 * admitted, then what its processes allocated.
 */
function movingBytes(slice: ISliceModel): number {
  return slice.state === 'suspending'
    ? slice.usage.memory_bytes
    : slice.host_memory_bytes || slice.usage.memory_bytes;
}

/** "300MiB in host memory": where a suspended slice's memory is. */
function inHostMemory(slice: ISliceModel, trans: TranslationBundle): string {
  return trans.__(
    '%1 in host memory',
    formatSize(slice.host_memory_bytes ?? 0)
  );
}

/** The status-bar text: "GPU 1.2 / 4.0 GiB · SM 28 / 30 %". */
export function sliceSummary(slice: ISliceModel): string {
  const { limits, usage } = slice;
  return formatSliceSummary(
    gpuMemoryUsed(slice),
    limits.memory_bytes,
    usage.sm_util,
    limits.cores
  );
}

/**
 * The status item's text: the summary, and for a pod that is not running (yet) its state,
 * "GPU 0.0 / 4.0 GiB · SM 0 / 30 % · scheduling"; for a suspended kernel where its memory is,
 * "GPU suspended · 300MiB in host memory"; for a lent one "GPU lent · 4GiB back at its first GPU
 * call"; for a queued start where it stands and what it waits for, "GPU queued · 2nd in line for
 * GPU 0 · about 40 s · waiting for 6GiB more GPU memory (4GiB free)"; a suspended or lent kernel
 * whose cell waits for its room adds its place ("· 1st in line for GPU 0"), and so does a
 * running one whose growth waits in line ("GPU 1.0 / 2.0 GiB · SM 12 / 50 % · resize 1st in line
 * for GPU 1"). A running local slice's text is otherwise the summary alone.
 */
export function sliceStatusText(
  slice: ISliceModel,
  trans: TranslationBundle
): string {
  if (slice.state === 'queued') {
    const waiting = queueText(slice, trans);
    return waiting
      ? trans.__('GPU queued · %1', waiting)
      : trans.__('GPU queued · waiting in line for room');
  }
  // A suspended or lent kernel whose cell waits for its room: its place (what it waits for is
  // in the tooltip).
  const place = queuePlace(slice, trans);
  if (slice.state === 'suspended') {
    const where = inHostMemory(slice, trans);
    return place
      ? trans.__('GPU suspended · %1 · %2', where, place)
      : trans.__('GPU suspended · %1', where);
  }
  if (slice.state === 'suspending') {
    return trans.__(
      'GPU suspending · moving %1 to host memory',
      formatSize(movingBytes(slice))
    );
  }
  if (slice.state === 'resuming') {
    return resumingStatusText(slice, trans);
  }
  if (slice.state === 'lent') {
    return place
      ? trans.__('GPU lent · %1', place)
      : trans.__(
          'GPU lent · %1 back at its first GPU call',
          formatSize(slice.limits.memory_bytes)
        );
  }
  const summary = sliceSummary(slice);
  if (place) {
    // A running kernel waits in the line only for a resize that grows its slice.
    return trans.__('%1 · resize %2', summary, place);
  }
  return slice.holder === 'pod' && slice.state !== 'running'
    ? trans.__('%1 · %2', summary, stateLabel(slice.state, trans))
    : summary;
}

/**
 * The status item's text while the server says the slice is resuming, and from the lab's wake
 * (the user turned to the kernel) until it is back: "GPU resuming · 300MiB coming back from host
 * memory" ("GPU resuming · 1st in line for GPU 0" where it waits for room; "GPU resuming ·
 * taking its 4GiB back" for a lent one, which has nothing to copy). The server's state reads
 * suspended (or lent) until the resume is admitted, then resuming while the memory is copied
 * back.
 */
export function resumingStatusText(
  slice: ISliceModel,
  trans: TranslationBundle
): string {
  // Woken, its resume not admitted yet: it may wait for room.
  if (WAKEABLE.has(slice.state) && slice.queue?.waiting_for) {
    return trans.__('GPU resuming · %1', queuePlace(slice, trans));
  }
  const back = movingBytes(slice);
  if (slice.state === 'lent' || !back) {
    return trans.__(
      'GPU resuming · taking its %1 back',
      formatSize(slice.limits.memory_bytes)
    );
  }
  return trans.__(
    'GPU resuming · %1 coming back from host memory',
    formatSize(back)
  );
}

/**
 * The sidebar's memory bar label: "Memory 0.3 / 1.0 GiB"; for a suspended kernel, where its
 * memory is: "Memory 12GiB in host memory (suspended)"; for a lent or queued one, that it holds
 * none: "Memory 4GiB lent to others until its first GPU call", "Memory 4GiB asked for, not
 * held yet (queued)"; while its memory moves: "Memory 4GiB moving to host memory (suspending)",
 * "Memory 4GiB coming back from host memory (resuming)".
 */
export function memoryLabel(
  slice: ISliceModel,
  trans: TranslationBundle
): string {
  const cap = formatSize(slice.limits.memory_bytes);
  switch (slice.state) {
    case 'suspended':
      return trans.__('Memory %1 (suspended)', inHostMemory(slice, trans));
    case 'lent':
      return trans.__('Memory %1 lent to others until its first GPU call', cap);
    case 'queued':
      return trans.__('Memory %1 asked for, not held yet (queued)', cap);
    case 'suspending':
      return trans.__(
        'Memory %1 moving to host memory (suspending)',
        formatSize(movingBytes(slice))
      );
    case 'resuming':
      return trans.__(
        'Memory %1 coming back from host memory (resuming)',
        formatSize(movingBytes(slice))
      );
  }
  return trans.__(
    'Memory %1',
    formatUsedOfCap(slice.usage.memory_bytes, slice.limits.memory_bytes)
  );
}

/**
 * The sidebar's memory bar fill: the fraction of its cap the slice holds on the GPU; empty
 * while it is suspended (its memory is in host memory, its room lent), lent or queued.
 */
export function memoryFill(slice: ISliceModel): number {
  return gpuMemoryUsed(slice) / slice.limits.memory_bytes;
}

/** The sidebar's SM bar label: "SM 28 / 30 %". */
export function smLabel(slice: ISliceModel, trans: TranslationBundle): string {
  return trans.__(
    'SM %1 / %2 %',
    Math.round(slice.usage.sm_util),
    slice.limits.cores
  );
}

/**
 * The status item's tooltip: the slice's limits and where it is, what a suspended, lent or
 * queued state means, where it stands in the line and what it waits for (if it waits), then the
 * server's sentence about its state (if any, and not a queued start's, which the line says), then
 * its warnings, one per line, each whole, then the idle policy's notice (if any).
 */
export function sliceTooltip(
  slice: ISliceModel,
  trans: TranslationBundle
): string {
  const { device, limits } = slice;
  const lines: string[] = [];
  if (slice.holder === 'pod') {
    const { pod, namespace, node, gpu } = slice.location ?? {};
    const name =
      pod && namespace ? `${namespace}/${pod}` : pod || slice.kernel_id;
    lines.push(
      trans.__(
        'GPU slice in pod %1: memory cap %2, SM share %3 % (%4)',
        name,
        formatSize(limits.memory_bytes),
        limits.cores,
        limits.policy
      )
    );
    if (node) {
      lines.push(
        gpu
          ? trans.__('On node %1, GPU %2', node, gpu)
          : trans.__('On node %1', node)
      );
    }
  } else if (slice.state === 'queued') {
    lines.push(
      trans.__(
        'GPU slice asked for on %1: memory cap %2, SM share %3 % (%4)',
        device ? trans.__('GPU %1', device.index) : trans.__('any GPU'),
        formatSize(limits.memory_bytes),
        limits.cores,
        limits.policy
      )
    );
  } else {
    lines.push(
      trans.__(
        'GPU slice on device %1: memory cap %2, SM share %3 % (%4)',
        device ? device.index : '?',
        formatSize(limits.memory_bytes),
        limits.cores,
        limits.policy
      )
    );
  }
  const explained = stateExplained(slice, trans);
  if (explained) {
    lines.push(explained);
  }
  if (slice.state === 'suspended') {
    lines.push(
      trans.__(
        'Suspended: %1, none of it on the GPU; its next cell resumes it',
        inHostMemory(slice, trans)
      )
    );
  }
  const waiting = queueText(slice, trans);
  if (waiting) {
    lines.push(waiting);
  }
  const message = sliceMessage(slice);
  if (message) {
    lines.push(trans.__('%1: %2', stateLabel(slice.state, trans), message));
  } else if (slice.holder === 'pod' && slice.state !== 'running') {
    lines.push(stateLabel(slice.state, trans));
  }
  const notice = shownNotice(slice);
  const last = notice ? [trans.__('Idle kernel: %1', notice)] : [];
  return [...lines, ...slice.warnings, ...last].join('\n');
}
