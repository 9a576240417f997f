/**
 * Memory a device holds that no slice was promised (issue 20): why its free memory is less than
 * its capacity less its slices' caps. The sidebar shows one line per kind under the device.
 */

import type { TranslationBundle } from '@jupyterlab/translation';

import type { IDeviceModel } from './api';
import { formatSize } from './slice-values';

/** One line the sidebar shows under a device; `kind` names it for styles and tests. */
export interface IDeviceMemoryLine {
  kind: 'outside' | 'over-cap';
  text: string;
}

/**
 * "2GiB in use outside any slice", "9GiB over slice caps": only the kinds that are non-zero,
 * so a device whose memory the slices account for has none. A server older than issue 20 sends neither field: none.
 */
export function deviceMemoryLines(
  device: IDeviceModel,
  trans: TranslationBundle
): IDeviceMemoryLine[] {
  const lines: IDeviceMemoryLine[] = [];
  const outside = device.memory_outside_bytes ?? 0;
  const overCap = device.memory_over_cap_bytes ?? 0;
  if (outside > 0) {
    lines.push({
      kind: 'outside',
      text: trans.__('%1 in use outside any slice', formatSize(outside))
    });
  }
  if (overCap > 0) {
    lines.push({
      kind: 'over-cap',
      text: trans.__('%1 over slice caps', formatSize(overCap))
    });
  }
  return lines;
}
