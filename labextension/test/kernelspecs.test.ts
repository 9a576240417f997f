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

describe('slicedKernelspecs', () => {
  it('keeps only kernelspecs of the vgpu provisioner, with their slice as defaults', () => {
    const specs = {
      default: 'python3',
      kernelspecs: {
        python3: spec('python3', {}),
        other: spec('other', {
          kernel_provisioner: { provisioner_name: 'local-provisioner' }
        }),
        gpu: spec('gpu', {
          kernel_provisioner: {
            provisioner_name: 'vgpu-provisioner',
            config: { memory: '4GiB', cores: '30' }
          }
        })
      }
    };
    expect(slicedKernelspecs(specs)).toEqual([
      {
        name: 'gpu',
        displayName: 'gpu display',
        holder: 'local',
        defaults: { memory: '4GiB', cores: '30' }
      }
    ]);
  });

  it('keeps kernelspecs of the pod provisioner too, marked as pods, with only the slice fields of their config', () => {
    const specs = {
      default: 'python3',
      kernelspecs: {
        pod: spec('pod', {
          kernel_provisioner: {
            provisioner_name: 'vgpu-pod-provisioner',
            config: {
              image: 'registry.example/kernel:1',
              memory: '8GiB',
              cores: 30,
              namespace: 'jupyter'
            }
          }
        })
      }
    };
    expect(slicedKernelspecs(specs)).toEqual([
      {
        name: 'pod',
        displayName: 'pod display',
        holder: 'pod',
        defaults: { memory: '8GiB', cores: '30' }
      }
    ]);
  });

  it('has none before the specs are fetched', () => {
    expect(slicedKernelspecs(null)).toEqual([]);
  });
});
