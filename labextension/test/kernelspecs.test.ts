import type { KernelSpec } from '@jupyterlab/services';
import { describe, expect, it } from 'vitest';

import { slicedKernelspecs, startDefaults } from '../src/kernelspecs';

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

describe('startDefaults', () => {
  const server = {
    memory_bytes: 4 * 2 ** 30,
    cores: 20,
    policy: 'burst' as const
  };

  it("takes the server's defaults for what a kernelspec sets no size for, its policy included", () => {
    const [shipped] = slicedKernelspecs(
      catalogue(provisioned('python3-vgpu', 'vgpu-provisioner'))
    );
    expect(startDefaults(shipped, server)).toEqual({
      memory: '4GiB',
      cores: '20',
      policy: 'burst'
    });
  });

  it("takes the kernelspec's own slice first, field by field", () => {
    const [sized] = slicedKernelspecs(
      catalogue(
        provisioned('gpu', 'vgpu-provisioner', {
          memory: '1GiB',
          policy: 'hard'
        })
      )
    );
    expect(startDefaults(sized, server)).toEqual({
      memory: '1GiB',
      cores: '20',
      policy: 'hard'
    });
  });

  it('says nothing it does not know for an older server without defaults', () => {
    expect(startDefaults(undefined, null)).toEqual({
      memory: undefined,
      cores: undefined,
      policy: undefined
    });
  });
});
