/** Which kernelspecs start their kernels in GPU slices, read from the server's kernelspec models. */

import type { KernelSpec } from '@jupyterlab/services';

import type { ILimitsModel, SliceHolder } from './api';
import { formatSize, type ISliceForm } from './slice-values';

/** The name of the provisioner whose kernels run in slices (jupyter_vgpu/provisioning/local.py). */
export const PROVISIONER_NAME = 'vgpu-provisioner';
/** The provisioner whose kernels run as Kubernetes pods holding slices (jupyter_vgpu/provisioning/pod.py). */
export const POD_PROVISIONER_NAME = 'vgpu-pod-provisioner';

const HOLDERS: Record<string, SliceHolder> = {
  [PROVISIONER_NAME]: 'local',
  [POD_PROVISIONER_NAME]: 'pod'
};

export interface ISlicedKernelspec {
  name: string;
  displayName: string;
  /** Where its kernels' slices live: on this machine, or in a pod the cluster schedules. */
  holder: SliceHolder;
  /** The kernelspec's own slice (its provisioner config), shown as the dialog's defaults. */
  defaults: Partial<ISliceForm>;
}

/** The slice fields of a provisioner's config (a pod kernelspec's config also has image, etc.). */
function sliceDefaults(
  config: Record<string, unknown> | undefined
): Partial<ISliceForm> {
  const defaults: Partial<ISliceForm> = {};
  for (const key of ['memory', 'cores', 'policy'] as const) {
    const value = config?.[key];
    if (typeof value === 'string' || typeof value === 'number') {
      defaults[key] = `${value}`;
    }
  }
  return defaults;
}

/** Kernelspecs whose kernels start in GPU slices, with their default slice (provisioner config). */
export function slicedKernelspecs(
  specs: KernelSpec.ISpecModels | null
): ISlicedKernelspec[] {
  return Object.values(specs?.kernelspecs ?? {}).flatMap(spec => {
    const provisioner = (spec?.metadata?.kernel_provisioner ?? {}) as {
      provisioner_name?: string;
      config?: Record<string, unknown>;
    };
    const holder = HOLDERS[provisioner.provisioner_name ?? ''];
    return spec && holder
      ? [
          {
            name: spec.name,
            displayName: spec.display_name,
            holder,
            defaults: sliceDefaults(provisioner.config)
          }
        ]
      : [];
  });
}

/**
 * What a start of the kernelspec gets for each field left empty: the kernelspec's own slice (its
 * provisioner config), then the server's defaults (null: an older server that does not say).
 */
export function startDefaults(
  spec: ISlicedKernelspec | undefined,
  server: ILimitsModel | null
): Partial<ISliceForm> {
  const own = spec?.defaults ?? {};
  return {
    memory:
      own.memory ?? (server ? formatSize(server.memory_bytes) : undefined),
    cores: own.cores ?? (server ? `${server.cores}` : undefined),
    policy: own.policy ?? server?.policy
  };
}
