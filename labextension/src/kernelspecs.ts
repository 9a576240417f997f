/** Which kernelspecs start their kernels in GPU slices, read from the server's kernelspec models. */

import type { KernelSpec } from '@jupyterlab/services';

import type { ISliceForm } from './slice-values';

/** The name of the provisioner whose kernels run in slices (jupyter_vgpu/provisioning/local.py). */
export const PROVISIONER_NAME = 'vgpu-provisioner';

export interface ISlicedKernelspec {
  name: string;
  displayName: string;
  /** The kernelspec's own slice (its provisioner config), shown as the dialog's defaults. */
  defaults: Partial<ISliceForm>;
}

/** Kernelspecs whose kernels start in GPU slices, with their default slice (provisioner config). */
export function slicedKernelspecs(
  specs: KernelSpec.ISpecModels | null
): ISlicedKernelspec[] {
  return Object.values(specs?.kernelspecs ?? {}).flatMap(spec => {
    const provisioner = (spec?.metadata?.kernel_provisioner ?? {}) as {
      provisioner_name?: string;
      config?: Partial<ISliceForm>;
    };
    return spec && provisioner.provisioner_name === PROVISIONER_NAME
      ? [{ name: spec.name, displayName: spec.display_name, defaults: provisioner.config ?? {} }]
      : [];
  });
}
