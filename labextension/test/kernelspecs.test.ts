import { describe, expect, it } from 'vitest';

import { slicedKernelspecs } from '../src/kernelspecs';

function spec(name: string, metadata: Record<string, unknown>) {
  return { name, display_name: `${name} display`, language: 'python', argv: [], resources: {}, metadata };
}

describe('slicedKernelspecs', () => {
  it('keeps only kernelspecs of the vgpu provisioner, with their slice as defaults', () => {
    const specs = {
      default: 'python3',
      kernelspecs: {
        python3: spec('python3', {}),
        other: spec('other', { kernel_provisioner: { provisioner_name: 'local-provisioner' } }),
        gpu: spec('gpu', {
          kernel_provisioner: { provisioner_name: 'vgpu-provisioner', config: { memory: '4GiB', cores: '30' } }
        })
      }
    };
    expect(slicedKernelspecs(specs)).toEqual([
      { name: 'gpu', displayName: 'gpu display', defaults: { memory: '4GiB', cores: '30' } }
    ]);
  });

  it('has none before the specs are fetched', () => {
    expect(slicedKernelspecs(null)).toEqual([]);
  });
});
