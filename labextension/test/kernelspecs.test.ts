import type { KernelSpec } from '@jupyterlab/services';
import { describe, expect, it } from 'vitest';

import { slicedKernelspecs } from '../src/kernelspecs';

function spec(
  name: string,
  metadata: KernelSpec.ISpecModel['metadata']
): KernelSpec.ISpecModel {
  return {
    name,
    display_name: `${name} display`,
    language: 'python',
    argv: [],
    resources: {},
    metadata
  };
}

/** A kernelspec started by `provisioner`, with its `config`. */
function provisioned(
  name: string,
  provisioner: string,
  config?: Record<string, unknown>
): KernelSpec.ISpecModel {
  return spec(name, {
    kernel_provisioner: { provisioner_name: provisioner, config }
  });
}

/** GET /api/kernelspecs's answer listing `specs`. */
function catalogue(...specs: KernelSpec.ISpecModel[]) {
  return {
    default: 'python3',
    kernelspecs: Object.fromEntries(specs.map(one => [one.name, one]))
  };
}

/** What slicedKernelspecs makes of the kernelspec `name` (its display name as spec() gives it). */
function sliced(
  name: string,
  holder: string,
  defaults: Record<string, string>
) {
  return { name, displayName: `${name} display`, holder, defaults };
}

describe('slicedKernelspecs', () => {
  it('keeps only kernelspecs of the vgpu provisioner, with their slice as defaults', () => {
    const specs = catalogue(
      spec('python3', {}),
      provisioned('other', 'local-provisioner'),
      provisioned('gpu', 'vgpu-provisioner', { memory: '4GiB', cores: '30' })
    );
    expect(slicedKernelspecs(specs)).toEqual([
      sliced('gpu', 'local', { memory: '4GiB', cores: '30' })
    ]);
  });

  it('keeps kernelspecs of the pod provisioner too, marked as pods, with only the slice fields of their config', () => {
    const specs = catalogue(
      provisioned('pod', 'vgpu-pod-provisioner', {
        image: 'registry.example/kernel:1',
        memory: '8GiB',
        cores: 30,
        namespace: 'jupyter'
      })
    );
    expect(slicedKernelspecs(specs)).toEqual([
      sliced('pod', 'pod', { memory: '8GiB', cores: '30' })
    ]);
  });

  it('has none before the specs are fetched', () => {
    expect(slicedKernelspecs(null)).toEqual([]);
  });
});
