/** The server's REST API under /api/vgpu/ (jupyter_vgpu/handlers.py), through Jupyter's auth. */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { ISliceRequest, Policy } from './slice-values';

/** GET /api/vgpu/slices item (handlers.slice_model). */
export interface ISliceModel {
  kernel_id: string;
  kernelspec: string;
  path: string;
  device: { index: number; uuid: string };
  limits: { memory: number; cores: number; policy: Policy };
  usage: { memory: number; sm_util: number };
  owner: string;
  state: string;
}

/** GET /api/vgpu/devices item (handlers.device_model). */
export interface IDeviceModel {
  index: number;
  uuid: string;
  name: string;
  memory_total: number;
  sm_count: number;
  memory_capacity: number;
  memory_allocated: number;
  memory_free: number;
  sm_share_allocated: number;
  sm_share_capacity: number;
  slices: number;
}

/** A refusal by the server; the message is the server's own ({"message": ...}). */
export class VGPUServerError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
  }
}

async function request<T>(path: string, init: RequestInit = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'api', 'vgpu', path);
  const response = await ServerConnection.makeRequest(url, init, settings);
  const text = await response.text();
  if (!response.ok) {
    let message = text || response.statusText;
    try {
      message = JSON.parse(text).message ?? message;
    } catch {
      // Not JSON (a proxy's error page): show it as it came.
    }
    throw new VGPUServerError(response.status, message);
  }
  return JSON.parse(text) as T;
}

export function listSlices(): Promise<ISliceModel[]> {
  return request<ISliceModel[]>('slices');
}

export function listDevices(): Promise<IDeviceModel[]> {
  return request<IDeviceModel[]>('devices');
}

export function resizeSlice(
  kernelId: string,
  change: ISliceRequest
): Promise<ISliceModel> {
  return request<ISliceModel>(`slices/${encodeURIComponent(kernelId)}`, {
    method: 'PATCH',
    body: JSON.stringify(change)
  });
}

/** POST /api/vgpu/kernels: a kernel of a vGPU kernelspec started in a slice of the asked size. */
export function startKernel(
  name: string,
  slice: ISliceRequest,
  path: string
): Promise<{ kernel: { id: string; name: string }; slice: ISliceModel }> {
  return request('kernels', {
    method: 'POST',
    body: JSON.stringify({ name, path, ...slice })
  });
}
