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
    case 'running':
      return trans.__('running');
    case 'unused':
      return trans.__('unused');
    case 'lost':
      return trans.__('lost');
    case 'suspended':
      return trans.__('suspended');
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

/** The server's sentence about the slice's state ('' when there is nothing more to say), whole. */
export function sliceMessage(slice: ISliceModel): string {
  return slice.message ?? '';
}

/** What the server's idle policy did to the slice ('' when nothing), whole. */
export function sliceNotice(slice: ISliceModel): string {
  return slice.notice ?? '';
}

/** Where the slice is: "GPU 1" (local), "pod", "pod on node-a", "pod on node-a · GPU-8f2c1d (...)". */
function sliceWhere(slice: ISliceModel, trans: TranslationBundle): string {
  if (slice.holder !== 'pod') {
    return slice.device
      ? trans.__('GPU %1', slice.device.index)
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

/**
 * Bytes the slice's processes hold on the GPU: none while it is suspended (the server's
 * usage.memory_bytes then still counts what they allocated, which is in host memory).
 */
export function gpuMemoryUsed(slice: ISliceModel): number {
  return slice.state === 'suspended' ? 0 : slice.usage.memory_bytes;
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
 * "GPU suspended · 300MiB in host memory". A running local slice's text is the summary alone.
 */
export function sliceStatusText(
  slice: ISliceModel,
  trans: TranslationBundle
): string {
  if (slice.state === 'suspended') {
    return trans.__('GPU suspended · %1', inHostMemory(slice, trans));
  }
  const summary = sliceSummary(slice);
  return slice.holder === 'pod' && slice.state !== 'running'
    ? trans.__('%1 · %2', summary, stateLabel(slice.state, trans))
    : summary;
}

/**
 * The sidebar's memory bar label: "Memory 0.3 / 1.0 GiB"; for a suspended kernel, where its
 * memory is: "Memory 12GiB in host memory (suspended)".
 */
export function memoryLabel(
  slice: ISliceModel,
  trans: TranslationBundle
): string {
  if (slice.state === 'suspended') {
    return trans.__('Memory %1 (suspended)', inHostMemory(slice, trans));
  }
  return trans.__(
    'Memory %1',
    formatUsedOfCap(slice.usage.memory_bytes, slice.limits.memory_bytes)
  );
}

/**
 * The sidebar's memory bar fill: the fraction of its cap the slice holds on the GPU; empty
 * while it is suspended (its memory is in host memory, its room lent).
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
 * The status item's tooltip: the slice's limits and where it is, then the server's sentence
 * about its state (if any), then its warnings, one per line, each whole, then the idle policy's
 * notice (if any).
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
  if (slice.state === 'suspended') {
    lines.push(
      trans.__(
        'Suspended: %1, none of it on the GPU; its next cell resumes it',
        inHostMemory(slice, trans)
      )
    );
  }
  const message = sliceMessage(slice);
  if (message) {
    lines.push(trans.__('%1: %2', stateLabel(slice.state, trans), message));
  } else if (slice.holder === 'pod' && slice.state !== 'running') {
    lines.push(stateLabel(slice.state, trans));
  }
  const notice = sliceNotice(slice);
  const last = notice ? [trans.__('Idle kernel: %1', notice)] : [];
  return [...lines, ...slice.warnings, ...last].join('\n');
}
