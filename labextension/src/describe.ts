/**
 * Short texts for people from the server's models (api.ts): what the sidebar, the status bar and
 * the start dialog say about a slice or a device, in one place so they say it the same way.
 */

import type { TranslationBundle } from '@jupyterlab/translation';

import type { IDeviceModel, ISliceModel } from './api';
import { formatSize, formatSliceSummary, formatUsedOfCap } from './slice-values';

/** "GPU 0 Sim GPU: 4GiB free of 8GiB · SM 50 % of 100 % promised". */
export function describeDevice(device: IDeviceModel, trans: TranslationBundle): string {
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

/** A slice's heading: its notebook (or kernel id), device and policy, and its state unless running. */
export function sliceTitle(slice: ISliceModel, trans: TranslationBundle): string {
  const title = trans.__(
    '%1 · GPU %2 · %3',
    slice.path || slice.kernel_id.slice(0, 8),
    slice.device.index,
    slice.limits.policy
  );
  return slice.state === 'running' ? title : trans.__('%1 · %2', title, slice.state);
}

/** The status-bar text: "GPU 1.2 / 4.0 GiB · SM 28 / 30 %". */
export function sliceSummary(slice: ISliceModel): string {
  const { limits, usage } = slice;
  return formatSliceSummary(usage.memory_bytes, limits.memory_bytes, usage.sm_util, limits.cores);
}

/** The sidebar's memory bar label: "Memory 0.3 / 1.0 GiB". */
export function memoryLabel(slice: ISliceModel, trans: TranslationBundle): string {
  return trans.__('Memory %1', formatUsedOfCap(slice.usage.memory_bytes, slice.limits.memory_bytes));
}

/** The sidebar's SM bar label: "SM 28 / 30 %". */
export function smLabel(slice: ISliceModel, trans: TranslationBundle): string {
  return trans.__('SM %1 / %2 %', Math.round(slice.usage.sm_util), slice.limits.cores);
}

/** The status item's tooltip: the slice's limits, then its warnings, one per line. */
export function sliceTooltip(slice: ISliceModel, trans: TranslationBundle): string {
  const { device, limits } = slice;
  const limitsLine = trans.__(
    'GPU slice on device %1: memory cap %2, SM share %3 % (%4)',
    device.index,
    formatSize(limits.memory_bytes),
    limits.cores,
    limits.policy
  );
  return [limitsLine, ...slice.warnings].join('\n');
}
